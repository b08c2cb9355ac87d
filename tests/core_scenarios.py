"""What each rank does in the tests of `core` (test_core.py): who each process is, meetings that name a missing
rank, a too large exchange, `main_process_first` failing"""
import os, time
from ddp_safe_fastai.all import *

def ranks():
    "What this process believes about itself, through fastai's own functions"
    import fastai.torch_core, fastai.learner
    return dict(rank=fastai.learner.rank_distrib(), world=fastai.torch_core.num_distrib(), local=local_rank_distrib(),
                main=is_main_process(), env_rank=os.environ.get('RANK'))

def barrier_missing(absent, timeout, late=0.):
    "Every rank but `absent` enters a barrier, the last rank `late` s after the others; returns how the wait ended, and how long it lasted"
    if rank_distrib() == absent:
        time.sleep(timeout + late + 8)
        return 'absent'
    if rank_distrib() == num_distrib()-1: time.sleep(late)
    t = time.monotonic()
    try: distrib_barrier(timeout=timeout)
    except Exception as e: return dict(error_type=type(e).__name__, error=str(e), waited=time.monotonic()-t)
    return dict(error_type=None, error=None, waited=time.monotonic()-t)

def slow_reader_at_the_end(delay):
    "Ranks meet once and leave; every rank but 0 is `delay` s late reading the meeting (rank 0's process may host the store)"
    import sys
    def late(frame, event, f):
        # the library's reads of the store (a pybind11 method, so not a `Store` bound method): not a `dict.get`
        reads = getattr(f, '__name__', '') in ('get', 'multi_get') and not isinstance(getattr(f, '__self__', None), dict)
        if event == 'c_call' and frame.f_globals['__name__'] == 'ddp_safe_fastai.core' and reads:
            sys.setprofile(None); time.sleep(delay)
    if rank_distrib(): sys.setprofile(late)
    try: return broadcast_object(f"from rank {rank_distrib()}")
    finally: sys.setprofile(None)

def exchange_too_large():
    "Rank 1 publishes 9 MB, the others a few bytes; returns what each rank raised"
    try: exchange(b'x'*(9_000_000 if rank_distrib() == 1 else 10), 'large')
    except ValueError as e: return str(e)

def main_first_fails(timeout):
    "The main process raises inside `main_process_first`"
    with main_process_first(timeout=timeout):
        if rank_distrib() == 0: raise ValueError('download failed')
    return 'passed'
