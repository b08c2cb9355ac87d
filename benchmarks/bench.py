"""Benchmarks of ddp_safe_fastai, each figure a ratio measured side by side in one run (not part of the tests).

Run with `tools/bench.sh`. Prints one table per question and saves the plots to nbs/images/benchmarks.png."""
import os, sys, time, json, statistics, tempfile
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.persist import flush_saves, wait_for_copies
from ddp_safe_fastai.learner import step_tensors, save_learner
from ddp_safe_fastai.testing import synth_learner
from ddp_safe_fastai.launch import torchrun_ranks

MB = 2**20

def learner_of(nbytes, path):
    "A `Learner` whose model holds `nbytes` of float32 weights"
    learn = synth_learner(path=path)
    learn.model = nn.Sequential(nn.Linear(4, nbytes // 4 // 5))  # weight (n,4) + bias (n): 5 floats a row
    return learn

def fsync_path(f):
    fd = os.open(f, os.O_RDONLY); os.fsync(fd); os.close(fd)

def timed(f, reps, warm_up=True):
    "Median seconds of `f()` over `reps` runs, after an untimed one that pays for first touches (memory, disk blocks)"
    if warm_up: f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)

def in_turns(fs, reps, measure):
    "`measure(f)` for each of the named `fs`, `reps` rounds, in reverse order every other round so that drift in the machine hits all alike, every rank together; lists by name"
    for f in fs.values(): measure(f); distrib_barrier()  # untimed: first touches (memory, disk blocks)
    out = {k: [] for k in fs}
    for i in range(reps):
        for k in (list(fs) if i % 2 == 0 else list(fs)[::-1]):
            distrib_barrier()  # every rank starts each call together: a rank's time is the call's, not the others' lag
            out[k].append(measure(fs[k]))
    return out

def alternated(*fs, reps, sync=False):
    "Median seconds of each of `fs`, run in turns"
    def measure(f):
        flush_saves()       # untimed: a background write ends during the epoch that follows it
        if sync: os.sync()  # untimed: no run pays for the dirty pages of the one before
        t = time.perf_counter(); f(); return time.perf_counter() - t
    return tuple(statistics.median(v) for v in in_turns(dict(enumerate(fs)), reps, measure).values())

def paired(fa, fb, reps, sync=False): return alternated(fa, fb, reps=reps, sync=sync)

# ---- one process: the cost of the guard ----
def save_load_costs(sizes=(10*MB, 100*MB, 1024*MB)):
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for size in sizes:
            learn, reps = learner_of(size, d), (41 if size <= 10*MB else 15)
            state, raw = learn.model.state_dict(), Path(d)/'raw.pth'
            def raw_save(): torch.save(state, raw)
            def raw_save_fsync(): torch.save(state, raw); fsync_path(raw); fsync_path(d)
            def raw_load(): learn.model.load_state_dict(torch.load(raw, map_location='cpu'))
            r = dict(size_mb=size/MB)
            r['raw_save'],r['safe_save'] = paired(raw_save, lambda: learn.save('m', with_opt=False, durable=False), reps, True)
            r['raw_save_fsync'],r['safe_save_durable'] = paired(raw_save_fsync, lambda: learn.save('m', with_opt=False), reps, True)
            r['raw_load'],r['safe_load'] = paired(raw_load, lambda: learn.load('m', with_opt=False), reps)
            # the least a load into the model can cost: what every `torch.load` pays before the bytes (the zip's index,
            # the weights-only unpickler; the file mapped, not read), and one copy of the bytes into the model
            copy = {k: v.clone() for k,v in state.items()}
            r['load_fixed'],r['one_copy'] = paired(lambda: torch.load(Path(d)/'models/m.pth', mmap=True),
                                                   lambda: learn.model.load_state_dict(copy), reps)
            rows.append(r)
            del learn, state
    return rows

def disk_throughput(size=1024*MB, reps=3):
    "MB/s of `dd conv=fsync` and of a durable `Learner.save`, the same size, to the same disk, alternately"
    import subprocess
    with tempfile.TemporaryDirectory() as d:
        learn = learner_of(size, d)
        dd = lambda: subprocess.run(['dd', 'if=/dev/zero', f"of={d}/dd.bin", 'bs=1M', f"count={size//MB}", 'conv=fsync'],
                                    check=True, capture_output=True)
        save = lambda: learn.save('m', with_opt=False)
        t_dd,t_save,t_no_crc = alternated(dd, save, partial(without_crc32s, save), reps=reps, sync=True)
        nbytes = os.path.getsize(Path(d)/'models/m.pth')
        return dict(size_mb=size/MB, dd=size/MB/t_dd, save=nbytes/MB/t_save, no_crc=nbytes/MB/t_no_crc)

def without_crc32s(f):
    "`f()` with torch.save computing no CRC-32s (a global setting of torch; the library leaves it as it is): what they cost"
    from torch.utils.serialization import config
    old,config.save.compute_crc32 = config.save.compute_crc32,False
    try: f()
    finally: config.save.compute_crc32 = old

def checksum_costs(size=128*MB, reps=5):
    "Seconds to checksum a checkpoint file as a manifest does: CRC-32 (format 2) and sha256 (format 1)"
    from ddp_safe_fastai.checksums import checksum
    with tempfile.TemporaryDirectory() as d:
        f = Path(d)/'state.pth'; f.write_bytes(os.urandom(size))
        return dict(size_mb=size/MB, **{k: timed(lambda: checksum(f, k), reps) for k in ('crc32', 'sha256')})

def async_stall(size=200*MB, reps=5, batch=0.1):
    "Seconds the training loop waits for a save of a `size` model: synchronous (durable); in the background with all of it copied at once; as the callbacks save it (the weights copied while the next batch runs, `batch` s here)"
    with tempfile.TemporaryDirectory() as d:
        learn = learner_of(size, d)
        later = step_tensors(learn.model, learn.opt)
        def stall(**kw):
            flush_saves()
            t = time.perf_counter(); save_learner(learn, 'm', with_opt=False, **kw); waited = time.perf_counter() - t  # as the callbacks save
            if kw.get('later'):
                time.sleep(batch)  # the next batch's forward and backward passes: on a GPU the CPU is free meanwhile
                t = time.perf_counter(); wait_for_copies(); waited += time.perf_counter() - t  # before the step
            return waited
        runs = [lambda: stall(), lambda: stall(async_save=True), lambda: stall(async_save=True, later=later)]
        for f in runs: f()  # untimed: first touches
        ts = [[f() for f in (runs if i % 2 == 0 else runs[::-1])] for i in range(reps)]
        ts = [t if i % 2 == 0 else t[::-1] for i,t in enumerate(ts)]
        flush_saves()
        sync,at_once,overlapped = (statistics.median(t[j] for t in ts) for j in range(3))
        return dict(size_mb=size/MB, sync=sync, async_=at_once, overlapped=overlapped)

# ---- several ranks: copies written, latency added, other libraries ----
def _wchar():
    return int(next(l for l in open('/proc/self/io') if l.startswith('wchar')).split()[1])

def ranks_costs(root, size=10*MB, reps=15):
    "On every rank: bytes written and seconds spent per checkpoint, unguarded, the tutorial's idiom, scope='global', scope='node'"
    learn = learner_of(size, Path(root))
    state = learn.model.state_dict()
    def unguarded(): torch.save(state, Path(root)/'models/unguarded.pth')  # fastai-style code without the guard
    def tutorial():
        if rank_distrib() == 0: torch.save(state, Path(root)/'models/tutorial.pth')
        dist.barrier()
    def measure(f):
        w,t = _wchar(),time.perf_counter(); f()
        return time.perf_counter() - t, _wchar() - w
    (Path(root)/'models').mkdir(exist_ok=True)
    runs = in_turns({'unguarded': unguarded, 'tutorial rank0+barrier': tutorial,
                     'global': lambda: learn.save('g', with_opt=False), 'node': lambda: learn.save('n', with_opt=False, scope='node'),
                     'global, durable=False (no fsync, as the tutorial)': lambda: learn.save('f', with_opt=False, durable=False)},
                    reps, measure)
    return dict(size=os.path.getsize(Path(root)/'models/g.pth'),
                costs={k: dict(seconds=statistics.median(t for t,_ in v), bytes=statistics.mean(w for _,w in v)) for k,v in runs.items()})

def other_libraries(root, size=100*MB, reps=9):
    "The same state through this library, HF Accelerate's save_state/load_state and torch.distributed.checkpoint, in turns"
    import torch.distributed.checkpoint as dcp
    from accelerate import Accelerator
    learn = learner_of(size, Path(root))
    acc = Accelerator(cpu=True)
    acc.prepare(learn.model)  # registers it for accelerate's save_state
    sd,accel,dcp_dir = {'model': learn.model.state_dict()},str(Path(root)/'accel'),str(Path(root)/'dcp')
    # save_state writes on the main process only and load_state does not wait for it: without this barrier rank 1
    # reads before rank 0 has written (FileNotFoundError, seen here), the race this library closes in its loads
    libs = {'ddp_safe_fastai, durable': (lambda: learn.save('m', with_opt=False), lambda: learn.load('m', with_opt=False)),
            'ddp_safe_fastai, durable=False': (lambda: learn.save('f', with_opt=False, durable=False), lambda: learn.load('f', with_opt=False)),
            'accelerate': (lambda: (acc.save_state(accel), acc.wait_for_everyone()), lambda: acc.load_state(accel)),
            'torch.distributed.checkpoint': (lambda: (dcp.save(sd, checkpoint_id=dcp_dir), dist.barrier()),
                                             lambda: dcp.load(sd, checkpoint_id=dcp_dir))}
    def save_then_load(fs):
        ts = []
        for f in fs: t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
        return ts
    runs = in_turns(libs, reps, save_then_load)
    return {k: tuple(statistics.median(t[i] for t in v) for i in (0, 1)) for k,v in runs.items()}

# ---- a real training: what the callbacks cost an epoch ----
class EpochClock(Callback):
    "When each epoch starts, and when the fit ends (after every other callback's `after_fit`): wall clock, and the CPU time of all the process's threads"
    order = 10_000
    def before_fit(self): self.starts = []
    def before_epoch(self): self.starts.append((time.perf_counter(), time.process_time()))
    def after_fit(self): self.end = time.perf_counter(), time.process_time()

def callbacks_overhead(root, reps=5, epochs=4):
    "Per epoch of the vision example on this rank, in fits of `epochs` epochs: the median seconds of an epoch and its save (all but the last), and the fit's end (its last epoch, the last writes waited for, the best model reloaded); plain, both callbacks synchronous, and in the background (their default)"
    sys.path.insert(0, str(Path(__file__).parent.parent/'examples'))
    from vision import digits_learner
    learn = digits_learner(Path(root))
    clock,times = EpochClock(),{}
    def fit(key, **kw):
        # the costliest case: every epoch a new best (forced), so the model is saved every epoch, and a checkpoint too
        cbs = [SafeSaveModelCallback(monitor='valid_loss', comp=lambda a,b: True, **kw), CheckpointCallback(resume=False, **kw)] if kw else []
        with learn.distrib_ctx(): learn.fit(epochs, 1e-3, cbs=[*cbs, clock])
        s = clock.starts
        times.setdefault(key, []).append(([(b[0]-a[0], b[1]-a[1]) for a,b in zip(s, s[1:])], clock.end[0] - s[-1][0]))
    keys = 'plain','synchronous','background'
    alternated(*(partial(fit, k, **kw) for k,kw in zip(keys, [{}, dict(async_save=False), dict(async_save=True)])), reps=reps)
    runs = {k: times[k][1:] for k in keys}  # [0]: alternated's untimed first run
    return {k: dict(epoch=statistics.median(w for es,_ in v for w,_ in es), cpu=statistics.median(c for es,_ in v for _,c in es),
                    end=statistics.median(end for _,end in v)) for k,v in runs.items()}

# ---- report ----
def table(title, header, rows):
    print(f"\n{title}\n" + ' | '.join(header) + '\n' + ' | '.join('---' for _ in header))
    for r in rows: print(' | '.join(r))

def main():
    results = {}
    kept = os.environ.get('MALLOC_MMAP_MAX_') == '0'
    print(f"freed memory kept by the process (see tools/bench.sh): {'yes' if kept else 'no: the 1 GB figures vary with the host'}")
    sl = results['save_load'] = save_load_costs()
    ms = lambda t: f"{t*1000:.2f}"
    table('Guarded save and load vs raw torch (one process, milliseconds, median); the floor of a load: what any '
          '`torch.load` pays before the bytes, plus one copy of them into the model',
          ['size', 'raw save', 'Learner.save', 'ratio', 'raw save+fsync', 'Learner.save durable', 'ratio', 'raw load',
           'Learner.load', 'ratio', 'floor', 'floor / raw load'],
          [[f"{r['size_mb']:.0f} MB", ms(r['raw_save']), ms(r['safe_save']), f"{r['safe_save']/r['raw_save']:.2f}x",
            ms(r['raw_save_fsync']), ms(r['safe_save_durable']), f"{r['safe_save_durable']/r['raw_save_fsync']:.2f}x",
            ms(r['raw_load']), ms(r['safe_load']), f"{r['safe_load']/r['raw_load']:.2f}x",
            ms(r['load_fixed'] + r['one_copy']), f"{(r['load_fixed'] + r['one_copy'])/r['raw_load']:.2f}x"] for r in sl])
    a = results['async'] = async_stall()
    table('Training stall per save, 200 MB model (seconds): synchronous (durable); in the background, the state copied at once '
          '(`Learner.save(async_save=True)`); in the background as the callbacks save (the weights copied during the next batch)',
          ['synchronous (durable)', 'background, copied at once', 'ratio', 'background, copied during the next batch', 'ratio'],
          [[f"{a['sync']:.3f}", f"{a['async_']:.3f}", f"{a['async_']/a['sync']:.1%}", f"{a['overlapped']:.4f}", f"{a['overlapped']/a['sync']:.1%}"]])
    rk = results['ranks'] = {}
    for n in (2, 4, 8):
        with tempfile.TemporaryDirectory() as d:
            outs = torchrun_ranks(ranks_costs, d, nproc=n, timeout=600)
        bad = [o for o in outs if not o.ok]
        if bad: raise RuntimeError(bad)
        rk[n] = [o.value for o in outs]
    rows = []
    for n, vals in rk.items():
        size = vals[0]['size']
        for name in vals[0]['costs']:
            copies = sum(v['costs'][name]['bytes'] for v in vals) / size
            lat,tut = (max(v['costs'][k]['seconds'] for v in vals) for k in (name, 'tutorial rank0+barrier'))
            rows.append([str(n), name, f"{copies:.2f}", f"{lat*1000:.1f}", f"{lat/tut:.2f}x"])
    table('Copies written per checkpoint (bytes written / checkpoint size, all ranks), and the latency the save adds to every rank\'s step (the slowest rank\'s time in it), 10 MB, one node',
          ['ranks', 'how', 'copies', 'latency ms', 'vs the tutorial\'s'], rows)
    results['libraries'] = {}
    for n in (2, 4):
        with tempfile.TemporaryDirectory() as d:
            outs = torchrun_ranks(other_libraries, d, nproc=n, timeout=600)
        if not all(o.ok for o in outs): raise RuntimeError(outs)
        ol = results['libraries'][n] = outs[0].value
        base = ol['ddp_safe_fastai, durable=False']  # neither Accelerate nor DCP fsyncs: like with like
        table(f'The same 100 MB model on {n} ranks, rank 0\'s seconds (median); "vs" is against our save without fsync, '
              'as the others write', ['library', 'save', 'vs', 'load', 'vs'],
              [[k, f"{s:.3f}", f"{s/base[0]:.2f}x", f"{l:.3f}", f"{l/base[1]:.2f}x"] for k,(s,l) in ol.items()])
    dt = results['disk'] = disk_throughput()
    table('Durable save throughput vs the disk\'s (`dd conv=fsync`), 1 GB, MB/s (median); and the same save with torch.save\'s '
          'CRC-32s off (not what the library writes: what they cost)',
          ['dd conv=fsync', 'Learner.save durable', 'ratio', 'the same, no CRC-32s', 'ratio'],
          [[f"{dt['dd']:.0f}", f"{dt['save']:.0f}", f"{dt['save']/dt['dd']:.2f}", f"{dt['no_crc']:.0f}", f"{dt['no_crc']/dt['dd']:.2f}"]])
    cs = results['checksums'] = checksum_costs()
    table('Checksumming a 128 MB checkpoint file for its manifest, seconds (median)', ['CRC-32 (format 2)', 'sha256 (format 1)', 'ratio'],
          [[f"{cs['crc32']:.3f}", f"{cs['sha256']:.3f}", f"{cs['crc32']/cs['sha256']:.2f}x"]])
    with tempfile.TemporaryDirectory() as d:
        outs = torchrun_ranks(callbacks_overhead, d, nproc=2, init=False, timeout=600)
    if not all(o.ok for o in outs): raise RuntimeError(outs)
    cb = results['callbacks'] = outs[0].value
    plain,sync,bg = (cb[k] for k in ('plain', 'synchronous', 'background'))
    table('The vision example (resnet18, 1,437 images, 2 CPU ranks, fits of 4 epochs, every epoch a new best and a '
          'checkpoint), rank 0\'s seconds (median): an epoch with its saves, and the end of a fit (the last epoch, its '
          'writes waited for, the best model reloaded)',
          ['', 'plain fit', 'both callbacks, synchronous', 'ratio', 'both callbacks, in the background (default)', 'ratio'],
          [[what, f"{plain[k]:.2f}", f"{sync[k]:.2f}", f"{sync[k]/plain[k]:.3f}x", f"{bg[k]:.2f}", f"{bg[k]/plain[k]:.3f}x"]
           for what,k in [('an epoch', 'epoch'), ('CPU seconds of an epoch, all threads', 'cpu'), ('the end of the fit', 'end')]])
    plot(results, Path(__file__).parent.parent/'nbs/images/benchmarks.png')
    (Path(__file__).parent/'results.json').write_text(json.dumps(results, indent=1, default=str))

def plot(results, png):
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    sl = results['save_load']; x = range(len(sl)); labels = [f"{r['size_mb']:.0f} MB" for r in sl]
    for i,(k,lab) in enumerate([('safe_save/raw_save', 'save'), ('safe_save_durable/raw_save_fsync', 'durable save'), ('safe_load/raw_load', 'load')]):
        num, den = k.split('/')
        ax[0].bar([j + i*0.25 for j in x], [r[num]/r[den] for r in sl], 0.25, label=lab)
    ax[0].axhline(1.0, ls='--', c='k', lw=1); ax[0].set_xticks([j+0.25 for j in x], labels)
    ax[0].set_title('guarded / raw torch (lower is better; 1.0 dashed)'); ax[0].legend()
    rk = results['ranks']; names = list(next(iter(rk.values()))[0]['costs'])
    for i,name in enumerate(names):
        ax[1].plot(list(rk), [sum(v['costs'][name]['bytes'] for v in vals)/vals[0]['size'] for vals in rk.values()], 'o-', label=name)
    ax[1].set_xlabel('ranks'); ax[1].set_title('copies written per checkpoint'); ax[1].legend()
    ol = results['libraries'][2]
    ax[2].bar([k.replace('torch.distributed.checkpoint', 'DCP').replace('ddp_safe_fastai', 'ours') for k in ol], [v[0] for v in ol.values()], label='save')
    ax[2].set_title('100 MB on 2 ranks: save seconds')
    png.parent.mkdir(parents=True, exist_ok=True); fig.tight_layout(); fig.savefig(png, dpi=80)
    print(f"\nplots: {png}")

if __name__ == '__main__': main()
