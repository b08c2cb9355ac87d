"""What `CheckpointCallback`'s policies cost, measured side by side in one run (issue 35): the disk's room checked before
a save, against the save it guards; the manifest's checksums and the comparison of linked weights, against the way they
were made before; a new checkpoint's files written around the page cache, against through it into the cached pages of
the checkpoint about to be rotated out, given back first; the clock decision of `every_minutes`, against
a fit without it (the interval never passed: the cost of deciding alone); an epoch with `SafeSaveModelCallback` (a new
best every epoch) and `CheckpointCallback` (every epoch) on a 50 MB model, against a plain one; on 2 ranks under
torchrun on CPU.

    .venv-latest/bin/python benchmarks/policy_costs.py [--both]

`--both`: the two callbacks against a plain fit alone (the figure of the weights written once), each fit in processes of
its own, in runs of three: plain, both, and both with the checkpoint's files written through the page cache. glibc's threshold for mapping large blocks is fixed there: left to move, it made a rank's page faults
in one same fit anything from 0.9 to 3.8 million, and its time the same (a third of it is the kernel's)."""
import os, sys, time, resource, statistics, tempfile, threading
from pathlib import Path
import torch
from torch import nn
from fastai.basics import Callback, Datasets, Learner, MSELossFlat
from ddp_safe_fastai.all import *
from ddp_safe_fastai.files import check_room, state_bytes, atomic_torch_save
from ddp_safe_fastai.testing import synth_learner, Rows
from ddp_safe_fastai.persist import flush_saves
from ddp_safe_fastai.launch import torchrun_ranks
from ddp_safe_fastai import checkpoint_dir

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
    from ddp_safe_fastai.checksums import checksum, manifest_checksum, checksum_types
    from ddp_safe_fastai.files import _alike
    torch.set_num_threads(1)  # as on a rank under torchrun
    files = [Path(d)/'state.pth', Path(d)/'model.pth']
    weights = model_learner(Path(d)).model.state_dict()
    atomic_torch_save({k: torch.randn(2*v.numel()) for k,v in weights.items()}, files[0])  # as Adam's two moments
    atomic_torch_save(weights, files[1])
    def new_chunks(path, chunk=2**24):  # each chunk read into memory of its own
        h = checksum_types['crc32']()
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

def through_the_cache(save):
    "`save` (an `atomic_torch_save`) that writes through the page cache whatever it is asked: as `CheckpointDir` wrote a checkpoint's files before `files.DirectFile`"
    def save_through(obj, file, durable=True, around_cache=False, **kwargs): return save(obj, file, durable, **kwargs)
    return save_through

def commit_around_cache(root, fits=4, epochs=6):
    "On rank 0: the median wall and CPU seconds of a checkpoint's commit in the writer thread (epochs 3 on, when one is rotated out), and the process's CPU seconds a fit; its files written around the page cache (as `CheckpointDir` writes a durable one), and through it into the rotated-out checkpoint's pages given back first (as it wrote them before), in turns"
    learn,got = model_learner(Path(root)),{'around': [], 'through': []}
    commit,save = CheckpointDir.commit,checkpoint_dir.atomic_torch_save
    def timed_commit(self, *args, **kwargs):
        t,c = time.perf_counter(),time.thread_time()
        commit(self, *args, **kwargs)
        times.append((time.perf_counter() - t, time.thread_time() - c))
    CheckpointDir.commit = timed_commit
    try:
        for i in range(fits):
            key,times = ['around', 'through'][i % 2],[]
            checkpoint_dir.atomic_torch_save = save if key == 'around' else through_the_cache(save)
            r = resource.getrusage(resource.RUSAGE_SELF)
            with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=CheckpointCallback(fname=f'commit{i}', resume=False))
            q = resource.getrusage(resource.RUSAGE_SELF)
            got[key].append((times[2:], q.ru_utime - r.ru_utime, q.ru_stime - r.ru_stime))  # the first two commits have nothing to rotate out
    finally: CheckpointDir.commit,checkpoint_dir.atomic_torch_save = commit,save
    commits = lambda v: [x for f in v for x in f[0]]  # none on a rank that does not write
    return {k: dict(commit=tuple(statistics.median(x[j] for x in commits(v)) for j in (0, 1)) if commits(v) else None,
                    user=statistics.median(f[1] for f in v), sys=statistics.median(f[2] for f in v)) for k,v in got.items()}

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

def thread_cpu(threads):
    "CPU seconds (user and system, as the kernel counts them) of `threads`, Python threads of this process"
    hz,total = os.sysconf('SC_CLK_TCK'),0.
    for t in threads:
        try: f = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(')', 1)[1].split()
        except (FileNotFoundError, TypeError): continue  # ended, or never started
        total += (int(f[11]) + int(f[12]))/hz
    return total

def background_threads(): return [t for t in threading.enumerate() if t.name.startswith('ddp_safe_')]  # the writer and the copier

def fresh_fit(root, arm, i, epochs=4):
    "On each rank of new processes: the wall seconds of one fit (after a warm-up epoch, which saves nothing: the first save starts the writer thread in the fit), plain or with both callbacks ('both', or 'through': the checkpoint's files through the page cache); the process's minor page faults in it, and the CPU seconds of the thread that trains and of the saves' threads"
    learn,clock = model_learner(Path(root)),FitClock()
    with learn.distrib_ctx(): learn.fit(1, 1e-4)
    if arm == 'through': checkpoint_dir.atomic_torch_save = through_the_cache(checkpoint_dir.atomic_torch_save)
    cbs = [] if arm == 'plain' else both_saves(i)
    faults,main = resource.getrusage(resource.RUSAGE_SELF).ru_minflt,time.thread_time()  # the fit runs in this thread
    with learn.distrib_ctx(): learn.fit(epochs, 1e-4, cbs=[*cbs, clock])
    return (clock.end - clock.starts[0][0], resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
            time.thread_time() - main, thread_cpu(background_threads()))

_fresh_arms = ('plain', 'both', 'through')

def fresh_runs(root, runs=6):
    "Runs of three fits, each in new processes under torchrun: plain, both callbacks, both with the checkpoint through the page cache, the first of each run in turns; glibc's mmap threshold fixed at its first value (128 KiB)"
    env,got = {'MALLOC_MMAP_THRESHOLD_': str(128*1024)},[]
    for i in range(runs):
        fits = {}
        for arm in _fresh_arms[i % 3:] + _fresh_arms[:i % 3]:
            with tempfile.TemporaryDirectory(dir=root) as d:  # each fit on a disk and page cache without the last ones' files
                outcomes = torchrun_ranks(fresh_fit, d, arm, i, init=False, timeout=600, env=env)
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            fits[arm] = [o.value for o in outcomes]
        got.append(fits)
    return got

def report_runs(got):
    "Print each run's ratios of rank 0's fit times to the plain fit's (the ranks' agree within milliseconds: they meet every batch), their medians, the ratio of the median fits, and the page faults"
    plain = [r['plain'][0][0] for r in got]
    print(f"both callbacks against a plain fit, {len(got)} runs of three fits, each in new processes; the plain fit itself {min(plain):.2f} to {max(plain):.2f} s")
    for arm,what in (('both', 'the checkpoint around the page cache'), ('through', 'the checkpoint through the page cache')):
        ratios,fit,plain_fit = [r[arm][0][0]/r['plain'][0][0] for r in got],statistics.median(r[arm][0][0] for r in got),statistics.median(plain)
        print(f"  {what}: median {statistics.median(ratios):.3f}x (runs: {', '.join(f'{x:.3f}' for x in ratios)}); median fit "
              f"{fit:.2f} s against {plain_fit:.2f} s: {fit/plain_fit:.3f}x")
    for arm in _fresh_arms:
        print(f"  {arm}: minor page faults in the fit, rank 0 and rank 1: " + ", ".join(f"{r[arm][0][1]}/{r[arm][1][1]}" for r in got))
    for arm in _fresh_arms:
        print(f"  {arm}: CPU seconds on rank 0 in the fit, median: main thread {statistics.median(r[arm][0][2] for r in got):.2f} "
              f"(runs {min(r[arm][0][2] for r in got):.2f} to {max(r[arm][0][2] for r in got):.2f}), the saves' threads "
              f"{statistics.median(r[arm][0][3] for r in got):.2f}")

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
        with tempfile.TemporaryDirectory() as d: report_runs(fresh_runs(d))
        sys.exit()
    with tempfile.TemporaryDirectory() as d:
        check, save = room_check(d)
        print(f"room check of a 50 MB state (200 tensors): {check*1e6:.0f} us, {check/save:.5f} of its durable save ({save*1e3:.0f} ms)")
        c = checksums_and_comparison(d)
        print(f"the manifest's checksums of a checkpoint (150 MB): {c['chunks']*1e3:.1f} ms read chunk by chunk into new memory, "
              f"{c['buffer']*1e3:.1f} ms into one reused buffer: {c['buffer']/c['chunks']:.2f}x, {c['recorded']*1e3:.2f} ms from the CRC-32s torch recorded: "
              f"{c['recorded']/c['buffer']:.3f}x of the reused buffer's; the best model's weights (50 MB) compared "
              f"with a checkpoint's: {c['bytes']*1e3:.1f} ms byte by byte, {c['words']*1e3:.1f} ms 8 bytes at a time: {c['words']/c['bytes']:.2f}x")
        outcomes = torchrun_ranks(commit_around_cache, d, init=False, timeout=900)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        a,t = outcomes[0].value['around'],outcomes[0].value['through']
        print(f"a checkpoint's commit (150 MB, one rotated out), in the writer thread: {t['commit'][0]*1e3:.0f} ms ({t['commit'][1]*1e3:.0f} ms of CPU) "
              f"through the page cache, into the rotated-out checkpoint's pages given back first; {a['commit'][0]*1e3:.0f} ms "
              f"({a['commit'][1]*1e3:.0f} ms of CPU) around it: {a['commit'][1]/t['commit'][1]:.2f}x the CPU. Rank 0's process, a fit of 6 epochs "
              f"checkpointed each: {t['user']:.2f} s user and {t['sys']:.2f} s system through the cache, {a['user']:.2f} s and {a['sys']:.2f} s around it")
        outcomes = torchrun_ranks(clock_fits, d, init=False, timeout=600)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        r0, r1 = (o.value for o in outcomes)
        for r,res in ((0, r0), (1, r1)):
            print(f"rank {r}: median training batch {res['plain']*1e3:.3f} ms plain, {res['every_minutes']*1e3:.3f} ms with "
                  f"every_minutes (the decision, never due): {res['every_minutes']/res['plain']:.3f}x")
        outcomes = torchrun_ranks(both_callbacks, d, init=False, timeout=1200)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        report_both(outcomes)
