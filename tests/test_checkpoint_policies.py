"""`CheckpointCallback`'s policies (nbs/43_checkpoint.ipynb): checkpoints on a clock (`every_minutes`); the disk's room
checked before a save (nbs/01_files.ipynb). Real ranks under torchrun; the rank-side functions are the first in this file"""
import time
from pathlib import Path
import pytest, torch
from fastai.basics import Callback, nn
from ddp_safe_fastai.all import *
from ddp_safe_fastai.launch import torchrun_ranks
from ddp_safe_fastai.testing import synth_learner
from conftest import values, needs_mounts

class SlowRank(Callback):
    "Rank `rank` trains each batch `delay` seconds slower than the others"
    def __init__(self, rank, delay): self.rank,self.delay = rank,delay
    def after_batch(self):
        if self.training and rank_distrib() == self.rank: time.sleep(self.delay)

def fit_on_clock(root, minutes, slow_rank):
    "3 epochs of 32 batches with `CheckpointCallback(every_minutes=minutes)`, one rank slowed: when each rank checkpointed"
    learn = synth_learner(n=512, path=Path(root), seed=3)
    ckpt = CheckpointCallback(every_minutes=minutes, keep=100)
    saves,save = [],ckpt._save
    def noted(*args, **kwargs):  # the batch and the moment of each checkpoint this rank takes part in
        saves.append((learn.train_iter, time.monotonic())); return save(*args, **kwargs)
    ckpt._save = noted
    with learn.distrib_ctx(): learn.fit(3, 0.01, cbs=[ckpt, SlowRank(slow_rank, 0.02)])
    return dict(batches=[b for b,_ in saves], moments=[t for _,t in saves],
                dirs=sorted(p.name for p in (Path(root)/'models'/'ckpt').iterdir() if p.is_dir()))

def save_too_large(root):
    "Every rank saves a model too large for the disk over a small one's file: what each raised, and what is left"
    learn = synth_learner(path=Path(root)); learn.save('m')
    small = learn.model.weight.detach().clone()
    learn.model = nn.Linear(1024, 2048)  # 8 MiB of weights
    try: learn.save('m', with_opt=False); error = None
    except CheckpointError as e: error = str(e)
    learn.model = nn.Linear(4, 1); learn.load('m', with_opt=False)
    return dict(error=error, intact=torch.equal(learn.model.weight, small), files=sorted(p.name for p in (Path(root)/'models').iterdir()))

@pytest.mark.parametrize('slow_rank', [0, 1])
def test_every_minutes_same_batch_on_every_rank(tmp_path, slow_rank):
    "A checkpoint on the clock of the main process, slowed or not, is taken after the same batch by every rank"
    r0,r1 = values(torchrun_ranks(fit_on_clock, str(tmp_path), 0.005, slow_rank, init=False, timeout=180,
                                  env={'DDP_SAFE_TIMEOUT': '30'}))
    assert r0['batches'] == r1['batches'], (r0['batches'], r1['batches'])
    epochs = [32, 64, 96]
    on_clock = [b for b in r0['batches'] if b not in epochs]
    assert len(on_clock) >= 3 and all(b % 32 for b in on_clock), r0['batches']  # within epochs, besides the epochs' ends
    since_last = [t - s for s,t,b in zip(r0['moments'], r0['moments'][1:], r0['batches'][1:]) if b % 32]
    assert min(since_last) >= 0.3, since_last  # 0.005 minutes of the main process's clock since the last checkpoint
    written = [f"epoch_{b//32:04d}_iter_{b%32:06d}" if b % 32 else f"epoch_{b//32:04d}" for b in r0['batches']]
    assert r0['dirs'] == sorted(written), (r0['dirs'], written)

def test_every_minutes_is_checked():
    "A bad interval is refused when the callback is made, naming the setting"
    for bad in (0, -1, 'ten', float('nan'), float('inf')):
        with pytest.raises(ValueError, match=r"CheckpointCallback\(every_minutes="): CheckpointCallback(every_minutes=bad)


@needs_mounts
def test_save_too_large_for_the_disk(tmp_path):
    "A guarded save that the disk (a 4 MiB tmpfs) has no room for: refused on every rank before it is written, naming the directory, the bytes free and needed"
    mount = 'mount --make-rprivate / && mount -t tmpfs -o size=4m tmpfs "$0" && exec "$@"'
    res = values(torchrun_ranks(save_too_large, str(tmp_path), nproc=2, timeout=120,
                                node_prefix=lambda i: ['unshare', '-m', 'sh', '-c', mount, str(tmp_path)]))
    assert res[0]['error'] == res[1]['error'] and res[0]['error'], res
    assert f"could not write {tmp_path}/models/m.pth: not enough room on the disk of {tmp_path}/models: " in res[0]['error'], res
    assert f"bytes free, {(1024*2048 + 2048)*4:,} needed; nothing was written" in res[0]['error'], res
    assert all(r['intact'] and r['files'] == ['m.pth'] for r in res), res  # the previous file, and no temporary

