"""What each rank does in the tests of `distributed` (test_distributed.py): fastai's `distrib_ctx` fit on CPU, and
BatchNorm statistics per rank"""
from pathlib import Path
import torch, torch.distributed as dist
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from persist_scenarios import _learner

def ddp_fit(root, epochs=2):
    "Plain `with learn.distrib_ctx(): learn.fit(...)`, nothing else: final weights of each rank"
    learn = _learner(root)
    with learn.distrib_ctx(): learn.fit(epochs, 0.1)
    return dict(weights=learn.model.weight.flatten().tolist(), world=num_distrib(),
                backend=dist.get_backend() if dist.is_initialized() else None)

def batchnorm_fit(root):
    "A BatchNorm model trained in `distrib_ctx()` as fastai documents it, on CPU: each rank's running statistics after"
    learn = synth_learner(path=Path(root), seed=1)
    learn.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    with learn.distrib_ctx(): learn.fit(2, 0.1)  # sync_bn=True, fastai's default: SyncBatchNorm needs CUDA
    return dict(types=sorted({type(m).__name__ for m in learn.model.modules()}),
                stats=[b.tolist() for b in learn.model.buffers()])

def contexts_in_turn(root, n=3):
    "One Learner fitted in `n` `distrib_ctx`s in turn: the `DistributedTrainer`s it holds after them, its loaders' types, the weights"
    learn = synth_learner(path=Path(root))
    for _ in range(n):
        with learn.distrib_ctx(): learn.fit(1, 0.1)
    from fastai.distributed import DistributedTrainer
    return dict(trainers=sum(isinstance(c, DistributedTrainer) for c in learn.cbs), loaders=[type(d).__name__ for d in learn.dls.loaders],
                weights=learn.model.weight.flatten().tolist())
