"""What the two callbacks cost an epoch of a GPU model: a torchvision ResNet-50 (mixed precision, batch 64, synthetic
224 px images held on the GPU) fitted under `torchrun --nproc_per_node=1` (an nccl group made by fastai's `distrib_ctx`),
plain, with `SafeSaveModelCallback` (a new best every epoch) and `CheckpointCallback` (a checkpoint every epoch:
`both`), and with those and a checkpoint into node memory every N batches (`memory:N`; `memory` is every 100), in turns in one run. An epoch is sized to about `--epoch-seconds` from a short timed fit first. Prints one JSON line and
writes it to `--out`.

    python benchmarks/gpu_fit.py --epoch-seconds 30 --epochs 3 --arms plain,both,memory:1,memory:10 --out gpu_fit.json"""
import argparse, json, statistics, sys, time
from pathlib import Path
import torch
from torch import nn
from fastai.basics import Callback, DataLoader, DataLoaders, Learner, CrossEntropyLossFlat
from fastai.callback.fp16 import MixedPrecision
from ddp_safe_fastai.all import *
from ddp_safe_fastai.launch import torchrun_ranks

class Images(nn.Module):
    "Bytes of an image batch to the floats the network takes"
    def forward(self, x): return x.float().div_(255)

def gpu_dls(n_train, n_valid=640, pool=512, bs=64):
    "DataLoaders of `n_train` and `n_valid` items drawn from `pool` random uint8 images on the GPU (10 classes), batched on the GPU"
    g = torch.Generator(device='cuda').manual_seed(0)
    xs = torch.randint(0, 256, (pool, 3, 224, 224), dtype=torch.uint8, device='cuda', generator=g)
    ys = torch.randint(0, 10, (pool,), device='cuda', generator=g)
    batch = lambda idxs: (xs[torch.tensor(idxs, device='cuda') % pool], ys[torch.tensor(idxs, device='cuda') % pool])
    dl = lambda n, shuffle: DataLoader(range(n), bs=bs, shuffle=shuffle, drop_last=shuffle, num_workers=0,
                                       create_item=lambda i: i, create_batch=batch, device='cuda')
    return DataLoaders(dl(n_train, True), dl(n_valid, False), device='cuda')

def resnet_learner(root, n_train):
    from torchvision.models import resnet50
    torch.manual_seed(0)
    return Learner(gpu_dls(n_train), nn.Sequential(Images(), resnet50(num_classes=10)), loss_func=CrossEntropyLossFlat(),
                   path=Path(root), cbs=MixedPrecision())

class FitClock(Callback):
    "When each epoch starts, and when the fit ends, after every other callback's `after_fit` (the last writes, the reload)"
    order = 10_000
    def before_fit(self): self.starts = []
    def before_epoch(self): torch.cuda.synchronize(); self.starts.append(time.perf_counter())
    def after_fit(self): torch.cuda.synchronize(); self.end = time.perf_counter()

def arm_cbs(arm, i):
    "The callbacks of an arm, named for fit `i`"
    if arm == 'plain': return []
    kind,_,n = arm.partition(':')
    every = int(n or 100) if kind == 'memory' else None
    return [SafeSaveModelCallback(comp=lambda a,b: True, fname=f'best{i}'), CheckpointCallback(fname=f'c{i}', resume=False, memory_every_iters=every)]

def fits(root, epoch_seconds, epochs, arms, reps):
    "On the one rank: the epoch's size from a timed fit, then `reps` rounds of a fit per arm, in turns"
    probe, clock = resnet_learner(root, 64*100), FitClock()
    with probe.distrib_ctx(): probe.fit(2, 1e-3, cbs=clock)  # the first epoch warms cuDNN up; the second is timed
    per_batch = (clock.end - clock.starts[1]) / 110
    n_train = 64 * max(100, int(epoch_seconds / per_batch))
    learn = resnet_learner(root, n_train)
    got = {a: dict(epochs=[], fits=[]) for a in arms}
    for r in range(reps):
        for a in arms:
            i = r*len(arms) + arms.index(a)
            with learn.distrib_ctx(): learn.fit(epochs, 1e-3, cbs=[*arm_cbs(a, i), clock])
            s = clock.starts
            got[a]['epochs'].extend(b - a_ for a_, b in zip(s[1:], s[2:]))  # the first epoch of a fit left out
            got[a]['fits'].append(clock.end - s[0])
    med = {a: dict(epoch_s=statistics.median(v['epochs']), fit_s=statistics.median(v['fits']), n=len(v['epochs'])) for a,v in got.items()}
    return dict(card=torch.cuda.get_device_name(0), torch=torch.__version__, batches_per_epoch=n_train//64,
                seconds_per_batch=per_batch, arms=med, raw=got,
                **{f'{a}_epoch_ratio': med[a]['epoch_s']/med['plain']['epoch_s'] for a in arms if a != 'plain'},
                **{f'{a}_fit_ratio': med[a]['fit_s']/med['plain']['fit_s'] for a in arms if a != 'plain'})

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--epoch-seconds', type=float, default=60); p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--reps', type=int, default=1); p.add_argument('--arms', default='plain,both')
    p.add_argument('--root', default='/tmp/ddp_safe_gpu_fit'); p.add_argument('--out')
    a = p.parse_args()
    [o] = torchrun_ranks(fits, a.root, a.epoch_seconds, a.epochs, a.arms.split(','), a.reps, nproc=1, init=False, timeout=1800)
    if not o.ok: sys.exit(f"{o!r}\n{getattr(o, 'traceback', '')}")
    line = json.dumps(o.value)
    print(line)
    if a.out: Path(a.out).write_text(line)
