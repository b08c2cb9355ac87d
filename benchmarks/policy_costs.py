"""What `CheckpointCallback`'s policies cost, measured side by side in one run (issue 35): the disk's room checked before
a save, against the save it guards; the manifest's checksums and the comparison of linked weights, against the way they
were made before; a new checkpoint's file written into memory the kernel finds anew, against one written into the
cached pages of the checkpoint about to be rotated out, given back first; the clock decision of `every_minutes`, against
a fit without it (the interval never passed: the cost of deciding alone); an epoch with `SafeSaveModelCallback` (a new
best every epoch) and `CheckpointCallback` (every epoch) on a 50 MB model, against a plain one; on 2 ranks under
torchrun on CPU.

    .venv-latest/bin/python benchmarks/policy_costs.py [--both]

`--both`: the two callbacks against a plain fit alone (the figure of the weights written once), each fit in processes of
its own, in pairs. glibc's threshold for mapping large blocks is fixed there: left to move, it made a rank's page faults
in one same fit anything from 0.9 to 3.8 million, and its time the same (a third of it is the kernel's)."""
import sys, time, resource, statistics, tempfile
from pathlib import Path
import torch
from torch import nn
from fastai.basics import Callback, Datasets, Learner, MSELossFlat
from ddp_safe_fastai.all import *
from ddp_safe_fastai.files import check_room, state_bytes, atomic_torch_save
from ddp_safe_fastai.testing import synth_learner, Rows
from ddp_safe_fastai.persist import flush_saves
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

def checksums_and_comparison(d, reps=7):
    "Seconds of the manifest's checksums of a checkpoint (150 MB): each file read into new memory chunk by chunk, into one reused buffer, and from the CRC-32s torch recorded (`manifest_checksum`, nothing read again); and of the comparison of the best model's weights (50 MB) with a checkpoint's, byte by byte and 8 bytes at a time"
    from ddp_safe_fastai.checkpoint_dir import checksum, manifest_checksum, _checksums
    from ddp_safe_fastai.files import _alike
    torch.set_num_threads(1)  # as on a rank under torchrun
    files = [Path(d)/'state.pth', Path(d)/'model.pth']
    weights = model_learner(Path(d)).model.state_dict()
    atomic_torch_save({k: torch.randn(2*v.numel()) for k,v in weights.items()}, files[0])  # as Adam's two moments
    atomic_torch_save(weights, files[1])
    def new_chunks(path, chunk=2**24):  # each chunk read into memory of its own
        h = _checksums['crc32']()
        with open(path, 'rb') as f:
            while b := f.read(chunk): h.update(b)
        return h.hexdigest()
    assert [manifest_checksum(f) for f in files] == [checksum(f) for f in files] == [new_chunks(f) for f in files]
    loaded = torch.load(files[1], map_location='cpu', mmap=True, weights_only=True)
    byte_view = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)
    return dict(chunks=median_seconds(lambda: [new_chunks(f) for f in files], reps),
                buffer=median_seconds(lambda: [checksum(f) for f in files], reps),
                recorded=median_seconds(lambda: [manifest_checksum(f) for f in files], reps),
                bytes=median_seconds(lambda: all(torch.equal(byte_view(loaded[k]), byte_view(v)) for k,v in weights.items()), reps),
                words=median_seconds(lambda: _alike(loaded, weights), reps))

def pages_given_back(root, fits=4, epochs=6):
    "On rank 0: the median wall and CPU seconds of a checkpoint's commit in the writer thread (epochs 3 on, when one is rotated out), with the rotated-out checkpoint's pages given back first, and without (`give_back_pages_of_rotated` left out), in turns"
    learn,got = model_learner(Path(root)),{'given back': [], 'not given back': []}
    commit,give_back = CheckpointDir.commit,CheckpointDir.give_back_pages_of_rotated
    def timed_commit(self, *args, **kwargs):
        t,c = time.perf_counter(),time.thread_time()
        commit(self, *args, **kwargs)
        times.append((time.perf_counter() - t, time.thread_time() - c))
    CheckpointDir.commit = timed_commit
    try:
        for i in range(fits):
            key,times = ['given back', 'not given back'][i % 2],[]
            CheckpointDir.give_back_pages_of_rotated = give_back if key == 'given back' else lambda self, keep=(): None
            with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=CheckpointCallback(fname=f'pages{i}', resume=False))
            got[key].extend(times[2:])  # the first two have nothing to rotate out
    finally: CheckpointDir.commit,CheckpointDir.give_back_pages_of_rotated = commit,give_back
    return {k: tuple(statistics.median(x[j] for x in v) for j in (0, 1)) if v else None for k,v in got.items()}

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

def model_learner(root, n=2560, dim=1024, hidden=3072):
    "A regression `Learner` with a model of 50 MB (12.6 M parameters), the same on every rank"
    torch.manual_seed(0)
    x = torch.randn(n+256, dim); y = x[:, :1] + 0.1*torch.randn(n+256, 1)
    dsets = Datasets(range(n+256), [[Rows(x)], [Rows(y)]], splits=[list(range(n)), list(range(n, n+256))])
    dls = dsets.dataloaders(bs=64, device='cpu', path=root, num_workers=0)
    model = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    return Learner(dls, model, loss_func=MSELossFlat(), path=root)

def both_saves(i):
    "The two callbacks measured, named for fit `i`: the best model saved every epoch (a new best each time) and a checkpoint every epoch"
    return [SafeSaveModelCallback(comp=lambda a,b: True, fname=f'best{i}'), CheckpointCallback(fname=f'c{i}', resume=False)]

class FitClock(Callback):
    "When each epoch starts (wall clock, and the CPU time of all the process's threads), and when the fit ends, after every other callback's `after_fit` (the last write, the reload)"
    order = 10_000
    def before_fit(self): self.starts = []
    def before_epoch(self): self.starts.append((time.perf_counter(), time.process_time()))
    def after_fit(self): self.end = time.perf_counter()

def both_callbacks(root, reps=4, epochs=4, arms=('plain', 'checkpoint', 'both')):
    "On each rank, per arm: the median seconds of an epoch and the CPU seconds of its process (its saves included, the last epoch left out), and of a whole fit; plain, a checkpoint every epoch, and the best model too (a new best every epoch), in turns"
    learn,clock = model_learner(Path(root)),FitClock()
    cbs = {'plain': lambda i: [],
           'checkpoint': lambda i: [CheckpointCallback(fname=f'c{i}', resume=False)],
           'both': both_saves}
    got = {k: ([], [], []) for k in arms}
    for i in range(reps*len(arms) + 1):
        key = arms[i % len(arms)]
        with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=[*cbs[key](i), clock])
        if i == 0: continue  # the first fit warms up
        s = clock.starts
        got[key][0].extend(b[0]-a[0] for a,b in zip(s, s[1:])); got[key][1].extend(b[1]-a[1] for a,b in zip(s, s[1:]))
        got[key][2].append(clock.end - s[0][0])
    return {k: tuple(map(statistics.median, v)) for k,v in got.items()}

def fresh_fit(root, arm, i, epochs=4):
    "On each rank of new processes: the wall seconds of one fit (after a warm-up epoch, which saves nothing: the first save starts the writer thread in the fit), plain or with both callbacks, and the process's minor page faults in it"
    learn,clock = model_learner(Path(root)),FitClock()
    with learn.distrib_ctx(): learn.fit(1, 1e-4)
    cbs = both_saves(i) if arm == 'both' else []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=[*cbs, clock])
    return clock.end - clock.starts[0][0],resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

def fresh_pairs(root, pairs=6):
    "Pairs of fits, plain and with both callbacks, each in new processes under torchrun, in turns (plain first, then both first); glibc's mmap threshold fixed at its first value (128 KiB)"
    env,got = {'MALLOC_MMAP_THRESHOLD_': str(128*1024)},[]
    for i in range(pairs):
        fits = {}
        for arm in (('plain', 'both') if i % 2 == 0 else ('both', 'plain')):
            with tempfile.TemporaryDirectory(dir=root) as d:  # each fit on a disk and page cache without the last ones' files
                outcomes = torchrun_ranks(fresh_fit, d, arm, i, init=False, timeout=600, env=env)
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            fits[arm] = [o.value for o in outcomes]
        got.append(fits)
    return got

def report_pairs(got):
    "Print each pair's ratio of rank 0's fit times (the ranks' agree within milliseconds: they meet every batch), their median, and the page faults"
    ratios = [p['both'][0][0]/p['plain'][0][0] for p in got]
    plain = [p['plain'][0][0] for p in got]
    print(f"both callbacks against a plain fit, {len(got)} pairs of fits in new processes: median {statistics.median(ratios):.3f}x "
          f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)}); the plain fit itself {min(plain):.2f} to {max(plain):.2f} s")
    for arm in ('plain', 'both'):
        print(f"  {arm}: minor page faults in the fit, rank 0 and rank 1: " + ", ".join(f"{p[arm][0][1]}/{p[arm][1][1]}" for p in got))

class SavesClock(Callback):
    "At each epoch's end: the wall and CPU seconds (all the process's threads) from before the first save (`start`, ordered before it) to the last write flushed"
    def __init__(self, order, start=None): self.order,self.start,self.times = order,start,[]
    def after_epoch(self):
        if self.start is None: self.t = (time.perf_counter(), time.process_time()); return
        flush_saves()
        self.times.append((time.perf_counter() - self.start.t[0], time.process_time() - self.start.t[1]))

def saves_at_epoch_end(root, fits=3, epochs=4):
    "On each rank: the median wall and CPU seconds of the two callbacks' saves at one epoch's end, written through (not overlapped with training)"
    learn = model_learner(Path(root))
    start = SavesClock(SafeSaveModelCallback.order-1)
    end = SavesClock(CheckpointCallback.order+1, start)
    for i in range(fits):
        cbs = [*both_saves(i), start, end]
        with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=cbs)
    return tuple(statistics.median(t[k] for t in end.times[epochs:]) for k in (0, 1))  # the first fit warms up

def report_both(outcomes):
    for r,o in enumerate(outcomes):
        (pe, pc, pf) = o.value['plain']
        print(f"rank {r}, 50 MB model, plain: epoch {pe:.3f} s ({pc:.3f} s of CPU), whole fit {pf:.2f} s; " + "; ".join(
              f"{k}: epoch {e:.3f} s ({e/pe:.3f}x; CPU {c:.3f} s, {c-pc:+.3f} s), whole fit {f:.2f} s ({f/pf:.3f}x)"
              for k,(e, c, f) in o.value.items() if k != 'plain'))

if __name__ == '__main__':
    if '--both' in sys.argv:  # the measure of the two callbacks alone, fits in processes of their own
        with tempfile.TemporaryDirectory() as d: report_pairs(fresh_pairs(d))
        sys.exit()
    with tempfile.TemporaryDirectory() as d:
        check, save = room_check(d)
        print(f"room check of a 50 MB state (200 tensors): {check*1e6:.0f} us, {check/save:.5f} of its durable save ({save*1e3:.0f} ms)")
        c = checksums_and_comparison(d)
        print(f"the manifest's checksums of a checkpoint (150 MB): {c['chunks']*1e3:.1f} ms read chunk by chunk into new memory, "
              f"{c['buffer']*1e3:.1f} ms into one reused buffer: {c['buffer']/c['chunks']:.2f}x, {c['recorded']*1e3:.2f} ms from the CRC-32s torch recorded: "
              f"{c['recorded']/c['buffer']:.3f}x of the reused buffer's; the best model's weights (50 MB) compared "
              f"with a checkpoint's: {c['bytes']*1e3:.1f} ms byte by byte, {c['words']*1e3:.1f} ms 8 bytes at a time: {c['words']/c['bytes']:.2f}x")
        outcomes = torchrun_ranks(pages_given_back, d, init=False, timeout=900)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        (gw, gc),(nw, nc) = outcomes[0].value['given back'],outcomes[0].value['not given back']
        print(f"a checkpoint's commit (150 MB, one rotated out), in the writer thread: {nw*1e3:.0f} ms ({nc*1e3:.0f} ms of CPU) written into "
              f"memory the kernel finds anew, {gw*1e3:.0f} ms ({gc*1e3:.0f} ms of CPU) into the pages of the rotated-out checkpoint, given back first: {gc/nc:.2f}x the CPU")
        outcomes = torchrun_ranks(clock_fits, d, init=False, timeout=600)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        r0, r1 = (o.value for o in outcomes)
        for r,res in ((0, r0), (1, r1)):
            print(f"rank {r}: median training batch {res['plain']*1e3:.3f} ms plain, {res['every_minutes']*1e3:.3f} ms with "
                  f"every_minutes (the decision, never due): {res['every_minutes']/res['plain']:.3f}x")
        outcomes = torchrun_ranks(both_callbacks, d, init=False, timeout=1200)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        report_both(outcomes)
