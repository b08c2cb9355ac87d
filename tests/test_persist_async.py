"`persist` (nbs/14_persist.ipynb), background saves: asynchronous saves keep every guarantee of the synchronous ones"
import pytest
import persist_async_scenarios as s
from conftest import values, needs_mounts, ranks

def test_async_save_then_load_is_fresh(launch, tmp_path):
    "`save(async_save=True)` with rank 0 1 s late, then a load at once: every rank gets the new weights"
    assert values(launch(s.async_fresh, str(tmp_path))) == [2., 2.]

def test_async_write_failure_reaches_every_rank(launch, tmp_path):
    "Background writes fail half-way on rank 0: every rank raises at the next save of that file, or at `flush_saves` for another; the previous checkpoint survives, no temporary is left"
    for r in values(launch(s.async_write_failure, str(tmp_path))):
        assert r['error'] and r['error'].startswith('could not write') and 'm.pth' in r['error'], r
        assert r['flushed'] and r['flushed'].startswith('could not write') and 'other.pth' in r['flushed'], r
        assert r['value'] == 1.   # the previous checkpoint survives
        assert r['files'] == []   # no temporary left

@pytest.mark.parametrize('which', ['best', 'checkpoint'])
def test_each_callback_raises_its_own_failure(tmp_path, which):
    "The background write of one callback fails on rank 0, the other's succeeds: as the fit ends, the one that failed raises it (not the other, which waits first), on every rank; the other's file is whole"
    res = values(ranks(s.one_callback_fails, str(tmp_path), which, init=False, nproc=2, timeout=300))
    assert res[0]['error'] == res[1]['error'], res
    e = res[0]['error']
    if which == 'best':  # fastai puts the callback's name before the message
        assert 'SafeSaveModelCallback' in e and f"could not write {tmp_path}/models/model.pth" in e, e
        assert res[0]['latest'] == 'epoch_0001', res  # the checkpoint was committed
    else:
        assert 'CheckpointCallback' in e and 'SafeSaveModelCallback' not in e and f"{tmp_path}/models/ckpt/epoch_0001" in e, e
        assert res[0]['best'], res  # the best model was written, and reloaded without raising

def test_checkpoint_holds_the_weights_of_its_step(tmp_path):
    "CheckpointCallback copies the weights while the next batch runs: a slow copy still ends before the step that changes them"
    res = values(ranks(s.checkpoint_of_its_step, str(tmp_path), 0.5, 2, init=False, nproc=2, timeout=300))
    assert res[0] == res[1] and len(res[0]) == 3 + 3, res  # 3 epochs' ends; one checkpoint within each (4 batches a rank)
    assert all(res[0].values()), res

@needs_mounts
def test_background_write_failure_reaches_every_rank(tmp_path):
    """The disk (a small tmpfs) fills up after epoch 0: the checkpoint of epoch 1 is refused before it is written, on
    every rank at that epoch's end; the best model's background write is refused too, raised on every rank at the
    flush; epoch 0's files survive"""
    from ddp_safe_fastai.launch import torchrun_ranks
    mount = 'mount --make-rprivate / && mount -t tmpfs -o size=4m tmpfs "$0" && exec "$@"'
    res = values(torchrun_ranks(s.background_write_failure, str(tmp_path), init=False, nproc=2, timeout=300,
                                node_prefix=lambda i: ['unshare', '-m', 'sh', '-c', mount, str(tmp_path)]))
    assert res[0] == res[1], res  # the same errors, at the same epoch, on every rank
    (first, epoch), (then, at) = res[0]['errors']
    # fastai puts the callback's name before the message
    assert f"could not write {tmp_path}/models/ckpt/epoch_0002: not enough room on the disk of {tmp_path}/models/ckpt: 0 bytes free, 60 needed" in first, first
    assert epoch == 1, epoch  # at the end of the epoch whose checkpoint it is, not a save later
    assert f"could not write {tmp_path}/models/model.pth: not enough room" in then and at is None, then  # in the background
    assert res[0]['latest'] == 'epoch_0001' and res[0]['model_of_epoch_0'] and res[0]['temporaries'] == [], res
    assert res[0]['checkpoints'] == ['epoch_0001', 'latest'], res  # nothing of epoch 1's was written
