"""What each rank does in the tests of `checkpoint`'s resume on another world size (test_checkpoint_world_size.py,
test_checkpoint_dir.py): a fit that logs the samples it trains on and can stop once a checkpoint is written"""
import os, json, time, importlib
from pathlib import Path
import torch
import torch.distributed as dist
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.persist import flush_saves
from ddp_safe_fastai.testing import synth_learner
from checkpoint_resume_scenarios import Noise

class SampleLog(Callback):
    "Appends the samples of every training batch whose step is done to `root/samples.jsonl`: run, world size, epoch, batch"
    order = -100  # before any callback changes the batch (`Noise`)
    def __init__(self, root, run): self.file,self.run = Path(root)/'samples.jsonl',run
    def before_fit(self):
        ds = self.dls.train_ds
        self.ids = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    def before_batch(self):
        if self.training: self.batch = [self.ids[x.numpy().tobytes()] for x in self.xb[0]]
    def after_batch(self):
        if not self.training: return
        line = dict(run=self.run, attempt=int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)), world=num_distrib() or 1,
                    rank=rank_distrib(), epoch=self.epoch, iter=self.iter, samples=self.batch)
        with open(self.file, 'a') as f: f.write(json.dumps(line) + '\n')

class StopAt(Callback):
    """Once the checkpoint of `at` (epochs done, or an epoch and batches done in it) is written: `root/stop` appears, then
    wait `wait` seconds (to be killed in), or with `wait='peer'` until another node is killed (a barrier fails: this
    rank raises, for torchrun to restart it alone)"""
    order = 1001  # after `CheckpointCallback`
    def __init__(self, root, at, wait): self.root,self.at,self.wait = Path(root),at,wait
    def _stop(self):
        flush_saves()  # the checkpoint is written in the background: its commit is done
        if rank_distrib() == 0: (self.root/'stop').touch()
        if self.wait != 'peer': return time.sleep(self.wait)
        end = time.monotonic() + 120
        while True:  # until the barrier raises, as the peer's connection closes: its node was killed
            dist.barrier()
            assert time.monotonic() < end, f"premise: a node was killed within 120 s of {self.root/'stop'} (rank {rank_distrib()} still met every rank)"
            time.sleep(0.05)
    def after_batch(self):
        if self.training and (self.epoch, self.iter+1) == self.at: self._stop()
    def after_epoch(self):
        if (self.epoch+1,) == self.at: self._stop()

def _bits_equal(a, b):
    "Are the tensors of `a` and `b`, in order, the same bit for bit?"
    ta,tb = list(tensors_in(a)),list(tensors_in(b))
    return len(ta) == len(tb) > 0 and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)) for x,y in zip(ta, tb))

class AsLoaded(Callback):
    "At the resumed fit's first training batch, before any callback draws from them: are the model's weights, the optimizer's state and torch's random state the checkpoint's, bit for bit?"
    order = -200
    def __init__(self, root): self.root,self.seen = Path(root)/'models'/'ckpt',None
    def before_batch(self):
        if not self.training or self.seen is not None: return
        ckpt = self.root/(self.root/'latest').read_text().strip()
        kept,rng = torch.load(ckpt/'state.pth', weights_only=False)['model'],torch.load(ckpt/'rng.pth', weights_only=False)[rank_distrib()]
        self.seen = dict(model=_bits_equal(kept['model'], self.learn.model.state_dict()),
                         opt=_bits_equal(kept['opt']['state'], self.learn.opt.state_dict()['state']),
                         rng=torch.equal(rng['torch'], torch.get_rng_state()))

def any_world_fit(root, run='first', every_iters=None, stop_at=None, n=96, wait=600, as_loaded=False):
    "Dropout, noise, one-cycle, `n` samples in batches of 8: resumes if a checkpoint exists; logs the samples it trains on; `as_loaded`: see `AsLoaded`"
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(n=n, path=Path(root), seed=3)
    nn = torch.nn
    learn.model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    ckpt = CheckpointCallback(every_iters=every_iters)
    loaded = AsLoaded(root) if as_loaded else None
    cbs = [ckpt, Noise(), SampleLog(root, run)] + ([StopAt(root, stop_at, wait)] if stop_at else []) + ([loaded] if loaded else [])
    with learn.distrib_ctx(): learn.fit_one_cycle(4, 0.02, cbs=cbs)
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    return dict(sha=h, resumed_from=ckpt.resumed_from, world=num_distrib() or 1, epochs=len(learn.recorder.values),
                values=[list(map(float, v)) for v in learn.recorder.values], pct_train=learn.pct_train, as_loaded=loaded and loaded.seen)
