"""`persist` (nbs/14_persist.ipynb), through `Learner.save` and `load` on 2 CPU ranks: one writer, whose bytes every rank
loads (a late writer, a rank loading alone, disks some ranks do not share or cannot read); a failed write, a corrupt file
or a pickle payload refused on every rank; `prepare_dir` over a directory the ranks write into"""
import persist_scenarios as s
from conftest import values, needs_mounts
from ddp_safe_fastai.launch import torchrun_ranks

def test_only_main_writes(launch, tmp_path):
    "Every rank saves different weights: the file, and every rank's load, hold rank 0's"
    res = values(launch(s.only_main_writes, str(tmp_path)))
    assert res == [dict(loaded=10., on_disk=10.)]*2

def test_lagging_writer(launch, tmp_path):
    "Rank 0 comes 2 s late to a save over an older file: every rank loads the new weights, never the older file"
    assert values(launch(s.lagging_writer, str(tmp_path))) == [2., 2.]

def test_lagging_writer_saving_alone(launch, tmp_path):
    "Rank 0 alone saves, 2 s late, with no barrier of the user's: every rank's load waits for it and gets the new weights"
    assert values(launch(s.lagging_writer_load_only, str(tmp_path))) == [2., 2.]

def test_tutorial_idiom(launch, tmp_path):
    "PyTorch's tutorial idiom (a save on rank 0 only, `dist.barrier()`, a load on every rank) still works: rank 0's weights everywhere"
    assert values(launch(s.tutorial_idiom, str(tmp_path), timeout=60)) == [5., 5.]

def test_load_on_one_rank_alone(launch, tmp_path):
    "Rank 0 alone loads: `DistributedTimeoutError` after the timeout, naming rank 1 and pointing to `local_io`; within `local_io` the load works"
    r0, r1 = values(launch(s.load_alone, str(tmp_path), 4))
    assert r1 == 'not loading'
    assert 'rank(s) [1] did not arrive within 4s' in r0['error'] and 'local_io' in r0['error']
    assert 4 <= r0['seconds'] < 4 + 3, f"the error came at the load's timeout (4 s), not the backend's: {r0}"
    assert r0['value'] == 4.

def test_write_failure_on_rank0(launch, tmp_path):
    "Rank 0's save fails half-way (a file size limit): every rank raises `CheckpointError`; the previous file still loads, no temporary is left"
    res = values(launch(s.write_failure, str(tmp_path), 20))
    for r in res:
        assert r['error'].startswith('CheckpointError: could not write') and 'm.pth' in r['error'], r
        assert r['value'] == 1.                # the previous checkpoint still loads
        assert r['files'] == ['m.pth']         # and no temporary is left

def test_unshared_disks_get_rank0s_bytes(launch, tmp_path):
    "Each rank has its own disk and only rank 0's holds the file: the load sends rank 0's bytes (the default)"
    assert values(launch(s.unreadable_on_some, str(tmp_path))) == [10., 10.]

def test_unshared_disks_without_sending(launch, tmp_path):
    "The same with `DDP_SAFE_BROADCAST_FILES=0`: every rank raises the same error, naming the file and rank 1"
    for r in values(launch(s.unreadable_on_some, str(tmp_path), env={'DDP_SAFE_BROADCAST_FILES': '0'})):
        assert r.startswith('CheckpointError') and 'rank(s) [1] on node(s) [0] do not have the file' in r and 'm.pth' in r

@needs_mounts
def test_unreadable_on_some_ranks(launch, tmp_path):
    "Rank 1 sees an empty file where the checkpoint is: every rank raises `CheckpointError` naming rank 1 and the file"
    for r in values(launch(s.unreadable_in_shared_dir, str(tmp_path))):
        assert r.startswith('CheckpointError') and 'failed on rank(s) [1]: truncated or corrupt' in r and 'm.pth' in r

def test_corrupt_file(launch, tmp_path):
    "A truncated checkpoint: every rank raises `CheckpointError` naming the file as truncated or corrupt"
    for r in values(launch(s.corrupt_file, str(tmp_path))):
        assert r.startswith('CheckpointError') and 'truncated or corrupt' in r and 'm.pth' in r

def test_planted_payload_never_runs(launch, tmp_path):
    "A checkpoint holding a pickle payload: every rank's load refuses it as not plain weights, and the payload never runs"
    for r in values(launch(s.planted_payload, str(tmp_path))):
        assert not r['ran'] and 'not plain weights' in r['error'] and 'model.pth' in r['error']

def test_prepare_dir_overwrite_race(launch, tmp_path):
    "openpi issue #868: 4 ranks, 30 trials of rmtree+mkdir over a populated directory"
    assert values(launch(s.prepare_dirs, str(tmp_path), 30, nproc=4, timeout=240)) == [0, 0, 0, 0]

def test_unguarded_rmtree_race_fails(tmp_path):
    "The pattern of openpi issue #868 without the library does fail here, so the test above can tell the difference"
    errors = values(torchrun_ranks(s.raw_prepare_dirs, str(tmp_path), 30, nproc=4, timeout=240))
    print(f"unguarded rmtree/mkdir: {sum(errors)} errors in {30*4} rank-trials")
    assert sum(errors) > 0
