"""What each rank does in the tests of `core` on several nodes (test_core_multinode.py): saves and loads of both
scopes, a node-scope save on a shared disk, a resume on both nodes, `ddp-safe-check dir` from every node"""
import os, importlib
from pathlib import Path
import torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from persist_scenarios import _learner, _fill, _value

def node_save_load(disk):
    "Every rank saves with both scopes, then loads both; `disk` is this node's own checkpoint disk"
    learn = synth_learner(path=Path(disk))
    _fill(learn, 10. + rank_distrib())
    learn.save('g'); learn.save('n', scope='node')
    _fill(learn, -1.)
    try: learn.load('g'); g = _value(learn)
    except CheckpointError as e: g = str(e)
    _fill(learn, -1.); learn.load('n', scope='node'); n = _value(learn)
    return dict(node=node_rank_distrib(), files=sorted(p.name for p in (Path(disk)/'models').iterdir()), g=g, n=n)

def node_saves_on_shared_disk(root, n=30):
    "`scope='node'` on a disk the nodes share: each node writes the same file at the same moment, `n` times"
    learn = _learner(root)
    learn.model = torch.nn.Linear(1000, 1000)  # 4 MB: writes long enough to overlap
    _fill(learn, float(node_rank_distrib()))
    failures = []
    for _ in range(n):
        distrib_barrier()
        try: learn.save('n', with_opt=False, scope='node')
        except CheckpointError as e: failures.append(str(e))
    distrib_barrier()
    learn.load('n', with_opt=False, scope='node')
    return dict(failures=failures, value=_value(learn), files=sorted(os.listdir(Path(root)/'models')))

def node_resume(disk, scope, stop_after=None, epochs=4):
    "One-cycle training with `CheckpointCallback(scope=scope)`, stopped after `stop_after` epochs or resumed"
    importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    from fastai.basics import CancelFitException
    class Stop(Callback):
        order = CheckpointCallback.order + 1
        def after_epoch(self):
            if self.epoch + 1 == stop_after: raise CancelFitException
    learn = synth_learner(path=Path(disk), seed=1)
    ckpt = CheckpointCallback(scope=scope)
    with learn.distrib_ctx(): learn.fit_one_cycle(epochs, 0.1, cbs=[SafeSaveModelCallback(scope=scope), ckpt, Stop()])
    return dict(node=node_rank_distrib(), resumed_from=ckpt.resumed_from, weights=learn.model.weight.flatten().tolist())

def check_here(path):
    "What `ddp-safe-check dir` reports of `path`, on rank 0 (None elsewhere); with this rank's node"
    from ddp_safe_fastai.check import check_dir
    rep = check_dir(path)
    return dict(node=node_rank_distrib(), shared=rep and rep['shared'])

def node_memory(disk, stop_at=None):
    """Two epochs with a checkpoint every 4 training batches into each node's own memory (`memory_dir` on this node's
    disk: node-local, as a tmpfs is); with `stop_at`, every rank waits to be killed as that training batch starts"""
    import time
    class WaitToBeKilled(Callback):
        def before_batch(self):
            if self.training and self.train_iter == stop_at: Path(disk, f"at{rank_distrib()}").touch(); time.sleep(300)
    (Path(disk)/'shm').mkdir(exist_ok=True)  # this node's memory, as a tmpfs is there before the run
    learn = synth_learner(n=256, path=Path(disk), seed=1)
    ckpt = CheckpointCallback(memory_every_iters=4, memory_dir=Path(disk)/'shm')
    with learn.distrib_ctx(): learn.fit(2, 0.1, cbs=[ckpt, WaitToBeKilled()])
    return dict(node=node_rank_distrib(), resumed_from=ckpt.resumed_from, tier=ckpt.resumed_tier,
                weights=[p.detach().flatten().tolist() for p in learn.model.parameters()])
