"""A fastai DDP run as a SLURM user writes it: `srun python slurm_train.py ROOT DELAY` in a batch script, with
`CheckpointCallback` (it resumes, and on SIGTERM or SIGUSR1 it checkpoints and requeues the job). Every rank writes
ROOT/rank{r}.json at the end: its weights' digest and what SLURM told it. HOLD_AFTER=N: in the job's first run, every
rank holds after training batch N until the stop of a signal is agreed"""
import os, sys, json, time, hashlib
from pathlib import Path
from torch import nn
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

class Pace(Callback):
    """Training batches of `delay` seconds; each rank says, in ROOT/batches.RANK, the job's restarts and how many batches it
    has trained; with HOLD_AFTER, it then holds for the signal's stop (before `CheckpointCallback` sees the batch): the
    signal reaches ranks that train, however long SLURM takes to deliver it"""
    def __init__(self, root, delay): self.root,self.delay,self.hold_after = root,delay,os.environ.get('HOLD_AFTER')
    def after_batch(self):
        if not self.training: return
        time.sleep(self.delay)
        restarts = int(os.environ.get('SLURM_RESTART_COUNT', 0))
        Path(self.root, f'batches.{rank_distrib()}').write_text(f"{restarts} {self.train_iter}")
        if self.hold_after and restarts == 0 and self.train_iter >= int(self.hold_after): self._hold()
    def _hold(self):
        "Wait until the watch's thread has set the stop: on this rank's signal, or on another rank's proposal through the store"
        watch,end = self.learn.checkpoint.stop.watch,time.monotonic() + 120
        while watch.stop_at is None:
            assert time.monotonic() < end, f"premise: the signal reached rank {rank_distrib()} while it trained (held after batch {self.train_iter})"
            time.sleep(0.05)

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
