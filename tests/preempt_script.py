"""A user's training script: dropout, random noise on the inputs, one-cycle, checkpoints. torchrun ... ROOT [EVERY_ITERS WATCH SLOW].
Each rank logs the training batches it starts (`batches<rank>.txt`: epoch, batch, time), and when it raised on `RAISE_AT`
(`raised<rank>`) or stopped on a signal (`stopped<rank>`), for the tests to time from or to"""
import os, sys, json, time, hashlib
from pathlib import Path
import torch
from fastai.basics import *
from fastai.callback.schedule import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

class Noise(Callback):
    def before_batch(self):
        if self.training: self.learn.xb = (self.xb[0] + 0.1*torch.randn_like(self.xb[0]),)

class SlowBatch(Callback):  # each batch lasts at least 20 ms: a signal at a random moment lands inside the run
    def before_batch(self): self.t = time.monotonic()
    def after_batch(self): time.sleep(max(0, 0.02 - (time.monotonic() - self.t)))

class LogBatches(Callback):  # the tests time a signal from a batch trained, not from how far the run got meanwhile
    order = -20  # before any other callback sees the batch
    def before_fit(self): self.log = open(root/f"batches{rank_distrib()}.txt", 'a')
    def before_batch(self):
        if self.training: self.log.write(f"{self.epoch} {self.iter} {time.time()}\n"); self.log.flush()

class AgreedStop(Callback):  # STOP_AFTER=N: the ranks have agreed, as on a signal, to stop after training batch N
    order = CheckpointCallback.order + 1
    def before_batch(self):
        if self.training and os.environ.get('STOP_AFTER'): self.learn.checkpoint.stop.watch.stop_at = int(os.environ['STOP_AFTER'])

class BadBatch(Callback):  # RAISE_AT=N RAISE_ON=all|R: the loss of training batch N raises on every rank, or on rank R
    def after_loss(self):
        on = os.environ.get('RAISE_ON', 'all')
        if self.training and self.train_iter == int(os.environ.get('RAISE_AT', -1)) and on in ('all', str(rank_distrib())):
            (root/f"raised{rank_distrib()}").write_text(repr(time.time()))
            raise ValueError(f"bad batch {self.train_iter} on rank {rank_distrib()}")

root,every,watch,slow = Path(sys.argv[1]),*[int(a) for a in (sys.argv[2:] + ['0', '1', '1'][len(sys.argv)-2:])]
learn = synth_learner(n=512, path=root, seed=4)
learn.model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
ckpt = CheckpointCallback(every_iters=every or None, stop_on_signal=bool(watch), on_exception=True)
t = time.monotonic()
try:
    with learn.distrib_ctx(): learn.fit_one_cycle(3, 0.02, cbs=[ckpt, Noise(), LogBatches(), AgreedStop(), BadBatch()] + ([SlowBatch()] if slow else []))
except SystemExit:  # a signal stopped this rank: checkpointed, out of its process group
    (root/f"stopped{rank_distrib()}").write_text(repr(time.time())); raise
seconds = time.monotonic() - t
sha = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
(root/f"result{rank_distrib()}.json").write_text(json.dumps(dict(sha=sha, resumed_from=ckpt.resumed_from, seconds=seconds)))
