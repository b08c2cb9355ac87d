"""Which public definitions of the notebooks have no example after them, as fastai's rhythm has each followed by one.
A definition is a function or class at the top level of an exported cell (`#| export`, `#| exports`) whose name has no
leading `_`: one of its module's `__all__` (the names of a cell `_all_ = [...]` are re-exports, defined elsewhere); and
a method added to a class with `@patch` (nbdev leaves it out of `__all__`), named `Class.name`. Its example is a later
visible code cell (none of `#| hide`, `export`, `exporti`, `exports`, `default_exp`, `include: false`, `eval: false`)
that uses the name (`name`, `module.name`), or, for a patched method, calls `.name(` or puts its class to work (fastai
calls the hooks it patches itself: a fit with the callback named); a cell that does not parse: the word, `.name`, `.name(`. Nothing is imported or run. Usage: `python tools/examples.py [--list-all] [notebook ...]`
(default: all of `nbs/`): each definition without an example, `nbs/NN_page.ipynb: name (cell id)`, and exit status 1;
`--list-all` prints every definition with the cell of its first example."""
import re, ast, sys, json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_export = re.compile(r'^\s*#\|\s*exports?\b', re.M)
_hidden = re.compile(r'^\s*#\|\s*((hide|exporti?|exports|default_exp)\b|(include|eval):\s*false\b)', re.M)

def parse(source):
    "The module `ast` of a cell's `source`, its `%`, `!` and `#|` lines dropped; None when it does not parse"
    try: return ast.parse('\n'.join(l for l in source.splitlines() if not l.lstrip().startswith(('%', '!', '#|'))))
    except SyntaxError: return None

def _patched(node):
    "`Class.name` of the function `node` that a `@patch` decorator (nbdev: `patch...`) adds to a class, else None"
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if getattr(f, 'id', '').startswith('patch'):
            nm = next((k.value.value for k in getattr(d, 'keywords', ()) if k.arg == 'nm'), node.name)
            a = node.args.posonlyargs + node.args.args
            cls = d.args[0] if f.id == 'patch_to' and d.args else a[0].annotation if a and a[0].annotation else None
            return f"{ast.unparse(cls) if cls else '?'}.{nm}"
    return None

def definitions(tree):
    "The public names that the top level of a parsed exported cell defines: `name`, or `Class.name` of a patched method"
    defs = (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    names = [(None if isinstance(n, ast.ClassDef) else _patched(n)) or n.name for n in defs]
    return [n for n in names if not n.rpartition('.')[2].startswith('_')]

def uses(source):
    "What a visible cell uses: its identifiers `name`, attributes `.name` (`module.name`) and method calls `.name(`"
    if (tree := parse(source)) is None:
        return {*re.findall(r'\w+', source), *re.findall(r'\.\w+', source), *re.findall(r'(\.\w+)\s*\(', source)}
    calls = {'.' + n.func.attr + '(' for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    return {n.id if isinstance(n, ast.Name) else '.' + n.attr for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))} | calls

def _found(name, used):
    "Whether the definition `name` is among the things a cell `used`: the name or `.name`; for a patched `Class.name`, `.name(` or the class at work (fastai calls its hooks itself)"
    cls,_,meth = name.rpartition('.')
    return ('.' + meth + '(' in used or cls in used) if cls else name in used or '.' + name in used

def examples(nb):
    "[(name, defining cell id, first example's cell id or None)] of each public definition of the notebook `nb`"
    defs = {}
    for c in json.loads(Path(nb).read_text())['cells']:
        if c['cell_type'] != 'code': continue
        src = ''.join(c['source'])
        if _export.search(src):
            for n in definitions(parse(src)): defs.setdefault(n, [c.get('id'), None])
        elif not _hidden.search(src):
            used = uses(src)
            for n,d in defs.items():
                if d[1] is None and _found(n, used): d[1] = c.get('id')
    return [(n, *d) for n,d in defs.items()]

def _name(nb):
    "The notebook's path from the repository's root (as given when outside it)"
    p = Path(nb).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(nb)

if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if a != '--list-all']
    total = pages = missing = 0
    for nb in (map(Path, args) if args else sorted((ROOT/'nbs').glob('*.ipynb'))):
        if not (found := examples(nb)): continue
        pages += 1; total += len(found)
        for n,cid,ex in found:
            missing += ex is None
            if '--list-all' in sys.argv: print(f"{_name(nb)}: {n} (cell {cid}): {f'example in cell {ex}' if ex else 'NO EXAMPLE'}")
            elif ex is None: print(f"{_name(nb)}: {n} (cell {cid})")
    print(f"{total} public definitions on {pages} pages; {missing} without an example after them")
    sys.exit(1 if missing else 0)
