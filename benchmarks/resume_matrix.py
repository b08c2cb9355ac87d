"""Exact resume, measured: callback sets x random SIGKILLs of the whole run, 2 ranks under torchrun, each resumed run
compared with an uninterrupted one (final weights, `recorder.values`/`losses`/`lrs`, the epoch early stopping fired
at, every callback's final state).

    .venv-latest/bin/python benchmarks/resume_matrix.py [--trials 5] [--set NAME ...]

Prints one row per callback set and exits 1 if any resumed run differs. Not part of the test suite (a few minutes);
`tests/test_checkpoint_resume.py` runs one set of it."""
import sys, time, random, hashlib, argparse, tempfile
from pathlib import Path
import torch
from fastai.basics import *
from fastai.callback.all import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.train_state import callback_state
from ddp_safe_fastai.testing import synth_learner
from ddp_safe_fastai.launch import torchrun_ranks

class Jitter(Callback):
    "Random augmentation: noise on every training batch, from this rank's torch RNG"
    def before_batch(self):
        if self.training: self.learn.xb = (self.xb[0] + 0.1*torch.randn_like(self.xb[0]),)

class Slow(Callback):
    "Each epoch lasts at least 0.4 s, so that a kill at a random moment lands inside the run"
    def before_epoch(self): self.t = time.monotonic()
    def after_epoch(self): time.sleep(max(0, 0.4 - (time.monotonic() - self.t)))

class SlowStart(Callback):
    "A user callback with a state: the learning rate grows over the first 30 training batches of the run"
    def __init__(self): self.seen = 0
    def before_batch(self):
        if self.training: self.opt.set_hyper('lr', 0.05*min(1, (self.seen+1)/30))
    def after_batch(self):
        if self.training: self.seen += 1
    def state_dict(self): return dict(seen=self.seen)
    def load_state_dict(self, state): self.seen = state['seen']

def one_cycle(learn):
    learn.fit_one_cycle(8, 0.05, cbs=[SafeSaveModelCallback(), CheckpointCallback(), Jitter(), Slow()])

def trackers(learn):  # tuned so that both act: the LR is cut, then the fit stops before its 12 epochs
    learn.fit(12, 0.05, cbs=[EarlyStoppingCallback(min_delta=0.05, patience=3), ReduceLROnPlateau(min_delta=0.05, patience=1),
                             SafeSaveModelCallback(), CheckpointCallback(), Jitter(), Slow()])

def accumulate(learn):
    learn.fit(8, cbs=[GradientAccumulation(24), SlowStart(), CheckpointCallback(), Jitter(), Slow()])

def two_fits(learn):  # as fine_tune does: one fit, then another with the same callbacks
    cbs = [SafeSaveModelCallback(), CheckpointCallback(), Jitter(), Slow()]
    learn.fit(3, 0.05, cbs=cbs)
    learn.fit_one_cycle(5, 0.02, cbs=cbs)

class SlowBatch(Callback):
    "Each training batch lasts at least 25 ms, so that a kill at a random moment lands inside an epoch"
    def before_batch(self): self.t = time.monotonic()
    def after_batch(self):
        if self.training: time.sleep(max(0, 0.025 - (time.monotonic() - self.t)))

def within_epoch(learn):  # checkpoints every 4 batches: a kill resumes inside the epoch it hit
    learn.fit_one_cycle(4, 0.05, cbs=[SafeSaveModelCallback(), CheckpointCallback(every_iters=4), Jitter(), SlowBatch()])

SETS = dict(one_cycle=one_cycle, trackers=trackers, accumulate=accumulate, two_fits=two_fits, within_epoch=within_epoch)

def _sha(model):
    h = hashlib.sha256()
    for v in model.state_dict().values(): h.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

def train(root, name):
    "One rank's run of the callback set `name` in `root`: what it ends with"
    learn = synth_learner(n=256, path=root, seed=3)
    learn.model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    with learn.distrib_ctx(): SETS[name](learn)
    rec = learn.recorder
    return dict(sha=_sha(learn.model), values=[list(map(float, v)) for v in rec.values], losses=[float(l) for l in rec.losses],
                lrs=[float(l) for l in rec.lrs], stopped_at=len(rec.values),
                states=[(type(cb).__name__, repr(callback_state(cb))) for cb in learn.cbs if callback_state(cb) is not None])

def run(root, name, kill_when=None, ranks=torchrun_ranks):
    outs = ranks(train, str(root), name, init=False, timeout=300, kill_when=kill_when)
    if outs is None: return None
    bad = [o for o in outs if not o.ok]
    if bad: raise RuntimeError(f"{name}: {bad}")
    return [o.value for o in outs]

def killer(root, after=None, seen=None):
    "Kill once the first checkpoint exists and `after` more seconds have passed (never if `after` is None)"
    seen = ifnone(seen, [])
    def check():
        if not seen and (Path(root)/'models/ckpt/latest').exists(): seen.append(time.monotonic())
        return after is not None and bool(seen) and time.monotonic() - seen[0] >= after
    return check

def uninterrupted(name, ranks=torchrun_ranks):
    "The results of an uninterrupted run, and how long it ran after its first checkpoint"
    seen = []
    with tempfile.TemporaryDirectory() as d: full = run(d, name, killer(d, seen=seen), ranks)
    return full, time.monotonic() - seen[0]

def trial(name, full, seconds, rng, ranks=torchrun_ranks):
    "Kill a run of `name` at a random moment, run it again; the keys of the result that differ from `full`"
    with tempfile.TemporaryDirectory() as d:
        after = rng.uniform(0, 0.9*seconds)
        killed = run(d, name, killer(d, after), ranks) is None
        res = run(d, name, ranks=ranks)
    return killed, after, [k for k in full[0] if any(r[k] != f[k] for r,f in zip(res, full))]

def main(argv=None, ranks=torchrun_ranks): # `ranks`: how the 2 ranks of each run start (a test passes a pool of them)
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--trials', type=int, default=5)
    p.add_argument('--set', action='append', choices=list(SETS))
    p.add_argument('--seed', type=int, default=0)
    a = p.parse_args(argv)
    rng, failed = random.Random(a.seed), 0
    print("| callback set | epochs of the last fit, uninterrupted | trials | killed mid-run | kill times (s after the first checkpoint) | identical to the uninterrupted run |")
    print("|---|---:|---:|---:|---|---:|")
    for name in a.set or SETS:
        full,seconds = uninterrupted(name, ranks)
        rows = [trial(name, full, seconds, rng, ranks) for _ in range(a.trials)]
        same = sum(not diff for _,_,diff in rows)
        failed += a.trials - same + sum(not k for k,_,_ in rows)  # a kill that came after the end tests nothing
        diffs = '; '.join(f"kill at {t:.1f}s: {diff}" for _,t,diff in rows if diff)
        print(f"| {name} | {full[0]['stopped_at']} | {a.trials} | {sum(k for k,_,_ in rows)} | {', '.join(f'{t:.1f}' for _,t,_ in rows)} | {same}"
              + (f" ({diffs})" if diffs else '') + " |", flush=True)
    return int(failed > 0)

if __name__ == '__main__': sys.exit(main())
