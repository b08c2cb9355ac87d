"""What the process does in the tests of CUDA (test_cuda.py): a fastai fit on one GPU under torchrun, its process group
nccl (NCCL takes one process per GPU: one rank on a machine of one GPU), checkpointed, resumed and loaded there"""
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import nn, Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.background import background_saves
from ddp_safe_fastai.reads import broadcast_bytes
from ddp_safe_fastai.testing import synth_learner

def _gpu_learner(root):
    "`synth_learner` with a BatchNorm layer (which `distrib_ctx` makes a `SyncBatchNorm` on CUDA), its data on the GPU"
    learn = synth_learner(path=Path(root))
    torch.manual_seed(0)
    learn.model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    learn.dls.device = torch.device('cuda', 0)
    return learn

def _opt_tensors(learn): return list(tensors_in(learn.opt.state_dict()['state']))
def _same(a, b): return len(a) == len(b) > 0 and all(torch.equal(x, y) for x,y in zip(a, b))  # bit for bit; none proves nothing
def _devices(tensors): return sorted({str(t.device) for t in tensors})

class Seen(Callback):
    "What the fit looked like from inside: the backend, the model's wrapping and device; at the first batch, the optimizer's state and the CUDA random state"
    order = CheckpointCallback.order + 1
    def __init__(self): self.seen = {}
    def before_train(self):
        if 'epoch' in self.seen: return
        m = self.learn.model
        self.seen.update(epoch=self.epoch, backend=dist.get_backend() if dist.is_initialized() else None, wrapped=type(m).__name__,
                         sync_bn=any(isinstance(l, nn.SyncBatchNorm) for l in m.modules()), device=str(next(m.parameters()).device),
                         opt=[t.clone() for t in _opt_tensors(self.learn)], cuda_rng=torch.cuda.get_rng_state())
    def after_fit(self): self.seen['cuda_rng_end'] = torch.cuda.get_rng_state()

def fit_resume_load(root, group):
    """Fit 2 epochs (best model and checkpoints), resume into a fresh Learner for a third, load the best checkpoint, the
    weights file onto dls that name another GPU; `group`: 'user' (made with nccl before the fit) or 'fastai' (left to distrib_ctx)"""
    if group == 'user': torch.cuda.set_device(0); dist.init_process_group('nccl')
    learn,first = _gpu_learner(root),Seen()
    with learn.distrib_ctx(): learn.fit(2, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback(resume=False, keep_best=1), first])
    saved = [t.clone() for t in _opt_tensors(learn)]
    torch.cuda.manual_seed(1234)  # the resume must bring back the checkpoint's CUDA random state, not this one
    again,second = _gpu_learner(root),Seen()
    with again.distrib_ctx(): again.fit(3, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback(), second])
    resumed = second.seen
    best = _gpu_learner(root); best.create_opt()
    with best.distrib_ctx(): name = best.load_checkpoint(best=True, with_opt=True); best.fit(1, 1e-2)  # a step with the loaded state
    best_opt = _devices(_opt_tensors(best))
    best.save('m'); best.dls.device = torch.device('cuda', 1); best.load('m')  # dls of a GPU this machine lacks
    return dict(first={k: v for k,v in first.seen.items() if k not in ('opt', 'cuda_rng')}, resumed_epoch=resumed['epoch'],
                same_opt=_same(saved, resumed['opt']), opt_devices=_devices(resumed['opt']), same_cuda_rng=torch.equal(first.seen['cuda_rng_end'], resumed['cuda_rng']),
                resumed_losses=[float(v[0]) for v in again.recorder.values], best=name,
                best_opt_devices=best_opt,
                stale_device_load=_devices([*best.model.parameters(), *_opt_tensors(best)]),
                broadcast=broadcast_bytes(b'ddp_safe') if dist.is_initialized() else None,
                pinned=background_saves.host_tensor(torch.ones(3, device='cuda')).is_pinned())

def notebook_flow(root):
    "fastai's notebook flow on the GPU: `distrib_ctx(in_notebook=True)` and the nccl group it needs; a save and load after the context"
    learn = _gpu_learner(root)
    with learn.distrib_ctx(in_notebook=True):
        learn.fit(1, 1e-2)
        backend = dist.get_backend() if dist.is_initialized() else None
    w = learn.model[0].weight.detach().clone()
    learn.save('after'); learn.model[0].weight.data.zero_(); learn.load('after')
    return dict(backend=backend, group_after=dist.is_initialized(), same=torch.equal(w, learn.model[0].weight), device=str(w.device))

def fit_alone(root):
    """One GPU, no launcher and no process group: a plain `learn.fit` with both callbacks, resumed into a fresh Learner,
    the best checkpoint loaded (where a load goes is then the dls' device, not a rank's)"""
    learn = _gpu_learner(root)
    learn.fit(2, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback(resume=False, keep_best=1)])
    saved = [t.clone() for t in _opt_tensors(learn)]
    again,second = _gpu_learner(root),Seen()
    again.fit(3, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback(), second])
    best = _gpu_learner(root); best.create_opt()
    name = best.load_checkpoint(best=True, with_opt=True); best.fit(1, 1e-2)
    return dict(group=dist.is_initialized(), device=second.seen['device'], resumed_epoch=second.seen['epoch'],
                same_opt=_same(saved, second.seen['opt']), opt_devices=_devices(second.seen['opt']), best=name,
                best_devices=_devices([*best.model.parameters(), *_opt_tensors(best)]))
