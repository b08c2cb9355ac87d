"""Open the built site (`_docs/`) in headless Chromium, as a reader would, and check it: every local link, anchor, image,
stylesheet and script of every page resolves; the search box's search finds `SafeSaveModelCallback` and lands on its
entry; in a frame 375 px wide, the main text is wider than the sidebar. A page of checks (`_check.html`, removed afterwards) loads
each page in a frame and writes what it found into its DOM, which `chromium --dump-dom` reads back.
Usage: `python tools/browser_check.py [--shots DIR]` (DIR: screenshots of two pages at 1400 and 375 px)."""
import os, re, sys, html, json, argparse, functools, threading, subprocess
from http.server import ThreadingHTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

SITE = Path(__file__).resolve().parent.parent/'_docs'
CHROMIUM = [os.environ.get('CHROMIUM', 'chromium'), '--headless=new', '--no-sandbox', '--disable-gpu', '--hide-scrollbars']
NAME = 'SafeSaveModelCallback'

CHECK = """<!doctype html><meta charset="utf-8"><script src="search.js"></script><script src="site.js"></script>
<body style="margin:0"><pre id="result"></pre><iframe id="f" style="position:fixed;top:0;left:0;width:375px;height:100%;border:0"></iframe>
<script>
const f = document.getElementById('f'), problems = [], ids = {}, refs = [];
const load = u => new Promise(ok => { f.onload = () => ok(f.contentDocument); f.src = u; });
const local = u => new URL(u, location.href).origin == location.origin;
(async () => {
  const pages = SEARCH.filter(r => r[2] == 'page').map(r => r[1]);
  for (const p of pages) {
    const d = await load(p);
    if (!d.querySelector('main.page')) problems.push(`${p}: no page`);
    ids[p] = new Set([...d.querySelectorAll('[id]')].map(e => e.id));
    for (const i of d.images) if (!i.complete || !i.naturalWidth) problems.push(`${p}: broken image ${i.src.slice(0, 80)}`);
    for (const e of d.querySelectorAll('a[href], link[href], script[src], img[src]')) {
      const u = e.getAttribute('href') || e.getAttribute('src');
      if (local(u) && !u.startsWith('data:')) refs.push([p, u]);
    }
  }
  const files = {};
  for (const [p, u] of refs) {
    const [file, hash] = u.split('#'), path = file || p;
    if (!(path in files)) files[path] = (await fetch(path, {method: 'HEAD'})).ok;
    if (!files[path]) problems.push(`${p}: ${u} not found`);
    else if (hash && ids[path] && !ids[path].has(decodeURIComponent(hash))) problems.push(`${p}: ${u}: no such anchor`);
  }
  const hit = search('NAME')[0][2], d = await load(hit), entry = d.getElementById(hit.split('#')[1] || '');
  const w = s => d.querySelector(s)?.getBoundingClientRect().width ?? 0;
  document.getElementById('result').textContent = JSON.stringify({pages: pages.length, refs: refs.length,
    files: Object.keys(files).length, problems, search: hit, entry: entry ? entry.textContent : null,
    width: d.defaultView.innerWidth, main: w('main.page'), sidebar: w('nav.site')});
})();
</script>""".replace('NAME', NAME)

class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args): "No log line per request"

def chromium(*args, width=375):
    "Run headless Chromium at `width` px; its stdout"
    return subprocess.run(CHROMIUM + [f'--window-size={width},900', *args], capture_output=True, text=True, timeout=300).stdout

def main():
    "Serve `_docs/`, run the page of checks, take screenshots if asked; exit 1 naming what failed"
    a = argparse.ArgumentParser(description=__doc__.split('\n')[0]); a.add_argument('--shots')
    a = a.parse_args()
    srv = ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(Quiet, directory=str(SITE)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{srv.server_address[1]}/'
    (SITE/'_check.html').write_text(CHECK)
    try: dom = chromium('--virtual-time-budget=120000', '--dump-dom', url + '_check.html')
    finally: (SITE/'_check.html').unlink()
    m = re.search(r'<pre id="result">(.+?)</pre>', dom, flags=re.S)
    if not m: sys.exit('browser check: the page of checks wrote no result')
    r = json.loads(html.unescape(m.group(1)))
    print(f"{r['pages']} pages, {r['refs']} local links, images, stylesheets and scripts ({r['files']} files): "
          f"{len(r['problems'])} problems", *r['problems'], sep='\n  ')
    print(f"search {NAME!r}: lands on {r['search']} ({(r['entry'] or 'no entry')[:60]!r})")
    print(f"{r['width']} px wide: main text {r['main']:.0f} px, sidebar {r['sidebar']:.0f} px")
    if a.shots:
        Path(a.shots).mkdir(parents=True, exist_ok=True)
        for page in ('index', '47_callback'):
            for w in (1400, 375): chromium(f'--screenshot={Path(a.shots).resolve()}/{page}-{w}.png', url + f'{page}.html', width=w)
    srv.shutdown()
    failed = r['problems'] + [f'search for {NAME} does not land on its entry'] * (not (r['entry'] or '').startswith(NAME)) \
           + ['at 375 px the sidebar is as wide as the text'] * (r['main'] <= r['sidebar'])
    if failed: sys.exit('browser check FAILED: ' + '; '.join(failed))

if __name__ == '__main__': main()
