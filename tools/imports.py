"""The package's import graph held against its layers: each module's imports of the package's own modules, at the top
level and inside functions. It fails on a cycle, on an import of the package inside a function (a lazy import is no
way around a layer), on a module that imports one of a higher layer than its own, and on a name imported from a
module that only re-exports it (the names of earlier releases stay importable where they were, but the package's own
modules import each name from the module that defines it, so that the graph shows what depends on what; `all`, which
gathers everything for users, is the exception). Nothing is imported: the source is read. Usage: `python tools/imports.py [--graph] [--package DIR]` (default: `ddp_safe_fastai/`); `--graph`
prints every module's imports."""
import ast, sys, argparse
from pathlib import Path

# bottom first: a module imports modules of its own layer or of those below, never of one above
LAYERS = [
    ('ranks: who this process is, and all-gathers with a timeout', ['errors', 'ranks', 'replica_groups', 'store_gather', 'rendezvous', 'core']),
    ('files: one file written whole, by one process', ['locations', 'files', 'checksums', 'written', 'fastai_imports']),
    ('transport: files to and from object storage', ['transport']),
    ('the save and load protocol', ['matching', 'background', 'directories', 'reads', 'persist', 'export_reader', 'unpickle_policy', 'safe_unpickle']),
    ('the training state and its format', ['resume', 'manifest', 'train_state', 'raw_state']),
    ('checkpoint storage', ['storage', 'checkpoint_dir', 'object_store', 'tiers', 'memory_room', 'rng_handoff', 'memory_storage', 'memory_tier', 'durable_tier']),
    ('the fastai patches', ['distributed', 'learner', 'loops', 'text', 'writers', 'patches']),
    ('the callbacks', ['signals', 'callback', 'checkpoint', 'fault_tolerance']),
    ('the tools', ['launch', 'ft_launch', 'testing', 'check', 'changes', 'all']),
]
_skip = {'__init__', '_modidx'}
_gathers = {'all'}  # its one job is to re-export every module's names

def _targets(node, pkg, here):
    "The package's modules that the import `node` (in module `here`) names"
    if isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level == 0 and not base.startswith(pkg): return []
        mod = base[len(pkg):].lstrip('.') if node.level == 0 else base
        if mod: return [mod.split('.')[0]]
        return [a.name for a in node.names]  # `from . import x`
    return [a.name[len(pkg)+1:].split('.')[0] for a in node.names if a.name.startswith(pkg + '.')]

def module_imports(path, pkg):
    "(top-level imports, [(function, line, module) of each import inside a function]) of the module at `path`"
    tree,top,inner = ast.parse(path.read_text(encoding='utf8')),set(),[]
    def walk(node, fn):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for m in _targets(child, pkg, path.stem):
                    if fn: inner.append((fn, child.lineno, m))
                    else: top.add(m)
            walk(child, child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn)
    walk(tree, None)
    return top, inner

def defined(tree):
    "The names a module's source defines at its top level: functions, classes and assignments"
    out = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            out |= {e.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) for e in ast.walk(t) if isinstance(e, ast.Name)}
    return out

def exported(tree):
    "The names in a module's `__all__`, as nbdev writes it (a list of strings)"
    return next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == '__all__' for t in n.targets)), [])

def through_reexports(package, pkg):
    "Each import of a name from a module of the package that does not define it (`module.py:line: name from X, defined in Y`)"
    trees = {f.stem: ast.parse(f.read_text(encoding='utf8')) for f in Path(package).glob('*.py') if f.stem not in _skip}
    defs = {m: defined(t) for m,t in trees.items()}
    out = []
    for m,tree in sorted(trees.items()):
        if m in _gathers: continue
        for n in tree.body:
            if not (isinstance(n, ast.ImportFrom) and n.level == 1 and n.module and n.module.split('.')[0] in trees): continue
            src = n.module.split('.')[0]
            names = exported(trees[src]) if [a.name for a in n.names] == ['*'] else [a.name for a in n.names]
            out += [f"{m}.py:{n.lineno}: {name} from {src}, which re-exports it" for name in names if name not in defs[src]]
    return out

def cycles(graph):
    "The strongly connected groups of more than one module (Tarjan's algorithm)"
    index,low,stack,on,out,n = {},{},[],set(),[],[0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop(); on.discard(w); group.append(w)
                if w == v: break
            if len(group) > 1: out.append(sorted(group))
    for v in sorted(graph):
        if v not in index: visit(v)
    return out

def check(package):
    "The problems of the package's import graph, and the graph"
    package = Path(package)
    pkg = package.name
    layer = {m: i for i,(_,ms) in enumerate(LAYERS) for m in ms}
    graph,problems = {},[]
    mods = {f.stem for f in package.glob('*.py')} - _skip
    for f in sorted(package.glob('*.py')):
        if f.stem in _skip: continue
        top,inner = module_imports(f, pkg)
        top &= mods  # not the package's own names (`__version__`)
        graph[f.stem] = (top | {m for _,_,m in inner if m in mods}) - {f.stem}  # a cycle through a function's import is one
        problems += [f"{f.stem}.py:{line}: `{m}` imported inside `{fn}`" for fn,line,m in inner]
        if f.stem not in layer: problems.append(f"{f.stem}.py: in no layer (tools/imports.py, LAYERS)"); continue
        problems += [f"{f.stem} ({LAYERS[layer[f.stem]][0].split(':')[0]}) imports {m} ({LAYERS[layer[m]][0].split(':')[0]}), a layer above"
                     for m in sorted(top) if m in layer and layer[m] > layer[f.stem]]
    problems += [f"cycle: {' -> '.join(c)}" for c in cycles(graph)]
    problems += through_reexports(package, pkg)
    return problems, graph

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--graph', action='store_true'); p.add_argument('--package', default=Path(__file__).resolve().parent.parent/'ddp_safe_fastai')
    a = p.parse_args()
    problems,graph = check(a.package)
    if a.graph:
        for name,ms in LAYERS:
            print(f"== {name}")
            for m in ms:
                if m in graph: print(f"   {m}: {', '.join(sorted(graph[m])) or '-'}")
    edges = sum(map(len, graph.values()))  # an edge of each module to each it imports
    print(f"{len(graph)} modules, {edges} imports between them, {len(LAYERS)} layers: " + ('no cycle, no import inside a function, none from a layer above, none through a re-export' if not problems else f"{len(problems)} problem(s)"))
    for pr in problems: print(f"  {pr}")
    sys.exit(1 if problems else 0)
