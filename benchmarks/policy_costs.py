"""What `CheckpointCallback`'s policies cost, measured side by side in one run (issue 35): the disk's room checked before
a save, against the save it guards; the clock decision of `every_minutes`, against a fit without it (the interval
never passed: the cost of deciding alone), on 2 ranks under torchrun on CPU.

    .venv-latest/bin/python benchmarks/policy_costs.py"""
import time, statistics, tempfile
from pathlib import Path
import torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.files import check_room, state_bytes, atomic_torch_save
from ddp_safe_fastai.testing import synth_learner
from ddp_safe_fastai.launch import torchrun_ranks

def median_seconds(f, reps):
    f(); ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

def room_check(d, mb=50, reps=20):
    "Seconds of the room check of a state of `mb` MB in 200 tensors, and of its durable save"
    state = {f"w{i}": torch.randn(mb*2**20//4//200) for i in range(200)}
    f = Path(d)/'state.pth'
    check = median_seconds(lambda: check_room(f, state_bytes(state)), reps)
    save = median_seconds(lambda: atomic_torch_save(state, f), 5)
    return check, save

def clock_fits(root, reps=5):
    "On each rank: the median seconds a training batch takes, plain and with `every_minutes` (never due), in turns"
    learn = synth_learner(n=2048, path=Path(root))
    class Batches(Callback):  # from one training batch's start to the next's: every callback's work included
        def before_train(self): self.t = None
        def before_fit(self): self.times = []
        def before_batch(self):
            if not self.training: return
            now = time.perf_counter()
            if self.t is not None: self.times.append(now - self.t)
            self.t = now
    got = {'plain': [], 'every_minutes': []}
    for i in range(2*reps):
        key = ['plain', 'every_minutes'][i % 2]
        cbs = [CheckpointCallback(fname=f'c{i}', resume=False, every_epoch=100, every_minutes=10**6 if key == 'every_minutes' else None), Batches()]
        with learn.distrib_ctx(): learn.fit(1, 1e-3, cbs=cbs)
        got[key].append(statistics.median(cbs[1].times))
    return {k: statistics.median(v) for k,v in got.items()}

if __name__ == '__main__':
    with tempfile.TemporaryDirectory() as d:
        check, save = room_check(d)
        print(f"room check of a 50 MB state (200 tensors): {check*1e6:.0f} us, {check/save:.5f} of its durable save ({save*1e3:.0f} ms)")
        outcomes = torchrun_ranks(clock_fits, d, init=False, timeout=600)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        r0, r1 = (o.value for o in outcomes)
        for r,res in ((0, r0), (1, r1)):
            print(f"rank {r}: median training batch {res['plain']*1e3:.3f} ms plain, {res['every_minutes']*1e3:.3f} ms with "
                  f"every_minutes (the decision, never due): {res['every_minutes']/res['plain']:.3f}x")
