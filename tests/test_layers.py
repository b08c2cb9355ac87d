"""The package's layers (`tools/imports.py`): no cycle, no import inside a function, none of a higher layer; a module below
the fastai patches changes nothing in fastai when imported alone, and `patches`, a callback or `all` apply every change;
the names each module exported in 0.1 are still exported there"""
import sys, json, textwrap, importlib, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT/'tools'))
import imports

LOWER = [m for name,ms in imports.LAYERS[:imports.LAYERS.index(next(l for l in imports.LAYERS if l[0] == 'the fastai patches'))] for m in ms
         if (ROOT/'ddp_safe_fastai'/f'{m}.py').exists()]

def test_the_package_keeps_its_layers():
    "`tools/imports.py` on the package: every module in a layer, no cycle, no import inside a function, none from above"
    out = subprocess.run([sys.executable, ROOT/'tools'/'imports.py'], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout

def _package(tmp_path, modules):
    "A package of `modules` ({name: source}) under `tmp_path`"
    pkg = tmp_path/'ddp_safe_fastai'
    pkg.mkdir(parents=True)
    for name,src in {'__init__': '', **modules}.items(): (pkg/f'{name}.py').write_text(textwrap.dedent(src))
    return pkg

def test_a_cycle_an_inner_import_and_an_upward_one_are_found(tmp_path):
    "The check fails on each thing it guards against: a cycle made by an import inside a function, and a lower module importing a higher one"
    pkg = _package(tmp_path, dict(errors='', persist='def f():\n    from .object_store import x\n', object_store='from .persist import *\n',
                                  files='from .learner import y\n', learner=''))
    problems,_ = imports.check(pkg)
    assert 'persist.py:2: `object_store` imported inside `f`' in problems
    assert 'cycle: object_store -> persist' in problems
    assert any(p.startswith('files (files) imports learner (the fastai patches)') for p in problems), problems
    assert imports.check(_package(tmp_path/'ok', dict(errors='', files='from .errors import *\n', learner='from .files import *\n')))[0] == []

def test_an_import_through_a_reexport_is_found(tmp_path):
    "A name imported from a module that only re-exports it (`core` giving `errors`' names) is a problem; from its own module it is not"
    errors = "__all__ = ['CheckpointError']\nclass CheckpointError(Exception): pass\n"
    core = "from .errors import CheckpointError\n__all__ = ['exchange', 'CheckpointError']\ndef exchange(): pass\n"
    pkg = _package(tmp_path, dict(errors=errors, core=core, files='from .core import exchange, CheckpointError\n', written='from .core import *\n'))
    problems,_ = imports.check(pkg)
    assert problems == ['files.py:1: CheckpointError from core, which re-exports it', 'written.py:1: CheckpointError from core, which re-exports it'], problems
    ok = _package(tmp_path/'ok', dict(errors=errors, core=core, files='from .core import exchange\nfrom .errors import CheckpointError\n'))
    assert imports.check(ok)[0] == []

CHANGED = '''
import sys, json, importlib
owners = json.loads(sys.argv[1])
def attrs():
    out = {}
    for path,names in owners.items():
        parts = path.split('.'); n = next((i for i,p in enumerate(parts) if p[0].isupper()), len(parts))
        try: o = importlib.import_module('.'.join(parts[:n]))
        except ImportError: continue  # fastai.vision without torchvision
        for a in parts[n:]: o = getattr(o, a)
        out[path] = {k: id(v) for k,v in vars(o).items()}
    return out
attrs()  # fastai's own modules imported first: some add attributes to others (`fastai.callback.schedule` to `Learner`)
seen = {}
for module in sys.argv[2:]:  # bottom first: each imports only those before it, which changed nothing
    before = attrs()
    importlib.import_module(module)
    after = attrs()
    changed = {p: sorted(k for k in set(before[p]) | set(after[p]) if before[p].get(k) != after[p].get(k)) for p in before}
    seen[module] = {p: c for p,c in changed.items() if c}
print(json.dumps([seen, sorted(before)]))
'''

def _owners():
    from ddp_safe_fastai.changes import fastai_changes
    owners = {}
    for c in fastai_changes: owners.setdefault(c.owner, []).append(c.name)
    return owners

def _changed(*modules):
    "What importing each of `modules` in turn changes of the fastai classes and modules a listed change is made to, in a fresh process; and those that import here"
    out = subprocess.run([sys.executable, '-c', CHANGED, json.dumps(_owners()), *modules], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])

def test_importing_a_lower_module_changes_nothing_in_fastai():
    "Importing the modules below the patches, each alone, leaves every fastai class and module that a patch changes as it was"
    changed,_ = _changed(*[f'ddp_safe_fastai.{m}' for m in LOWER])
    assert {m: c for m,c in changed.items() if c} == {}

@pytest.mark.parametrize('module', ['patches', 'callback', 'checkpoint'])
def test_an_entry_point_applies_every_change(module):
    "Importing `patches` or a callback alone applies every listed change (`all` imports `patches`)"
    (changed,importable),owners = _changed(f'ddp_safe_fastai.{module}'),_owners()
    changed = changed[f'ddp_safe_fastai.{module}']
    missing = {o: sorted(set(ns) - set(changed.get(o, []))) for o,ns in owners.items() if o in importable}
    assert not any(missing.values()), missing

PUBLIC = json.loads((Path(__file__).parent/'data'/'public_names_0.1.json').read_text())

@pytest.mark.parametrize('module', sorted(PUBLIC))
def test_names_of_earlier_releases_are_exported_where_they_were(module):
    "Every name a module listed in `__all__` in release 0.1 is exported there still (some live lower now)"
    mod = importlib.import_module(f'ddp_safe_fastai.{module}')
    assert [n for n in PUBLIC[module] if n not in mod.__all__ or not hasattr(mod, n)] == []
