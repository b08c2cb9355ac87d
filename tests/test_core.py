"""`core` (nbs/04_core.ipynb): who each process is, under torchrun and under `mp.spawn` with no launcher environment;
meetings (barriers, exchanges, `main_process_first`) that end on every rank, naming the rank that did not come"""
import pytest
import core_scenarios as s
from conftest import values, ranks

@pytest.mark.parametrize('nproc', [2, 4])
def test_rank_detection(launch, nproc):
    "fastai's `rank_distrib`/`num_distrib` and the library's `local_rank_distrib`/`is_main_process` place each of 2 or 4 ranks, under `mp.spawn` too, where no launcher variable is set"
    res = values(launch(s.ranks, nproc=nproc))
    assert [r['rank'] for r in res] == list(range(nproc))
    assert all(r['world'] == nproc for r in res)
    assert [r['local'] for r in res] == list(range(nproc))
    assert [r['main'] for r in res] == [True] + [False]*(nproc-1)
    if launch.name == 'spawn': assert all(r['env_rank'] is None for r in res)  # fastai alone would say 0 everywhere

def test_barrier_names_the_missing_rank(launch):
    "A barrier rank 1 never comes to: the others raise `DistributedTimeoutError` naming rank 1 after the timeout, not the backend's 30 minutes"
    res = values(launch(s.barrier_missing, 1, 3, nproc=3, timeout=60))
    assert res[1] == 'absent'
    for o in (res[0], res[2]):
        assert o['error_type'] == 'DistributedTimeoutError', o
        assert 'rank(s) [1] did not arrive within 3s' in o['error']
        assert o['waited'] < 3 + 20, f"the error came at the meeting's timeout (3 s), not the backend's 30 minutes: {o}"
    assert max(res[0]['waited'], res[2]['waited']) >= 3, res  # the first to give up waited the whole timeout

def test_barrier_failure_reaches_a_late_rank(launch):
    "Rank 2 comes 2 s after rank 0, rank 1 never: rank 0 gives up first, and rank 2 still names rank 1"
    res = values(launch(s.barrier_missing, 1, 3, 2., nproc=3, timeout=60))
    for o in (res[0], res[2]): assert 'rank(s) [1] did not arrive within 3s' in str(o['error']), o

def test_last_meeting_outlives_the_store_host(launch):
    "Rank 0 leaves the process at once after a meeting that the others read 1 s late: they still read it"
    assert values(launch(s.slow_reader_at_the_end, 1.0, nproc=3)) == ['from rank 0']*3

def test_too_large_an_exchange_fails_on_every_rank(launch):
    "An exchange where rank 1's object pickles to 8.6 MiB: every rank raises, naming rank 1 and the size"
    res = values(launch(s.exchange_too_large, nproc=3))
    assert all(m and "large: the object of rank(s) [1] pickles to 8.6 MiB" in m for m in res), res

def test_barrier_timeout_is_prompt():
    "On the ranks that arrived, the error comes within the timeout plus a few seconds"
    o = values(ranks(s.barrier_missing, 1, 3, nproc=2, timeout=60))[0]
    assert o['error_type'] == 'DistributedTimeoutError', o
    assert 3 <= o['waited'] < 3 + 3, f"the error came at the meeting's timeout (3 s), not the backend's: {o}"

def test_main_process_first_failure_reaches_every_rank(launch):
    "The main process raises inside `main_process_first`: every other rank raises a `CheckpointError` carrying its error and naming rank 0"
    res = launch(s.main_first_fails, 10, nproc=3)
    assert res[0].error_type == 'ValueError'
    for o in res[1:]:
        assert o.error_type == 'CheckpointError' and 'download failed' in o.error and 'rank(s) [0]' in o.error, o
