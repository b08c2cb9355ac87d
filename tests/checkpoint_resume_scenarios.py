"""What each rank does in the tests of `checkpoint`'s resume (test_checkpoint_resume.py): one-cycle fits with
`CheckpointCallback` that resume from the latest checkpoint if there is one; `Noise` serves the world-size tests too"""
import os, importlib, time
from contextlib import contextmanager
from pathlib import Path
import torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

@contextmanager
def _third_state_held(hold):
    "If `hold`, `os.replace` holds the third checkpoint's state 3 s in its temporary file, written whole but not yet in place"
    replace = os.replace
    def held(src, dst, *args, **kwargs):
        if Path(dst).name == 'state.pth' and Path(dst).parent.name == 'epoch_0003': time.sleep(3)
        return replace(src, dst, *args, **kwargs)
    if hold: os.replace = held
    try: yield
    finally: os.replace = replace  # a rank of the tests' pool runs other scenarios next

def resume_fit(root, epochs=4, hidden=1500, hold_third_write=False, wait_to_be_killed=False):
    """`epochs` epochs of one-cycle training in `distrib_ctx` with `CheckpointCallback`: resumes if a checkpoint exists;
    `hold_third_write`: a kill polled for from outside lands inside the third checkpoint's write, however loaded the machine;
    `wait_to_be_killed`: after the fit, wait (for a kill timed from outside that comes after the end of training)"""
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(path=Path(root), seed=1)
    torch.manual_seed(1)
    nn = torch.nn  # ~27 MB of model and Adam state: a checkpoint write takes long enough to be killed in
    learn.model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    ckpt = CheckpointCallback()
    with _third_state_held(hold_third_write), learn.distrib_ctx(): learn.fit_one_cycle(epochs, 0.01, cbs=[SafeSaveModelCallback(), ckpt])
    if wait_to_be_killed: time.sleep(300)
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    return dict(sha=h, resumed_from=ckpt.resumed_from, epochs=len(learn.recorder.values))

class Noise(Callback):
    "Random augmentation: noise on every training batch, from this rank's torch RNG"
    def before_batch(self):
        if self.training: self.learn.xb = (self.xb[0] + 0.1*torch.randn_like(self.xb[0]),)

class HoldWhenLatest(Callback):
    "Stop training, to be killed, once `latest` names checkpoint `ckpt_name`: every background save finished before the next one"
    order = CheckpointCallback.order - 1  # before its saves
    def __init__(self, ckpt_name): self.ckpt_name = ckpt_name
    def after_batch(self):
        if self.training: self._hold()
    def after_epoch(self): self._hold()
    def _hold(self):
        flush_saves()  # on the main process: the checkpoint in the background is committed before the next is taken
        latest = Path(self.learn.path)/self.learn.model_dir/'ckpt'/'latest'
        while latest.is_file() and latest.read_text() == self.ckpt_name: time.sleep(1)

def resume_within_epoch(root, every_iters=3, hold_at=None):
    "Dropout, noise, one-cycle; a checkpoint every `every_iters` batches too: resumes if a checkpoint exists"
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(n=256, path=Path(root), seed=2)
    nn = torch.nn
    learn.model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    ckpt = CheckpointCallback(every_iters=every_iters)
    with learn.distrib_ctx(): learn.fit_one_cycle(3, 0.02, cbs=[ckpt, Noise(), *([HoldWhenLatest(hold_at)] if hold_at else [])])
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    rec = learn.recorder
    return dict(sha=h, resumed_from=ckpt.resumed_from, losses=[float(l) for l in rec.losses], lrs=list(map(float, rec.lrs)),
                values=[list(map(float, v)) for v in rec.values])
