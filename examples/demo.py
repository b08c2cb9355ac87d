"""Two-process DDP training on CPU with fastai, saving and reloading through ddp_safe_fastai.

Run with `tools/demo.sh`, or `torchrun --nproc_per_node 2 examples/demo.py` in an environment that has the library.
Nothing here is special to the CPU: no `cpu=True`, no patched broadcast."""
import os, sys, time, tempfile
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

def say(*msg): print(f"[rank {rank_distrib()}/{num_distrib()}]", *msg, flush=True)

class SlowMain(Callback):
    "Rank 0 lags 0.7 s behind every epoch: the lagging writer of seed 000"
    order = SafeSaveModelCallback.order - 1
    def after_epoch(self):
        if rank_distrib() == 0: time.sleep(0.7)

root = Path(os.environ.get('DEMO_DIR', tempfile.gettempdir()))/'ddp_safe_fastai_demo'
learn = synth_learner(path=root)
with learn.distrib_ctx():
    prepare_dir(root/'models', overwrite=True)            # rank 0 alone empties it; everyone waits
    say(f"training with backend {dist.get_backend()}, rank {rank_distrib()} of {num_distrib()}")
    learn.fit(3, 0.1, cbs=[SafeSaveModelCallback(with_opt=True), SlowMain()])

w = learn.model.weight.flatten()
say(f"after fit: weights {[round(x, 4) for x in w.tolist()]} (the best epoch's, reloaded on every rank)")
files = sorted(p.name for p in (root/'models').iterdir())
say(f"files in models/: {files} (written by rank 0 alone, atomically)")

f = learn.save('final')                                   # every rank calls it; rank 0 writes
with torch.no_grad(): learn.model.weight.zero_()
learn.load('final')                                       # every rank reads it, once rank 0's save is complete
same = torch.equal(learn.model.weight.flatten(), w)
say(f"saved and reloaded {f.name}: {'same weights' if same else 'DIFFERENT weights'}")

gathered = exchange(w.tolist(), 'demo')                   # compare across ranks, through the process group's store
say("all ranks hold identical weights:", all(g == gathered[0] for g in gathered))
try: learn.load('missing')
except CheckpointError as e: say(f"a missing checkpoint is one clear error on every rank: {e}")
if dist.is_initialized(): dist.destroy_process_group()
