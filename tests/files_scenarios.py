"""What each rank does in the tests of `files` (test_files.py): a guarded save too large for the disk; a checkpointed fit and its resume"""
from pathlib import Path
import torch
from fastai.basics import nn, Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

def save_too_large(root):
    "Every rank saves a model too large for the disk over a small one's file: what each raised, and what is left"
    learn = synth_learner(path=Path(root)); learn.save('m')
    small = learn.model.weight.detach().clone()
    learn.model = nn.Linear(1024, 2048)  # 8 MiB of weights
    try: learn.save('m', with_opt=False); error = None
    except CheckpointError as e: error = str(e)
    learn.model = nn.Linear(4, 1); learn.load('m', with_opt=False)
    return dict(error=error, intact=torch.equal(learn.model.weight, small), files=sorted(p.name for p in (Path(root)/'models').iterdir()))

def _opt_tensors(learn): return [t.clone() for t in tensors_in(learn.opt.state_dict()['state'])]

def checkpoint_and_resume(root):
    "Fit 2 epochs, checkpointing each, then resume into a fresh Learner for a third: what was resumed, and whether the optimizer's state came back bit for bit"
    learn = synth_learner(path=Path(root))
    with learn.distrib_ctx(): learn.fit(2, 1e-2, cbs=CheckpointCallback(resume=False))
    saved = _opt_tensors(learn)
    again = synth_learner(path=Path(root)); resumed = []
    class Seen(Callback):
        order = CheckpointCallback.order + 1
        def before_train(self):
            if not resumed: resumed.extend([self.epoch, _opt_tensors(self.learn)])
    with again.distrib_ctx(): again.fit(3, 1e-2, cbs=[CheckpointCallback(), Seen()])
    same = len(saved) == len(resumed[1]) and all(torch.equal(a, b) for a,b in zip(saved, resumed[1]))
    return dict(epoch=resumed[0], same_opt=same, files=sorted(p.name for p in (Path(root)/'models'/'ckpt').iterdir()))
