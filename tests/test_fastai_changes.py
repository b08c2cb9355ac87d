"One table of what the library changes in fastai, fastai's originals pinned, and a census of fastai's writers kept true"
import re, json, hashlib, inspect, importlib
from pathlib import Path
import pytest
import fastai
importlib.import_module('ddp_safe_fastai.all')  # every change in force
from ddp_safe_fastai.changes import fastai_changes, fastai_writers, importable, fastai_version_of, current, unlisted_changes, unlisted_writers

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
    for m in ('fastai.text.all', 'fastai.tabular.all', 'fastai.collab'): importlib.import_module(m)  # what users import
    assert unlisted_changes() == []

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

def test_readme_has_the_census():
    from ddp_safe_fastai.changes import census_table
    assert census_table() in (Path(__file__).parent.parent/'README.md').read_text()
