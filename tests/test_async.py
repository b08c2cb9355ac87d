"Issue 5: asynchronous saves keep every guarantee of the synchronous ones"
import scenarios as s
from conftest import values

def test_async_save_then_load_is_fresh(launch, tmp_path):
    assert values(launch(s.async_fresh, str(tmp_path))) == [2., 2.]

def test_async_write_failure_reaches_every_rank(launch, tmp_path):
    for r in values(launch(s.async_write_failure, str(tmp_path))):
        assert r['error'] and r['error'].startswith('could not write') and 'm.pth' in r['error'], r
        assert r['value'] == 1.   # the previous checkpoint survives
        assert r['files'] == []   # no temporary left
