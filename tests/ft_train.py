"""A user's script, run fault-tolerant under torchft by `test_fault_tolerance.py`: a fastai learner in `distrib_ctx`, unchanged
but for a log of every committed step (the step, where the fit is, digests of the weights, the optimizer's state and the
random states, this process's PID, whether its group writes).

    ft_train.py OUT EPOCHS   # env: STEP_PAUSE (seconds a step, until a file OUT/fast is made), N (samples), CKPT=1 (a CheckpointCallback every 10 batches),
                             # MEMORY=1 (a CheckpointCallback into node memory every batch),
                             # BEST=1 (a SafeSaveModelCallback), FINE_TUNE=1 (`fine_tune` instead of `fit`),
                             # GRAD_ACC=1 (fastai's GradientAccumulation), JOIN_PAUSE (seconds a group started again waits before
                             # its first batch's gradients are averaged: a test acts meanwhile), CLIP=1 (fastai's GradientClip,
                             # max_norm 0.01), DIE_AT (group 1's first process kills itself after that step's forward,
                             # its quorum taken, its all-reduce not), CKPT_URL (a CheckpointCallback into that bucket every 10 batches),
                             # BN=1 (a BatchNorm before the linear layer: buffers, running statistics)"""
import os, sys, json, time, hashlib, torch
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from fastai.callback.core import Callback
from fastai.callback.training import GradientAccumulation, GradientClip
from torch import nn

out,epochs = sys.argv[1],int(sys.argv[2])
group,pause = int(os.environ.get('REPLICA_GROUP_ID', 0)),float(os.environ.get('STEP_PAUSE', 0.02))
started_again = os.path.exists(f"{out}/log{group}_{os.environ.get('RANK', 0)}.jsonl")  # a start of this group logged steps before
learn = synth_learner(n=int(os.environ.get('N', 320)), path=out, seed=0)
if os.environ.get('BN'): learn.model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 1))
torch.manual_seed(100 + group)  # each group starts from weights of its own: one model all the same
for m in learn.model.modules(): getattr(m, 'reset_parameters', lambda: None)()
batchnorms = [m for m in learn.model.modules() if isinstance(m, nn.BatchNorm1d)]

def digest(ts):
    h = hashlib.sha256()
    for t in ts: h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

class StepLog(Callback):
    "After every committed training step: where the fit is, and digests of what every live replica must hold alike"
    order = 1002  # after `FaultTolerance`
    def before_fit(self): self.ft = next((cb for cb in self.learn.cbs if isinstance(cb, FaultTolerance)), None)  # None under plain torchrun (the benchmark's baseline)

    def before_step(self):  # the gradients the optimizer steps with, after every other callback's `before_step`
        self.norm = float(torch.stack([p.grad.norm() for p in self.learn.model.parameters() if p.grad is not None]).norm())

    def after_batch(self):
        if not self.training or not len(self.learn.yb): return  # a batch that ended without a step (`yb` emptied, as fastai's `Recorder` reads it)
        ft = self.ft
        opt = self.learn.opt.state
        opt = [st[k] for p in self.learn.model.parameters() for st in [opt.get(p, {})] for k in sorted(st) if isinstance(st[k], torch.Tensor)]
        rec = dict(step=ft.manager.current_step() if ft else self.learn.train_iter, fit=ft.fit_no if ft else 0, epoch=self.epoch, iter=self.iter,
                   live=ft.manager.num_participants() if ft else num_distrib(),
                   writes=run_group.writes, w=digest(self.learn.model.parameters()), opt=digest(opt), rng=digest([torch.get_rng_state()]),
                   bufs=digest(self.learn.model.buffers()), tracked=[int(m.num_batches_tracked) for m in batchnorms],
                   pid=os.getpid(), t=time.time(), train_iter=self.learn.train_iter, losses=len(self.learn.recorder.losses),
                   norm=self.norm, discarded=ft.discarded if ft else 0)
        with open(f"{out}/log{group}_{rank_distrib()}.jsonl", 'a') as f: f.write(json.dumps(rec) + '\n')
        if not os.path.exists(f"{out}/fast"): time.sleep(pause)  # a test that has done what it needed slow steps for makes it

class JoinPause(Callback):
    "A group started again waits `JOIN_PAUSE` seconds before its first batch's gradients are averaged with its peers'"
    order = 1002  # after `FaultTolerance`'s quorum
    def after_loss(self):
        if self.training and started_again and not getattr(self, 'waited', False): self.waited = True; time.sleep(float(os.environ['JOIN_PAUSE']))

class DieAt(Callback):
    "Group 1's first process kills itself after the forward of step `DIE_AT`: its quorum taken, its all-reduce not"
    order = 1002  # after `FaultTolerance`'s quorum
    def before_fit(self): self.ft = next(cb for cb in self.learn.cbs if isinstance(cb, FaultTolerance))
    def after_loss(self):
        if self.training and group == 1 and not started_again and self.ft.manager.current_step() == int(os.environ['DIE_AT']): os.kill(os.getpid(), 9)

cbs = [StepLog()] + ([JoinPause()] if os.environ.get('JOIN_PAUSE') else []) + ([DieAt()] if os.environ.get('DIE_AT') else [])
if os.environ.get('CKPT'): cbs.append(CheckpointCallback(every_iters=10))
if os.environ.get('CKPT_URL'): cbs.append(CheckpointCallback(os.environ['CKPT_URL'], every_iters=10))
if os.environ.get('MEMORY'): cbs.append(CheckpointCallback(memory_every_iters=1))
if os.environ.get('BEST'): cbs.append(SafeSaveModelCallback(fname='best'))
if os.environ.get('GRAD_ACC'): cbs.append(GradientAccumulation(n_acc=64))
if os.environ.get('CLIP'): cbs.append(GradientClip(max_norm=0.01))
with learn.distrib_ctx():
    if os.environ.get('FINE_TUNE'): learn.fine_tune(epochs, 1e-2, cbs=cbs)
    else: learn.fit(epochs, 1e-2, cbs=cbs)
with open(f"{out}/end{group}_{rank_distrib()}.json", 'w') as f:
    json.dump(dict(w=digest(learn.model.parameters()), values=[list(map(float, v)) for v in learn.recorder.values]), f)
