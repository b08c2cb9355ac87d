"""`changes` (nbs/95_changes.ipynb): the tables of what the library changes in fastai and in its process, fastai's originals
pinned, and a census of fastai's writers kept true; importing the library changes no fastai default and shadows no name"""
import os, re, sys, json, hashlib, inspect, importlib, subprocess
from pathlib import Path
import pytest
import fastai
importlib.import_module('ddp_safe_fastai.all')  # every change in force
from ddp_safe_fastai import changes, rendezvous
from ddp_safe_fastai.changes import fastai_changes, fastai_writers, importable, fastai_version_of, current, unlisted_changes, unlisted_writers
from ddp_safe_fastai.changes import process_changes, unlisted_process_changes

PINS = json.loads((Path(__file__).parent/'fastai_originals.json').read_text())

def source_hash(f): return hashlib.sha256(inspect.getsource(f).encode()).hexdigest()[:16]

@pytest.mark.parametrize('change', [c for c in fastai_changes if c.does.split(':')[0] != 'added'], ids=lambda c: f"{c.owner}.{c.name}")
def test_fastai_original_pinned(change):
    "fastai's own version of each replaced attribute is the one the library was written against"
    if not importable(change): pytest.skip(f"{change.owner} does not import here")
    assert current(change).__module__.startswith('ddp_safe_fastai')
    pinned = PINS[f"{change.owner}.{change.name}"]
    assert source_hash(fastai_version_of(change)) in pinned, (
        f"fastai {fastai.__version__} changed {change.owner}.{change.name}, which ddp_safe_fastai.{change.module} replaces: "
        "read fastai's new version, carry what changed into the library's, then add its hash to tests/fastai_originals.json")

def test_no_unlisted_change():
    "Every fastai attribute the library replaces or adds, with fastai's applications imported, is listed in `fastai_changes`"
    for m in ('fastai.text.all', 'fastai.tabular.all', 'fastai.collab'): importlib.import_module(m)  # what users import
    assert unlisted_changes() == []

def test_no_unlisted_process_change():
    "Every import hook, `sys.modules` change, environment variable, signal, exit hook and attribute of fastai's objects the library makes is listed"
    for m in ('fastai.text.all', 'fastai.tabular.all', 'fastai.collab'): importlib.import_module(m)
    assert unlisted_process_changes() == []

@pytest.mark.parametrize('name,seen', [
    ('_AfterImport', ('sys.meta_path', '_AfterImport', '')),
    ('fastai.callback.progress', ('sys.modules', '', 'fastai_imports:fastai_defaults_kept')),
    ('bn_per_rank', ('runtime attribute', 'bn_per_rank', 'distributed:DistributedTrainer.__init__')),
    ('resume_point', ('runtime attribute removed', 'resume_point', 'resume:resuming')),
    ('get_idxs', ('runtime attribute', 'get_idxs', 'resume:resume_pass')),
    ('SIGTERM', None), # the row of SIGUSR1 names the same functions
    ('store_gather.KeyCleanup.stop', ('atexit.register', '', 'store_gather:<module>'))])
def test_unlisted_process_change_reported(monkeypatch, name, seen):
    "A row taken out of `process_changes` is reported"
    monkeypatch.setattr(changes, 'process_changes', [p for p in process_changes if p.name != name])
    assert seen in unlisted_process_changes() if seen else unlisted_process_changes() == []

def test_fastai_originals_kept_are_of_listed_changes(monkeypatch):
    "A `_fastai_<name>` on a fastai class whose `<name>` `fastai_changes` does not list is reported"
    from fastai.learner import Learner
    monkeypatch.setattr(Learner, '_fastai_fit', Learner.fit, raising=False)
    assert unlisted_process_changes() == [('fastai.learner.Learner', '_fastai_fit', '')]

class _Topology:
    def local_rank(self, r): return r
    def local_size(self, r): return 3

def _environ_written(monkeypatch, f):
    "The variables of `os.environ` that `f()` adds, where none of the launchers' is set"
    for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT',
              'TORCHELASTIC_USE_AGENT_STORE'): monkeypatch.setenv(k, ''); monkeypatch.delenv(k) # given back after the test
    before = set(os.environ)
    f()
    return set(os.environ) - before

def _listed_env(fn): return {p.name for p in process_changes if p.kind == 'environment' and f"rendezvous:{fn}" in p.by.split()}

def test_share_launch_env_writes_listed(monkeypatch):
    "`share_launch_env` writes the variables its rows name: a group of 3 ranks, faked"
    class _Group:  # the run group of a rank in a group of 3
        def group(self): return object()
    for k,v in dict(run_group=_Group(), topology=_Topology, rank_distrib=lambda: 1, num_distrib=lambda: 3).items():
        monkeypatch.setattr(rendezvous, k, v)
    assert _environ_written(monkeypatch, rendezvous.share_launch_env) == _listed_env('share_launch_env') != set()

def test_slurm_defaults_listed(monkeypatch):
    "A SLURM step without torchrun: `_rendezvous` writes the variables its rows name"
    for k,v in dict(SLURM_STEP_NUM_TASKS='2', SLURM_NTASKS='2', SLURM_PROCID='0', SLURM_JOB_ID='4242', SLURM_JOB_NODELIST='node[1-2]').items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv('SLURM_STEP_NODELIST', raising=False)
    assert rendezvous.slurm_step()
    assert _environ_written(monkeypatch, lambda: rendezvous._rendezvous('test')) == _listed_env('_rendezvous') != set()
    assert os.environ['MASTER_ADDR'] == 'node1' and os.environ['MASTER_PORT'] == '19242'

def test_census_lists_every_writer():
    "Every function of the installed fastai that writes a file is in the census"
    missing = unlisted_writers()
    assert not missing, f"fastai {fastai.__version__} writes files in {missing}: add each to `fastai_writers` (nbs/95_changes.ipynb)"

def test_census_tests_exist():
    "Every test the census names is a test of this suite"
    here = Path(__file__).parent
    for w in fastai_writers:
        if not w.test: continue
        file,_,name = w.test.partition('::')
        assert (here/file).exists() and (not name or re.search(rf"^def {name}\(", (here/file).read_text(), re.M)), w

def test_the_census_is_on_its_page():
    "The changes page shows the census of fastai's writers as `census_table()` makes it when the site is built (every row a writer of `fastai_writers`), and the README, a front door of at most 10 KB, links there"
    from ddp_safe_fastai.changes import census_table
    root = Path(__file__).parent.parent
    cells = json.loads((root/'nbs'/'95_changes.ipynb').read_text())['cells']
    assert any(''.join(c['source']).strip().endswith('Markdown(census_table())') for c in cells if c['cell_type'] == 'code')
    assert census_table().count("\n| `") == len(fastai_writers)  # a row for each
    readme = (root/'README.md').read_text()
    assert len(readme.encode()) <= 10_000 and '(95_changes.ipynb)' in readme and '## How to use' in readme, len(readme.encode())

CHECK_DEFAULTS = '''
import fastai.basics
from fastai.learner import defaults
before = list(defaults.callbacks)
import ddp_safe_fastai.all
assert defaults.callbacks == before, defaults.callbacks
import fastai.callback.tracker, fastai.distributed  # what a script imports itself adds fastai's callback, as always
from fastai.callback.progress import ProgressCallback
assert defaults.callbacks == before + [ProgressCallback] and fastai.distributed.ProgressCallback is ProgressCallback
'''

def test_import_changes_no_fastai_default():
    "Importing `ddp_safe_fastai.all` leaves fastai's default callbacks as they were; fastai's own imports still add theirs"
    subprocess.run([sys.executable, '-c', CHECK_DEFAULTS], check=True)

CHECK_NAMES = '''
import fastcore.all, fastai.basics, fastai.callback.all, fastai.distributed, ddp_safe_fastai.all as lib
theirs = {**vars(fastcore.all), **vars(fastai.basics), **vars(fastai.callback.all), **vars(fastai.distributed)}
clash = [n for n in lib.__all__ if n in theirs and theirs[n] is not getattr(lib, n)]
assert not clash, f"these names mean something else in fastai/fastcore: {clash}"
'''

def test_no_name_shadows_fastai_or_fastcore():
    "Each exported name that fastai or fastcore also has is the same object there (fastai's own, made DDP-aware)"
    subprocess.run([sys.executable, '-c', CHECK_NAMES], check=True)
