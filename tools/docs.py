"""Run every notebook and render it, outputs and all, as a page of the documentation site in `_docs/`.

Each exported definition gets a `show_doc` entry (signature, one line, parameters), as nbdev's own site gives it; the
code of exported and hidden cells runs but is not shown. A notebook that raises fails the build, so this is also the
notebooks' test (what `nbdev_test` runs, with the outputs kept). Quarto, which `nbdev_docs` needs, cannot be installed
here; nbconvert renders the pages instead. Usage: `python tools/docs.py [notebook ...]` (default: all of `nbs/`)."""
import os, re, sys, ast, html, json, time, argparse, sysconfig, traceback, subprocess, configparser
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, OUT = ROOT/'nbs', ROOT/'_docs'
CFG = configparser.ConfigParser(); CFG.read(ROOT/'settings.ini'); CFG = CFG['DEFAULT']
DOC_URL = CFG['doc_host'] + CFG['doc_baseurl']
_attrs = re.compile(r'\{(target|style|\.)[^}]*\}')  # quarto's attribute syntax in show_doc's markdown
_hidden = {'hide', 'export', 'exports', 'exporti', 'default_exp'}

def _no_eval(cell):
    "Cells a test run skips, as `nbdev_test` does: not code, `nbdev_export()` itself, or `#| eval: false`"
    if cell.cell_type != 'code' or 'nbdev_export(' in cell.source: return True
    return (getattr(cell, 'directives_', {}) or {}).get('eval:', [''])[0].lower() == 'false'

def _md(source): return dict(cell_type='markdown', metadata={}, source=source)

def _joined(o):
    "An output with its multi-line strings (lists in a notebook file) joined, as nbconvert reads them"
    j = lambda v: ''.join(v) if isinstance(v, list) else v
    o = {**o, **({'text': j(o['text'])} if 'text' in o else {})}
    if 'data' in o: o['data'] = {k: j(v) for k,v in o['data'].items()}
    return o

def _prose(md):
    "Markdown as the site shows it: links to notebooks and to the site relative, images from `nbs/`, tables out of lists"
    md = re.sub(r'\]\(([\w.-]+)\.ipynb', r'](\1.html', md.replace(DOC_URL + '/', '').replace('](nbs/', ']('))
    return re.sub(r'^ {1,3}(\|.*\|) *$', r'\1', md, flags=re.M)

def _entry(md, commit):
    "A show_doc entry's markdown: its heading with nbdev's anchor and the source link, at `commit`, beside it"
    src = re.search(r'\[source\]\((\S+?)\)', md)
    md = _attrs.sub('', md[:src.start()] + md[src.end():] if src else md).replace('---\n', '')
    def head(m):
        n, name = len(m.group(1)), m.group(2).replace('\\', '')
        link = f' <a class="src" href="{src.group(1).replace("/blob/" + CFG["branch"] + "/", f"/blob/{commit}/")}">source</a>' if src else ''
        return f'<h{n} id="{name.lower()}">{html.escape(name)}<a class="anchor-link" href="#{name.lower()}">¶</a>{link}</h{n}>'
    return re.sub(r'^(#{2,4}) (\S+)[ \t]*$', head, md.lstrip(), count=1, flags=re.M)

def _build_paths():
    "This machine's paths, as they appear in outputs, and what the site shows instead"
    import ddp_safe_fastai
    pkg = Path(ddp_safe_fastai.__file__).resolve().parent.parent
    return [(sys.executable, 'python'), (sysconfig.get_paths()['purelib'], 'site-packages'), (f'{pkg}/', ''), (f'{ROOT}/', '')]

def _text(s, paths, stream=False):
    "An output's text without this machine's paths; a stream as a terminal shows it (a line ended by `\\r` is overwritten)"
    if stream: s = '\n'.join(l.rsplit('\r', 1)[-1] for l in s.split('\n'))
    for a,b in paths: s = s.replace(a, b)
    return s

def _output(o, paths):
    "One output, joined and cleaned"
    o = _joined(o)
    if 'text' in o: o['text'] = _text(o['text'], paths, o.get('output_type') == 'stream')
    if 'data' in o: o['data'] = {k: _text(v, paths) if isinstance(v, str) else v for k,v in o['data'].items()}
    return o

def _page_cells(nb, commit='main'):
    "The cells a reader sees, as plain dicts: prose, visible examples with their outputs, and show_doc entries"
    cells, paths = [], _build_paths()
    for c in nb.cells:
        d = getattr(c, 'directives_', {}) or {}
        if getattr(c, 'has_sd', False):  # a show_doc entry: its markdown output
            cells.append(_md(_entry(''.join(_joined(o).get('data', {}).get('text/markdown', '') for o in c.get('outputs', [])), commit)))
        elif c.cell_type == 'markdown': cells.append(_md(_prose(c.source)))
        elif not (_hidden & d.keys()):
            cells.append(dict(cell_type='code', metadata={}, execution_count=None, outputs=[_output(o, paths) for o in c.get('outputs', [])],
                              source='\n'.join(l for l in c.source.splitlines() if not l.startswith('#|'))))
    return cells

def sidebar():
    "The site's sections, in order: (section title, or None for the pages before the first section, [notebook paths]), from `nbs/sidebar.yml`"
    import yaml
    out = []
    for item in yaml.safe_load((NBS/'sidebar.yml').read_text())['website']['sidebar']['contents']:
        if isinstance(item, str): out.append((None, [NBS/item]))
        else: out.append((item['section'], [NBS/n for n in item['contents']]))
    listed = [n for _,ns in out for n in ns]
    unlisted = sorted(set(NBS.glob('*.ipynb')) - set(listed))
    if unlisted: sys.exit(f"nbs/sidebar.yml lists no section for {', '.join(n.name for n in unlisted)}: add each where a reader looks for it")
    return out

def title_of(nb_path):
    "A notebook's title and one-line summary: its first '# ' heading and the '> ' line under it"
    from execnb.nbio import read_nb
    md = next((c.source for c in read_nb(nb_path).cells if c.cell_type == 'markdown' and c.source.startswith('# ')), '')
    lines = md.splitlines()
    return (lines[0][2:].strip() if lines else nb_path.stem), next((l[1:].strip() for l in lines if l.startswith('>')), '')

def run_notebook(nb_path):
    "Run `nb_path` with show_doc entries added; its page cells, or the traceback of the cell that raised"
    os.environ['IN_TEST'] = '1'
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from nbdev.process import NBProcessor
    from nbdev.processors import add_show_docs
    nb = read_nb(nb_path)
    NBProcessor(nb=nb, procs=[add_show_docs]).process()
    for c in nb.cells:
        if getattr(c, 'has_sd', False): c.source = 'from nbdev.showdoc import show_doc\n' + c.source
    shell,start = CaptureShell(nb_path),time.monotonic()
    os.chdir(nb_path.parent)
    shell.run('import fastai.callback.progress')  # fastai's progress table, with its column names, as `fastai.*.all` gives
    try: shell.run_all(nb, exc_stop=True, preproc=_no_eval)
    except Exception: return nb_path, None, shell.prettytb(fname=nb_path) or traceback.format_exc(), time.monotonic()-start
    return nb_path, _page_cells(nb, git_commit()), None, time.monotonic()-start

def git_commit():
    "The commit the site is built from, for source links that do not go stale"
    r = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or CFG['branch']

def entries(nb_path):
    "The names `nb_path` has show_doc entries for, as `run_notebook` adds them (without running it)"
    from execnb.nbio import read_nb
    from nbdev.process import NBProcessor
    from nbdev.processors import add_show_docs
    nb = read_nb(nb_path)
    NBProcessor(nb=nb, procs=[add_show_docs]).process()
    return [n for c in nb.cells if getattr(c, 'has_sd', False) for n in re.findall(r'show_doc\(([\w.]+)', c.source)]

def link_targets(every):
    "Each documented name (and each module) of `_modidx.py`, short and in full, with its page and anchor"
    src = (ROOT/CFG['lib_name']/'_modidx.py').read_text()
    syms = ast.literal_eval(src[src.index('d = ')+4:])['syms']
    page = {re.sub(r'^\d+_', '', n.stem): n.stem for n in every}  # nbdev's page names drop the number
    shown = {f'{page.get(n.stem, n.stem)}.html#{s.lower()}' for n in every for s in entries(n)}
    targets = {}
    for mod, names in syms.items():
        short = mod.split('.', 1)[1]
        if short in page: targets[short] = targets[mod] = f'{page[short]}.html'
        for full,(url,_) in names.items():
            p_, a = url.split('#')
            href = f'{page.get(p_[:-5], p_[:-5])}.html#{a}'
            if href in shown: targets[full[len(mod)+1:]] = targets[full] = href
    return targets

def _linked(body, targets):
    "Backticked names linked to their entries (not in code blocks, not already in a link)"
    def link(m):
        name = m.group(2).removesuffix('()')
        if m.group(1) or name not in targets: return m.group(0)
        return f'<a href="{targets[name]}"><code>{m.group(2)}</code></a>'
    return re.sub(r'(<a [^>]*>)?(?<!<pre>)<code>([\w.]+(?:\(\))?)</code>', link, body)

_css = """body{margin:0} [id]{scroll-margin-top:3.5rem} header.top{position:fixed;top:0;left:0;right:0;height:3rem;z-index:20;display:flex;
align-items:center;gap:.75rem;padding:0 1rem;background:#1f2d3d;font:15px sans-serif} header.top a{color:#fff;text-decoration:none}
header.top .brand{font-weight:bold;white-space:nowrap} header.top .repo{margin-left:auto} header.top button{display:none;
font-size:1.3rem;background:none;border:0;color:#fff;cursor:pointer} .search{position:relative;flex:0 1 22rem;min-width:6rem}
.search input{width:100%;box-sizing:border-box;padding:.35rem .6rem;border-radius:4px;border:0;font-size:15px}
.search ol{position:absolute;top:2.2rem;left:0;width:min(30rem,90vw);margin:0;padding:0;list-style:none;background:#fff;
box-shadow:0 2px 10px #0004;max-height:70vh;overflow:auto} .search ol:empty{display:none} .search li a{display:block;
padding:.4rem .7rem;color:#123} .search li a.on,.search li a:hover{background:#e8eef7} .search small{color:#678;margin-left:.5rem}
nav.site{position:fixed;top:3rem;left:0;bottom:0;width:15rem;overflow:auto;padding:.5rem 1rem;background:#f6f7f9;
border-right:1px solid #ddd;font:14px/1.4 sans-serif;z-index:10} nav.site a{display:block;margin:.5rem 0;color:#224;
text-decoration:none} nav.site h4{margin:1.2rem 0 .2rem;font-size:13px;text-transform:uppercase;letter-spacing:.04em;color:#556} nav.site a.here{font-weight:bold} nav.site small{display:block;color:#667;font-weight:normal;overflow-wrap:anywhere}
main.page{margin-left:17rem;max-width:60rem;padding:4rem 2rem 1rem;min-width:0} nav.toc{font:14px/1.4 sans-serif;border-left:3px solid
#cdd;padding:.2rem .8rem;margin:.5rem 0 1rem} nav.toc a{display:block;color:#246;text-decoration:none} nav.toc a.h3{padding-left:1rem}
a.src{font:normal 13px sans-serif;margin-left:.8rem;vertical-align:middle} a code{color:#0550ae} .jp-RenderedHTMLCommon table{display:block;overflow-x:auto}
.jp-OutputArea-output pre{white-space:pre-wrap;word-break:break-word}
@media (min-width:1500px){nav.toc{position:fixed;top:4rem;left:calc(17rem + 64rem);width:13rem;max-height:80vh;overflow:auto}}
@media (max-width:900px){header.top button{display:block} nav.site{display:none;width:min(18rem,85vw);box-shadow:2px 0 10px #0003}
body.menu nav.site{display:block} main.page{margin-left:0;padding:3.5rem .8rem .5rem} header.top .repo{display:none}}"""

_js = """function search(q){q=q.trim().toLowerCase();if(!q)return[];const r=[];
for(const [t,u,k] of SEARCH){const l=t.toLowerCase(),i=l.indexOf(q);if(i<0)continue;
r.push([(l==q?0:i==0?1:2)+(k=='name'?0:.5)+l.length/1e3,t,u,k])}return r.sort((a,b)=>a[0]-b[0]).slice(0,12)}
document.addEventListener('DOMContentLoaded',()=>{const q=document.getElementById('q'),ol=document.getElementById('hits');
if(!q)return;document.getElementById('menu').onclick=()=>document.body.classList.toggle('menu');
q.oninput=()=>{ol.innerHTML=search(q.value).map(([,t,u,k],i)=>`<li><a href="${u}"${i?'':' class=on'}>${t.replace(/</g,'&lt;')}<small>${k}</small></a></li>`).join('')};
q.onkeydown=e=>{const a=ol.querySelector('a');if(e.key=='Enter'&&a)location.href=a.href;if(e.key=='Escape')ol.innerHTML=''};
document.addEventListener('keydown',e=>{if(e.key=='/'&&document.activeElement!=q){e.preventDefault();q.focus()}})});"""

def _inline(s): return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(s))

def _chrome(pages, here, sections):
    "The top bar (project, search, repository) and the sidebar: the sections of `nbs/sidebar.yml`, each page with its title and summary"
    link = lambda p: f'<a href="{p}.html"{" class=here" if p == here else ""}>{_inline(pages[p][0])}<small>{_inline(pages[p][1])}</small></a>'
    items = ''.join((f'<h4>{html.escape(sec)}</h4>' if sec else '') + ''.join(link(n.stem) for n in ns) for sec,ns in sections)
    return (f'<header class="top"><button id="menu" aria-label="pages">&#9776;</button><a class="brand" href="index.html">'
            f'{CFG["lib_name"]}</a><div class="search"><input id="q" type="search" placeholder="Search (/)" aria-label="search">'
            f'<ol id="hits"></ol></div><a class="repo" href="{CFG["git_url"]}">GitHub</a></header><nav class="site">{items}</nav>')

def _heads(body): return re.findall(r'<h([23]) id="([^"]+)">(.*?)</h\1>', body)
def _plain(h): return html.unescape(re.sub(r'<a class="(anchor-link|src)".*?</a>|<[^>]+>', '', h)).strip()

def _toc(body):
    "'On this page': the page's headings, on a page with more than five"
    hs = _heads(body)
    if len(hs) <= 5: return ''
    return '<nav class="toc"><b>On this page</b>' + ''.join(f'<a class="h{n}" href="#{i}">{html.escape(_plain(h))}</a>' for n,i,h in hs) + '</nav>'

def render(nb_path, cells, pages, targets, sections):
    "Write the page of `nb_path` to `_docs/`, with the site's top bar, sidebar, shared stylesheet and script"
    import nbformat
    from nbconvert import HTMLExporter
    nb = nbformat.v4.new_notebook(cells=[nbformat.from_dict({**c, 'id': f'c{i}'}) for i,c in enumerate(cells)])
    exp = HTMLExporter(template_name='lab', embed_images=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body,_ = exp.from_notebook_node(nb, resources={'metadata': {'path': str(NBS), 'name': pages.get(nb_path.stem, (nb_path.stem,))[0]}})
    styles = re.findall(r'<style[^>]*>(.*?)</style>', body, flags=re.S)
    (OUT/'site.css').write_text('\n'.join(styles) + '\n' + _css)  # the same for every page: nbconvert's theme and ours
    body = re.sub(r'<style[^>]*>.*?</style>|<script src="[^"]*(require|mathjax)[^"]*">\s*</script>|<!-- MathJax configuration -->'
                  r'.*?<!-- End of mathjax configuration -->', '', body, flags=re.S)
    body = _linked(body, targets)
    main = body[body.index('<body'):]
    body = re.sub(r'(<body[^>]*>)', lambda m: m.group(1) + _chrome(pages, nb_path.stem, sections) + '<main class="page">' + _toc(main), body, count=1)
    body = body.replace('</body>', '</main></body>').replace('</head>', '<link rel="stylesheet" href="site.css">'
                        '<script src="search.js"></script><script src="site.js"></script></head>')
    (OUT/f"{nb_path.stem}.html").write_text(body)

def write_search(pages, targets):
    "search.js: every page's title, its headings and every documented name, with where each lands; site.js: the search box"
    items = [[t, f'{p}.html', 'page'] for p,(t,_) in pages.items()]
    for p in pages:
        f = OUT/f'{p}.html'
        if f.exists(): items += [[_plain(h), f'{p}.html#{i}', pages[p][0]] for _,i,h in _heads(f.read_text())]
    items += [[n, u, 'name'] for n,u in targets.items() if '#' in u and not n.startswith(CFG['lib_name'])]
    (OUT/'search.js').write_text('const SEARCH=' + json.dumps(items, separators=(',', ':')) + ';\n')
    (OUT/'site.js').write_text(_js + '\n')

def main(argv=None):
    "Run and render the notebooks asked for (default: all); exit naming those that raised"
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('notebooks', nargs='*', help='notebooks to build (default: every notebook in nbs/)')
    p.add_argument('--workers', type=int, default=2)
    a = p.parse_args(argv)
    sections = sidebar()
    every = [n for _,ns in sections for n in ns]
    todo = [Path(n).resolve() for n in a.notebooks] or every
    pages, targets = {n.stem: title_of(n) for n in every}, link_targets(every)
    OUT.mkdir(exist_ok=True)
    failed = []
    # a fresh process per notebook, as a reader's kernel: no state, patch or process group carries over. Each is forked
    # from a server that has imported what every notebook imports before its first cell (the kernel, torch and fastai,
    # none of this library): seconds a notebook saved
    ctx = mp.get_context('forkserver')
    ctx.set_forkserver_preload(['execnb.shell', 'nbdev.process', 'nbdev.processors', 'fastai.callback.progress'])
    with ProcessPoolExecutor(a.workers, mp_context=ctx, max_tasks_per_child=1) as ex:
        for nb_path,cells,err,secs in ex.map(run_notebook, todo):
            if err: failed.append(nb_path.name); print(f"FAILED {nb_path.name}:\n{err}", file=sys.stderr)
            else: render(nb_path, cells, pages, targets, sections); print(f"{nb_path.name}: {secs:.0f} s", flush=True)
    write_search(pages, targets)
    if (OUT/'index.html').exists(): (OUT/'.nojekyll').touch()
    if failed: sys.exit(f"notebooks that raised: {failed}")
    print(f"{len(todo)} pages in {OUT.relative_to(ROOT)}/")

if __name__ == '__main__': main()
