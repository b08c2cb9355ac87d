"""What each rank does in the tests of `files` (test_files.py): a guarded save too large for the disk"""
from pathlib import Path
import torch
from fastai.basics import nn
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
