"""`checkpoint` (nbs/48_checkpoint.ipynb), `CheckpointCallback`'s policies: the best checkpoints kept (`keep_best`);
checkpoints on a clock (`every_minutes`); the weights written once with `SafeSaveModelCallback`. Real ranks under torchrun; the rank-side functions are the first in this file"""
import os, time, shutil, hashlib
from pathlib import Path
import pytest, torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from conftest import values, ranks

class SlowRank(Callback):
    "Rank `rank` trains each batch `delay` seconds slower than the others"
    def __init__(self, rank, delay): self.rank,self.delay = rank,delay
    def after_batch(self):
        if self.training and rank_distrib() == self.rank: time.sleep(self.delay)

def fit_on_clock(root, minutes, slow_rank):
    "3 epochs of 32 batches with `CheckpointCallback(every_minutes=minutes)`, one rank slowed: when each rank checkpointed"
    learn = synth_learner(n=512, path=Path(root), seed=3)
    ckpt = CheckpointCallback(every_minutes=minutes, keep=100)
    saves,save = [],ckpt._checkpoint
    def noted(*args, **kwargs):  # the batch and the moment of each checkpoint this rank takes part in
        saves.append((learn.train_iter, time.monotonic())); return save(*args, **kwargs)
    ckpt._checkpoint = noted
    with learn.distrib_ctx(): learn.fit(3, 0.01, cbs=[ckpt, SlowRank(slow_rank, 0.02)])
    return dict(batches=[b for b,_ in saves], moments=[t for _,t in saves],
                dirs=sorted(p.name for p in (Path(root)/'models'/'ckpt').iterdir() if p.is_dir()))

class UpFrom(Callback):
    "The validation loss goes down, then up: from epoch `epoch` the weights are pushed away before validating"
    def __init__(self, epoch, seen): self.epoch_up,self.seen = epoch,seen
    def before_validate(self):
        if self.epoch >= self.epoch_up:
            with torch.no_grad():
                for p in self.learn.model.parameters(): p.add_(0.5)
    def after_epoch(self): self.seen[self.epoch] = digest(self.learn.model)

def digest(model): return hashlib.sha1(b''.join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()

def best_kept(root):
    "6 epochs, the validation loss down then up from epoch 3, `keep=1, keep_best=2`; the run dies after epoch 2 and is run again"
    seen = {}
    for crash in (True, False):
        learn = synth_learner(n=256, path=Path(root), seed=2)
        class Crash(Callback):
            def after_epoch(self):
                if crash and self.epoch == 2: raise RuntimeError('killed')
        try:
            with learn.distrib_ctx(): learn.fit(6, 0.05, cbs=[CheckpointCallback(keep=1, keep_best=2), UpFrom(3, seen), Crash()])
        except RuntimeError as e: assert 'killed' in str(e)
    losses = [float(v[1]) for v in learn.recorder.values]
    name = learn.load_checkpoint(best=True)
    return dict(name=name, loaded=digest(learn.model), seen=seen, losses=losses,
                checkpoints=sorted(p.name for p in (Path(root)/'models'/'ckpt').iterdir()))

class RemovedByHand(Callback):
    "At the end of the fit, before the best model's reload: the user deletes the newest checkpoint of `fname` by hand"
    order = SafeSaveModelCallback.order - 1
    def __init__(self, fname): self.fname = fname
    def after_fit(self):
        flush_saves()
        if rank_distrib() == 0: shutil.rmtree(sorted((Path(self.learn.path)/'models'/self.fname).glob('epoch_*'))[-1])

def best_and_checkpoints(root):
    """Fits with `SafeSaveModelCallback` and `CheckpointCallback(keep=2)` in one folder: 5 epochs written at once, the
    validation loss down then up from epoch 3 (the checkpoint sharing the best model's file rotated away before the
    reload); then fits of 2 epochs, each a new best, written in the background: plain, with the optimizer's state in
    the best model's file (`with_opt`), and with the newest checkpoint deleted by hand before the reload. For each:
    which checkpoint's `model.pth` is the best model's file, and what the reload took"""
    def files(ckpt):
        models = ckpt.parent
        return {p.name: dict(linked=os.path.samefile(p/'model.pth', models/'model.pth'), holds=digest_file(p/'model.pth'))
                for p in sorted(ckpt.glob('epoch_*'))}
    seen,runs = {},[]
    for fname,epochs,up,bg,with_opt in (('ckpt', 5, 3, False, False), ('again', 2, 99, True, False), ('opt', 2, 99, True, True),
                                        ('byhand', 2, 99, True, False)):
        learn = synth_learner(n=256, path=Path(root), seed=4)
        cbs = [SafeSaveModelCallback(async_save=bg, with_opt=with_opt), CheckpointCallback(fname, keep=2, async_save=bg), UpFrom(up, seen)]
        with learn.distrib_ctx(): learn.fit(epochs, 0.05, cbs=cbs + ([RemovedByHand(fname)] if fname == 'byhand' else []))
        models = Path(root)/'models'
        best = torch.load(models/'model.pth', weights_only=not with_opt) if rank_distrib() == 0 else None  # fastai's optimizer state: not weights only
        runs.append(dict(files=files(models/fname) if rank_distrib() == 0 else None, seen=dict(seen), reloaded=digest(learn.model),
                         best=best and digest_state(best['model'] if with_opt else best),
                         losses=[float(v[1]) for v in learn.recorder.values]))
        seen.clear()
    return runs

def digest_state(sd): return hashlib.sha1(b''.join(v.numpy().tobytes() for v in sd.values())).hexdigest()
def digest_file(f): return digest_state(torch.load(f, weights_only=True))


def test_keep_best_survives_rotation(tmp_path):
    """The best 2 checkpoints by the validation loss are kept beside the newest across a resumed run, and the best loads
    on every rank, bit for bit the weights of its epoch"""
    r0,r1 = values(ranks(best_kept, str(tmp_path), init=False, timeout=240))
    assert r0['losses'] == r1['losses'] and len(r0['losses']) == 6, r0
    order = sorted(range(6), key=lambda e: (r0['losses'][e], e))  # the earlier of equal values first
    assert order[0] < 3 <= order[2], r0['losses']  # down, then up: the best epochs are before the last one
    assert r0['checkpoints'] == sorted([f"epoch_{order[0]+1:04d}", f"epoch_{order[1]+1:04d}", 'epoch_0006', 'latest']), r0
    assert r0['name'] == r1['name'] == f"epoch_{order[0]+1:04d}", r0['name']
    assert r0['loaded'] == r1['loaded'] == r0['seen'][order[0]]  # bit for bit the weights of its epoch, on every rank

def test_keep_best_monitor_is_checked(tmp_path):
    "A monitored metric the Recorder does not record: one clear error at the fit's start"
    learn = synth_learner(path=tmp_path)
    with pytest.raises(ValueError, match=r"CheckpointCallback\(monitor='accuracy'\): the Recorder records \['train_loss', 'valid_loss'\]"):
        learn.fit(1, cbs=CheckpointCallback(monitor='accuracy', keep_best=1))
    assert not (tmp_path/'models').exists()

@pytest.mark.parametrize('slow_rank', [0, 1])
def test_every_minutes_same_batch_on_every_rank(tmp_path, slow_rank):
    "A checkpoint on the clock of the main process, slowed or not, is taken after the same batch by every rank"
    r0,r1 = values(ranks(fit_on_clock, str(tmp_path), 0.005, slow_rank, init=False, timeout=180,
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

def test_weights_written_once(tmp_path):
    """When `SafeSaveModelCallback` saves the best model and `CheckpointCallback` a checkpoint at one epoch's end, the
    checkpoint's `model.pth` is the best model's file under a second name (the weights written once); a checkpoint of
    other weights, or a best model saved with its optimizer, has its own; the best model's reload at the end of the fit
    still takes it as this run's file after the checkpoint sharing it was rotated away or deleted by hand; a rerun in
    the same folder does it again"""
    (first,second,opt,byhand),_ = values(ranks(best_and_checkpoints, str(tmp_path), init=False, timeout=240))
    # the first run: the best epoch is 2 (0-based), its checkpoint epoch_0003, rotated away by epoch_0005 (keep=2)
    assert min(range(5), key=lambda e: first['losses'][e]) == 2, first['losses']
    assert list(first['files']) == ['epoch_0004', 'epoch_0005'], first['files']
    for name,f in first['files'].items():
        e = int(name[-4:]) - 1
        assert not f['linked'] and f['holds'] == first['seen'][e], (name, f)  # other weights than the best: written
    assert first['best'] == first['seen'][2] == first['reloaded']  # the reload at the end took the best model, a name fewer
    # the second: every epoch a new best, each checkpoint's weights the best model's file
    assert second['files']['epoch_0002']['linked'] and second['files']['epoch_0002']['holds'] == second['seen'][1]
    assert not second['files']['epoch_0001']['linked'] and second['files']['epoch_0001']['holds'] == second['seen'][0]
    assert second['best'] == second['seen'][1] == second['reloaded']
    # the best model with its optimizer's state is another file: the checkpoint writes its own; the reload takes the best
    assert not any(f['linked'] for f in opt['files'].values()) and opt['files']['epoch_0002']['holds'] == opt['seen'][1]
    assert opt['best'] == opt['seen'][1] == opt['reloaded']
    # the checkpoint sharing the best model's file deleted by hand: the best model is still this run's, and reloaded
    assert list(byhand['files']) == ['epoch_0001'] and byhand['best'] == byhand['seen'][1] == byhand['reloaded']
