"""Run every notebook and render it, outputs and all, as a page of the documentation site in `_docs/`.

Each exported definition gets a `show_doc` entry (signature, one line, parameters), as nbdev's own site gives it; the
code of exported and hidden cells runs but is not shown. A notebook that raises fails the build, so this is also the
notebooks' test (what `nbdev_test` runs, with the outputs kept). Quarto, which `nbdev_docs` needs, cannot be installed
here; nbconvert renders the pages instead. Usage: `python tools/docs.py [notebook ...]` (default: all of `nbs/`)."""
import os, re, sys, html, time, argparse, traceback
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NBS, OUT = ROOT/'nbs', ROOT/'_docs'
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

def _page_cells(nb):
    "The cells a reader sees, as plain dicts: prose, visible examples with their outputs, and show_doc entries"
    cells = []
    for c in nb.cells:
        d = getattr(c, 'directives_', {}) or {}
        if getattr(c, 'has_sd', False):  # a show_doc entry: its markdown output, without quarto's attributes
            md = ''.join(_joined(o).get('data', {}).get('text/markdown', '') for o in c.get('outputs', []))
            cells.append(_md(_attrs.sub('', md).replace('---\n', '')))
        elif c.cell_type == 'markdown': cells.append(_md(re.sub(r'\]\(([\w.-]+)\.ipynb', r'](\1.html', c.source)))
        elif not (_hidden & d.keys()):
            cells.append(dict(cell_type='code', metadata={}, execution_count=None, outputs=[_joined(o) for o in c.get('outputs', [])],
                              source='\n'.join(l for l in c.source.splitlines() if not l.startswith('#|'))))
    return cells

def title_of(nb_path):
    "A notebook's title and one-line summary: its first '# ' heading and the '> ' line under it"
    from execnb.nbio import read_nb
    md = next((c.source for c in read_nb(nb_path).cells if c.cell_type == 'markdown' and c.source.startswith('# ')), '')
    lines = md.splitlines()
    return (lines[0][2:].strip() if lines else nb_path.stem), next((l[1:].strip() for l in lines if l.startswith('>')), '')

def _in_definition_order(cells):
    "Put each run of show_doc cells that `add_show_docs` inserted (last definition first) in definition order"
    i = 0
    while i < len(cells):
        j = i
        while j < len(cells) and getattr(cells[j], 'has_sd', False): j += 1
        cells[i:j] = cells[i:j][::-1]
        i = max(j, i+1)

def run_notebook(nb_path):
    "Run `nb_path` with show_doc entries added; its page cells, or the traceback of the cell that raised"
    os.environ['IN_TEST'] = '1'
    from execnb.nbio import read_nb
    from execnb.shell import CaptureShell
    from nbdev.process import NBProcessor
    from nbdev.processors import add_show_docs
    nb = read_nb(nb_path)
    NBProcessor(nb=nb, procs=[add_show_docs]).process()
    _in_definition_order(nb.cells)
    for c in nb.cells:
        if getattr(c, 'has_sd', False): c.source = 'from nbdev.showdoc import show_doc\n' + c.source
    shell,start = CaptureShell(nb_path),time.monotonic()
    os.chdir(nb_path.parent)
    try: shell.run_all(nb, exc_stop=True, preproc=_no_eval)
    except Exception: return nb_path, None, shell.prettytb(fname=nb_path) or traceback.format_exc(), time.monotonic()-start
    return nb_path, _page_cells(nb), None, time.monotonic()-start

_css = """body{margin:0} nav.site{position:fixed;top:0;left:0;bottom:0;width:16rem;overflow:auto;padding:1rem;
background:#f6f7f9;border-right:1px solid #ddd;font:14px/1.4 sans-serif} nav.site a{display:block;margin:.35rem 0;
color:#224;text-decoration:none} nav.site a.here{font-weight:bold} nav.site small{display:block;color:#667}
main.page{margin-left:18rem;max-width:62rem;padding:1rem 2rem}"""

def _nav(pages, here):
    "The sidebar: every page in the order of the notebooks, with its summary"
    items = ''.join(f'<a href="{p}.html"{" class=here" if p == here else ""}>{html.escape(t)}<small>{html.escape(s)}</small></a>'
                    for p,(t,s) in pages.items())
    return f'<nav class="site"><a href="index.html"><b>ddp_safe_fastai</b></a>{items}</nav>'

def render(nb_path, cells, pages):
    "Write the page of `nb_path` to `_docs/`, with the site's sidebar"
    import nbformat
    from nbconvert import HTMLExporter
    nb = nbformat.v4.new_notebook(cells=[nbformat.from_dict({**c, 'id': f'c{i}'}) for i,c in enumerate(cells)])
    exp = HTMLExporter(template_name='lab', embed_images=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body,_ = exp.from_notebook_node(nb, resources={'metadata': {'path': str(NBS), 'name': pages.get(nb_path.stem, (nb_path.stem,))[0]}})
    body = re.sub(r'(<body[^>]*>)', lambda m: m.group(1) + _nav(pages, nb_path.stem) + '<main class="page">', body, count=1)
    body = body.replace('</body>', '</main></body>').replace('</head>', f'<style>{_css}</style></head>')
    (OUT/f"{nb_path.stem}.html").write_text(body)

def main(argv=None):
    "Run and render the notebooks asked for (default: all); exit naming those that raised"
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('notebooks', nargs='*', help='notebooks to build (default: every notebook in nbs/)')
    p.add_argument('--workers', type=int, default=2)
    a = p.parse_args(argv)
    every = sorted(NBS.glob('[0-9]*.ipynb')) + [NBS/'index.ipynb']
    todo = [Path(n).resolve() for n in a.notebooks] or every
    pages = {n.stem: title_of(n) for n in every}
    OUT.mkdir(exist_ok=True)
    failed = []
    # a fresh process per notebook, as a reader's kernel: no state, patch or process group carries over
    with ProcessPoolExecutor(a.workers, mp_context=mp.get_context('spawn'), max_tasks_per_child=1) as ex:
        for nb_path,cells,err,secs in ex.map(run_notebook, todo):
            if err: failed.append(nb_path.name); print(f"FAILED {nb_path.name}:\n{err}", file=sys.stderr)
            else: render(nb_path, cells, pages); print(f"{nb_path.name}: {secs:.0f} s", flush=True)
    if (OUT/'index.html').exists(): (OUT/'.nojekyll').touch()
    if failed: sys.exit(f"notebooks that raised: {failed}")
    print(f"{len(todo)} pages in {OUT.relative_to(ROOT)}/")

if __name__ == '__main__': main()
