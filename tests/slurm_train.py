"""A fastai DDP run as a SLURM user writes it: `srun python slurm_train.py ROOT DELAY` in a batch script, with
`CheckpointCallback` (it resumes, and on SIGTERM or SIGUSR1 it checkpoints and requeues the job). Every rank writes
ROOT/rank{r}.json at the end: its weights' digest and what SLURM told it"""
import os, sys, json, time, hashlib
from pathlib import Path
from torch import nn
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

class Pace(Callback):
    "Training batches of `delay` seconds; each rank says, in ROOT/batches.RANK, the job's restarts and how many batches it has trained"
    def __init__(self, root, delay): self.root,self.delay = root,delay
    def after_batch(self):
        if not self.training: return
        time.sleep(self.delay)
        Path(self.root, f'batches.{rank_distrib()}').write_text(f"{os.environ.get('SLURM_RESTART_COUNT', 0)} {self.train_iter}")

def digest(model): return hashlib.sha1(b''.join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:16]

if __name__ == '__main__':
    root,delay = Path(sys.argv[1]),float(sys.argv[2])
    learn = synth_learner(n=96, path=root, seed=1)
    learn.model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))  # randomness to resume
    with learn.distrib_ctx():
        learn.fit(4, 0.05, cbs=[CheckpointCallback(), Pace(root, delay)])
    Path(root, f'rank{rank_distrib()}.json').write_text(json.dumps(dict(
        rank=rank_distrib(), world=num_distrib(), weights=digest(learn.model),
        restarts=int(os.environ.get('SLURM_RESTART_COUNT', 0)), job=os.environ.get('SLURM_JOB_ID'))))
