"""How many exported cells of the notebooks hold more than one definition (a `def` or a `class` at the cell's top
level), and more than one public one (a name without a leading `_`), as fastai's rhythm has one a cell: prose, the
definition, its example. Usage: `python tools/definitions.py [--list] [notebook ...]` (default: all of `nbs/`);
`--list` names each cell of several definitions with them."""
import re, ast, sys, json
from pathlib import Path

NBS = Path(__file__).resolve().parent.parent/'nbs'
_export = re.compile(r'^#\|\s*export', re.M)

def definitions(source):
    "The names of the functions and classes defined at the top level of a cell's `source`"
    code = '\n'.join(l for l in source.splitlines() if not l.lstrip().startswith(('%', '!')))
    return [n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]

def exported_cells(nb):
    "(cell id, its definitions) of each exported code cell of the notebook `nb` that defines something"
    cells = json.loads(Path(nb).read_text())['cells']
    for c in cells:
        src = ''.join(c['source'])
        if c['cell_type'] == 'code' and _export.search(src) and (d := definitions(src)): yield c.get('id'), d

if __name__ == '__main__':
    args = [a for a in sys.argv[1:] if a != '--list']
    total = many = public = 0
    for nb in (map(Path, args) if args else sorted(NBS.glob('*.ipynb'))):
        for cid,d in exported_cells(nb):
            total += 1
            public += sum(not n.startswith('_') for n in d) > 1
            if len(d) > 1:
                many += 1
                if '--list' in sys.argv: print(f"{nb.name} #{cid}: {len(d)}: {', '.join(d)}")
    print(f"{many} of the {total} exported cells that define something hold more than one definition; {public} more than one public one")
