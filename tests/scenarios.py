"What each rank does in the multi-process tests: module-level functions, run by `spawn_ranks` and `torchrun_ranks`"
import os, json, time, signal, resource, importlib, contextlib
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.persist import flush_saves
from ddp_safe_fastai.testing import synth_learner, synth_text_learner

def ranks():
    "What this process believes about itself, through fastai's own functions"
    import fastai.torch_core, fastai.learner
    return dict(rank=fastai.learner.rank_distrib(), world=fastai.torch_core.num_distrib(), local=local_rank_distrib(),
                main=is_main_process(), env_rank=os.environ.get('RANK'))

def barrier_missing(absent, timeout, late=0.):
    "Every rank but `absent` enters a barrier, the last rank `late` s after the others; returns how long the wait lasted"
    if rank_distrib() == absent:
        time.sleep(timeout + late + 8)
        return 'absent'
    if rank_distrib() == num_distrib()-1: time.sleep(late)
    t = time.monotonic()
    try: distrib_barrier(timeout=timeout)
    finally: print(f"waited {time.monotonic()-t:.1f}s")

def slow_reader_at_the_end(delay):
    "Ranks meet once and leave; every rank but 0 is `delay` s late reading the meeting (rank 0's process may host the store)"
    import sys
    def late(frame, event, f):
        # the library's reads of the store (a pybind11 method, so not a `Store` bound method): not a `dict.get`
        reads = getattr(f, '__name__', '') in ('get', 'multi_get') and not isinstance(getattr(f, '__self__', None), dict)
        if event == 'c_call' and frame.f_globals['__name__'] == 'ddp_safe_fastai.core' and reads:
            sys.setprofile(None); time.sleep(delay)
    if rank_distrib(): sys.setprofile(late)
    try: return broadcast_object(f"from rank {rank_distrib()}")
    finally: sys.setprofile(None)

def exchange_too_large():
    "Rank 1 publishes 9 MB, the others a few bytes; returns what each rank raised"
    try: exchange(b'x'*(9_000_000 if rank_distrib() == 1 else 10), 'large')
    except ValueError as e: return str(e)

def timed(f, *args):
    t = time.monotonic()
    try: return f(*args)
    except Exception as e:
        e.args = (f"{e.args[0]} [after {time.monotonic()-t:.1f}s]",)
        raise

def main_first_fails(timeout):
    "The main process raises inside `main_process_first`"
    with main_process_first(timeout=timeout):
        if rank_distrib() == 0: raise ValueError('download failed')
    return 'passed'

def prepare_dirs(root, trials):
    "`prepare_dir(overwrite=True)` over a populated directory, `trials` times; each rank writes a file into it"
    errors = 0
    for i in range(trials):
        try:
            p = prepare_dir(Path(root)/'ckpt', overwrite=True)
            for j in range(20): (p/f"r{rank_distrib()}_{j}.txt").write_text(str(i))
            distrib_barrier()
            if len(list(p.iterdir())) != 20*num_distrib(): errors += 1
            distrib_barrier()
        except Exception: errors += 1
    return errors

def raw_prepare_dirs(root, trials):
    "The unguarded pattern of openpi issue #868: every rank does rmtree + mkdir"
    import shutil
    errors = 0
    for i in range(trials):
        try:
            p = Path(root)/'ckpt'
            if p.exists(): shutil.rmtree(p)
            p.mkdir(parents=True)
            for j in range(20): (p/f"r{rank_distrib()}_{j}.txt").write_text(str(i))
        except Exception: errors += 1
        dist.barrier()
    return errors

# ---- persistence (issue 3) ----
def _learner(root, disk=None):
    "The synthetic learner, in `root` (or in `root/disk` to play a node-local disk)"
    return synth_learner(path=Path(root)/disk if disk else Path(root))

def _fill(learn, v):
    with torch.no_grad():
        for p in learn.model.parameters(): p.fill_(v)

def _value(learn): return learn.model.weight.flatten()[0].item()

def only_main_writes(root):
    "Every rank holds different weights and saves; the file and every rank's load hold rank 0's"
    learn = _learner(root)
    _fill(learn, 10. + rank_distrib())
    f = learn.save('m')
    _fill(learn, -1.)
    learn.load('m')
    state = torch.load(f)
    return dict(loaded=_value(learn), on_disk=state.get('model', state)['weight'].flatten()[0].item())

def lagging_writer(root, delay=2.):
    "An older file exists; rank 0 arrives `delay` s late at the save of the new weights; every rank then loads"
    learn = _learner(root)
    _fill(learn, 1.); learn.save('m')      # the older checkpoint
    _fill(learn, 2. if rank_distrib() == 0 else 3.)
    if rank_distrib() == 0: time.sleep(delay)
    learn.save('m')
    _fill(learn, -1.)
    learn.load('m')
    return _value(learn)

def lagging_writer_load_only(root, delay=2.):
    "Only rank 0 saves, `delay` s late, with no barrier of the user's; every rank loads"
    learn = _learner(root)
    _fill(learn, 1.); learn.save('m')
    if rank_distrib() == 0:
        time.sleep(delay); _fill(learn, 2.); learn.save('m')
    _fill(learn, -1.)
    learn.load('m')
    return _value(learn)

def tutorial_idiom(root):
    "PyTorch tutorial: save on rank 0 only, the user's own `dist.barrier()`, then load on every rank"
    learn = _learner(root)
    _fill(learn, 5. + rank_distrib())
    if rank_distrib() == 0: learn.save('m')
    dist.barrier()
    _fill(learn, -1.)
    learn.load('m')
    return _value(learn)

def load_alone(root, timeout):
    "Every rank saves; then rank 0 alone loads (an evaluation at the end of a script)"
    learn = _learner(root)
    _fill(learn, 4.)
    learn.save('m')
    if rank_distrib() != 0: return 'not loading'
    t = time.monotonic()
    try: learn.load('m', timeout=timeout)
    except DistributedTimeoutError as e: err = (str(e), time.monotonic()-t)
    with local_io(): learn.load('m')
    return dict(error=err[0], seconds=err[1], value=_value(learn))

def _limit_file_size(nbytes):
    "Make writes past `nbytes` fail in this process, as on a full disk (EFBIG instead of ENOSPC)"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old[1]))
    return old

def write_failure(root, timeout):
    "A good checkpoint exists; the next save fails half-way on rank 0; every rank raises, the old file still loads"
    learn = synth_learner(path=Path(root), n=64)
    learn.model = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.Linear(256, 1))
    learn.create_opt()
    _fill(learn, 1.); f = learn.save('m')
    _fill(learn, 2.)
    old = _limit_file_size(f.stat().st_size // 2) if rank_distrib() == 0 else None
    try: learn.save('m', timeout=timeout); err = None
    except CheckpointError as e: err = f"{type(e).__name__}: {e}"
    finally:
        if old: resource.setrlimit(resource.RLIMIT_FSIZE, old)
    learn.load('m')
    leftovers = sorted(p.name for p in f.parent.iterdir())
    return dict(error=err, value=learn.model[0].weight.flatten()[0].item(), files=leftovers)

def unreadable_on_some(root):
    "Each rank has its own disk (`root/diskN`, as on nodes without a shared disk); the main writes only its own"
    learn = _learner(root, disk=f"disk{rank_distrib()}")
    _fill(learn, 10. + rank_distrib())
    learn.save('m')
    _fill(learn, -1.)
    try: learn.load('m'); return _value(learn)
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def _hide_from_this_process(f):
    "Show this process (alone) an empty file in place of `f`: a private mount namespace and a bind mount"
    import ctypes, subprocess
    assert ctypes.CDLL(None, use_errno=True).unshare(0x00020000) == 0, 'unshare(CLONE_NEWNS) failed'
    subprocess.run(['mount', '--make-rprivate', '/'], check=True)
    empty = Path(f).parent.parent/'empty'; empty.touch()
    subprocess.run(['mount', '--bind', str(empty), str(f)], check=True)

def unreadable_in_shared_dir(root):
    "A shared directory, but rank 1 sees an empty file where the checkpoint is (its view of the disk is broken)"
    learn = _learner(root)
    f = learn.save('m')
    distrib_barrier()
    if rank_distrib() == 1: _hide_from_this_process(f)
    try: learn.load('m'); return 'loaded'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def corrupt_file(root):
    "The checkpoint is truncated; every rank loads"
    learn = _learner(root)
    f = learn.save('m')
    distrib_barrier()
    if rank_distrib() == 0: f.write_bytes(f.read_bytes()[:200])
    distrib_barrier()
    try: learn.load('m'); return 'loaded'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def stale_device(root):
    "The dls were built for a device this rank does not have; the load still maps to this rank's own device"
    learn = _learner(root)
    learn.save('m')
    learn.dls.device = torch.device('cuda', 1)
    learn.load('m')
    return [str(p.device) for p in learn.model.parameters()] + [str(v.device) for s in learn.opt.state.values() for v in s.values() if hasattr(v, 'device')]

class _Payload:
    def __init__(self, marker): self.marker = marker
    def __reduce__(self): return (os.system, (f"touch {self.marker}",))

def planted_payload(root):
    "`models/model.pth` holds a pickle payload; `Learner.load` and `SafeSaveModelCallback`'s reload must not run it"
    learn = _learner(root)
    marker = Path(root)/f"pwned{rank_distrib()}"
    if rank_distrib() == 0:
        (Path(root)/'models').mkdir(exist_ok=True)
        torch.save({'model': _Payload(marker), 'opt': {}}, Path(root)/'models/model.pth')
    distrib_barrier()
    try: learn.load('model'); out = 'loaded'
    except CheckpointError as e: out = str(e)
    return dict(error=out, ran=marker.exists())

def encoder_roundtrip(root):
    "save_encoder on every rank with different weights, then load_encoder: rank 0's weights everywhere"
    learn = synth_text_learner(root)
    enc = learn.model[0]
    with torch.no_grad(): enc.encoder.weight.fill_(10. + rank_distrib())
    learn.save_encoder('enc')
    with torch.no_grad(): enc.encoder.weight.fill_(-1.)
    learn.load_encoder('enc')
    return enc.encoder.weight.flatten()[0].item()

def export_roundtrip(root):
    "export on every rank with different weights, then load_learner on every rank"
    learn = _learner(root)
    _fill(learn, 10. + rank_distrib())
    learn.export()
    return _value(load_learner(Path(root)/'export.pkl'))

def dataloaders_roundtrip(root):
    "DataLoaders.save on every rank, then load_dataloaders on every rank"
    learn = _learner(root)
    learn.dls.train_ds.tls[0].tfms.fs[0].t += rank_distrib()  # rank 1's data differs
    own = learn.dls.train_ds[0][0][0].item()
    learn.dls.save()
    dls = load_dataloaders(root)
    return dict(own=own, loaded=dls.train_ds[0][0][0].item(), device=str(dls.device))

# ---- training (issues 2 and 3) ----
class SlowRank0(Callback):
    "Rank 0 is `delay` s slower at the end of every epoch (before the save)"
    order = SafeSaveModelCallback.order - 1
    def __init__(self, delay): self.delay = delay
    def after_epoch(self):
        if rank_distrib() == 0: time.sleep(self.delay)

def ddp_fit(root, epochs=2):
    "Plain `with learn.distrib_ctx(): learn.fit(...)`, nothing else: final weights of each rank"
    learn = _learner(root)
    with learn.distrib_ctx(): learn.fit(epochs, 0.1)
    return dict(weights=learn.model.weight.flatten().tolist(), world=num_distrib(),
                backend=dist.get_backend() if dist.is_initialized() else None)

class WorseLastEpoch(Callback):
    "Before the last validation, every rank moves the weights away (the same way): the best epoch is an earlier one"
    def before_validate(self):
        if self.epoch == self.n_epoch-1:
            with torch.no_grad():
                for p in self.learn.model.parameters(): p.add_(1.)

def ddp_fit_best(root, delay=0.7, epochs=3):
    "3 epochs in `distrib_ctx` with `SafeSaveModelCallback(with_opt=True)`, rank 0 `delay` s slower each epoch"
    learn = _learner(root)
    cbs = [SafeSaveModelCallback(with_opt=True), SlowRank0(delay), WorseLastEpoch()]
    with learn.distrib_ctx(): learn.fit(epochs, 0.1, cbs=cbs)
    saved = torch.load(Path(root)/'models/model.pth', weights_only=False)['model']
    return dict(weights=learn.model.weight.flatten().tolist(), saved=saved['weight'].flatten().tolist(),
                best_epoch=int(torch.tensor([v[1] for v in learn.recorder.values]).argmin()), epochs=epochs)

def batchnorm_fit(root):
    "A BatchNorm model trained in `distrib_ctx()` as fastai documents it, on CPU: each rank's running statistics after"
    learn = synth_learner(path=Path(root), seed=1)
    learn.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    with learn.distrib_ctx(): learn.fit(2, 0.1)  # sync_bn=True, fastai's default: SyncBatchNorm needs CUDA
    return dict(types=sorted({type(m).__name__ for m in learn.model.modules()}),
                stats=[b.tolist() for b in learn.model.buffers()])

# ---- resume (issue 4) ----
def resume_fit(root, epochs=4, hidden=1500):
    "`epochs` epochs of one-cycle training in `distrib_ctx` with `CheckpointCallback`: resumes if a checkpoint exists"
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(path=Path(root), seed=1)
    torch.manual_seed(1)
    nn = torch.nn  # ~27 MB of model and Adam state: a checkpoint write takes long enough to be killed in
    learn.model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    ckpt = CheckpointCallback()
    with learn.distrib_ctx(): learn.fit_one_cycle(epochs, 0.01, cbs=[SafeSaveModelCallback(), ckpt])
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    return dict(sha=h, resumed_from=ckpt.resumed_from, epochs=len(learn.recorder.values))

# ---- several nodes (issue 4) ----
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

# ---- asynchronous saves (issue 5) ----
def async_fresh(root, delay=1.):
    "Every rank saves asynchronously (rank 0 `delay` s late), then loads at once: the new weights, everywhere"
    learn = _learner(root)
    _fill(learn, 1.); learn.save('m')
    _fill(learn, 2.)
    if rank_distrib() == 0: time.sleep(delay)
    learn.save('m', async_save=True)
    _fill(learn, -1.)
    learn.load('m')
    return _value(learn)

def async_write_failure(root):
    "A good checkpoint exists; background writes fail half-way on rank 0; every rank hears of each at the next save of its file, or at the flush"
    learn = synth_learner(path=Path(root))
    learn.model = torch.nn.Sequential(torch.nn.Linear(4, 256), torch.nn.Linear(256, 1))
    learn.create_opt()
    _fill(learn, 1.); f = learn.save('m')
    _fill(learn, 2.)
    old = _limit_file_size(f.stat().st_size // 2) if rank_distrib() == 0 else None
    try:
        learn.save('m', async_save=True)             # returns at once, on every rank
        learn.save('other', async_save=True)         # another file: no wait for the write of m
        try: learn.save('m', async_save=True); err = None  # the next save of m waits for the last one, which failed
        except CheckpointError as e: err = str(e)
        try: flush_saves(); flushed = None           # the write of other failed too
        except CheckpointError as e: flushed = str(e)
    finally:
        if old: resource.setrlimit(resource.RLIMIT_FSIZE, old)
    learn.load('m')
    return dict(error=err, flushed=flushed, value=learn.model[0].weight.flatten()[0].item(),
                files=sorted(p.name for p in f.parent.iterdir() if p.name.startswith('.m.')))

def checkpoint_of_its_step(root, slow=0.5, every_iters=None):
    "The background copy of each checkpoint's weights made slow: each still holds the weights of its own step, on every rank"
    import ddp_safe_fastai.persist as persist
    copy = persist._copy_pairs
    def slow_copy(pairs): time.sleep(slow); copy(pairs)  # a copy that ends batches later, as one of gigabytes would
    persist._copy_pairs = slow_copy
    learn = synth_learner(path=Path(root), seed=1)
    seen = {}
    class Record(Callback):
        order = CheckpointCallback.order + 1
        def _note(self, it): seen[self.epoch+1, it] = [p.detach().clone() for p in learn.model.parameters()]
        def after_batch(self):
            if self.training and every_iters and (self.iter+1) % every_iters == 0 and self.iter+1 < self.n_iter: self._note(self.iter+1)
        def after_epoch(self): self._note(0)
    with learn.distrib_ctx(): learn.fit(3, 0.1, cbs=[CheckpointCallback(keep=99, every_iters=every_iters), Record()])
    ckpt = Path(root)/'models/ckpt'
    def saved(e, it): return torch.load(ckpt/(f"epoch_{e-1 if it else e:04d}" + (f"_iter_{it:06d}" if it else ''))/'state.pth', weights_only=False)['model']['model']
    return {f"{e}/{it}": all(torch.equal(a, b) for a,b in zip(saved(e, it).values(), w)) for (e, it),w in seen.items()}

def _fill_disk(path):
    "Fill the file system of the folder `path` to its last byte, as another program might; the file that does it"
    filler = Path(path)/'filler'
    with open(filler, 'wb', buffering=0) as f, contextlib.suppress(OSError):
        while f.write(bytes(2**16)): pass
    return filler

class DiskFullFrom(Callback):
    "From epoch `at` on, rank 0's disk is full (the earlier epochs' files are written first)"
    def __init__(self, at): self.at,self.filler = at,None
    def before_epoch(self):
        if self.epoch != self.at: return
        flush_saves()
        if rank_distrib() == 0: self.filler = _fill_disk(self.path)

def background_write_failure(root):
    "Both callbacks write in the background, as by default; the disk fills after epoch 0: what each rank raises, and what is left"
    learn = synth_learner(path=Path(root), seed=1)
    full,saved = DiskFullFrom(1),{}
    class Record(Callback):
        def after_epoch(self): saved.setdefault(self.epoch, [p.detach().clone() for p in learn.model.parameters()])
    cbs = [SafeSaveModelCallback(comp=lambda a,b: True), CheckpointCallback(), full, Record()]  # a new best every epoch
    errors = []
    try:
        try:
            with learn.distrib_ctx(): learn.fit(4, 0.1, cbs=cbs)
        except CheckpointError as e: errors.append((str(e), learn.epoch))
        try: flush_saves()  # the writes still in flight
        except CheckpointError as e: errors.append((str(e), None))
    finally:
        if full.filler: full.filler.unlink()
    models = Path(root)/'models'
    model = torch.load(models/'model.pth')
    return dict(errors=errors, latest=latest_complete(models/'ckpt').name, checkpoints=sorted(p.name for p in (models/'ckpt').iterdir()),
                model_of_epoch_0=all(torch.equal(a, b) for a,b in zip(model.values(), saved[0])),
                temporaries=sorted(str(p.relative_to(models)) for p in models.rglob('*.tmp')))

def bad_timeout_save(root):
    "Every rank saves with DDP_SAFE_TIMEOUT set to something that is not a timeout; what each raised, and where"
    learn = synth_learner(path=Path(root))
    try: learn.save('m'); return 'saved'
    except ValueError as e: return f"save: {e}"

def save_on_read_only(root):
    "Every rank saves into a directory that cannot be made (the disk is mounted read-only); what each raised"
    learn = synth_learner(path=Path(root))
    try: learn.save('m'); return 'saved'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def truncated_dataloaders(root):
    "`dls.save()`, the file cut in half, then `load_dataloaders` on every rank; what each raised"
    learn = synth_learner(path=Path(root))
    f = learn.dls.save()
    if rank_distrib() == 0:
        data = f.read_bytes(); f.write_bytes(data[:len(data)//2])
    distrib_barrier()
    try: load_dataloaders(root); return 'loaded'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def missing_file(root):
    "A load of a file that does not exist, caught the way fastai code catches it"
    learn = synth_learner(path=Path(root))
    try: learn.load('never_saved')
    except FileNotFoundError as e: return f"{type(e).__name__}: {isinstance(e, CheckpointError)}: {e}"

def buffers(root):
    "Each rank saves to a buffer of its own and loads it back, as in fastai"
    import io
    learn = synth_learner(path=Path(root)); _fill(learn, 3. + rank_distrib())
    buf = io.BytesIO(); learn.save(buf); buf.seek(0)
    _fill(learn, 0.); learn.load(buf)
    return dict(value=_value(learn), files=sorted(p.name for p in Path(root).rglob('*')))

class Noise(Callback):
    "Random augmentation: noise on every training batch, from this rank's torch RNG"
    def before_batch(self):
        if self.training: self.learn.xb = (self.xb[0] + 0.1*torch.randn_like(self.xb[0]),)

def resume_within_epoch(root, every_iters=3):
    "Dropout, noise, one-cycle; a checkpoint every `every_iters` batches too: resumes if a checkpoint exists"
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(n=256, path=Path(root), seed=2)
    nn = torch.nn
    learn.model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    ckpt = CheckpointCallback(every_iters=every_iters)
    with learn.distrib_ctx(): learn.fit_one_cycle(3, 0.02, cbs=[ckpt, Noise()])
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    rec = learn.recorder
    return dict(sha=h, resumed_from=ckpt.resumed_from, losses=[float(l) for l in rec.losses], lrs=list(map(float, rec.lrs)),
                values=[list(map(float, v)) for v in rec.values])

# ---- resume on another world size (issue 22) ----
class SampleLog(Callback):
    "Appends the samples of every training batch whose step is done to `root/samples.jsonl`: run, world size, epoch, batch"
    order = -100  # before any callback changes the batch (`Noise`)
    def __init__(self, root, run): self.file,self.run = Path(root)/'samples.jsonl',run
    def before_fit(self):
        ds = self.dls.train_ds
        self.ids = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    def before_batch(self):
        if self.training: self.batch = [self.ids[x.numpy().tobytes()] for x in self.xb[0]]
    def after_batch(self):
        if not self.training: return
        line = dict(run=self.run, attempt=int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)), world=num_distrib() or 1,
                    rank=rank_distrib(), epoch=self.epoch, iter=self.iter, samples=self.batch)
        with open(self.file, 'a') as f: f.write(json.dumps(line) + '\n')

class StopAt(Callback):
    "Once the checkpoint of `at` (epochs done, or an epoch and batches done in it) is written: `root/stop` appears, then wait"
    order = 1001  # after `CheckpointCallback`
    def __init__(self, root, at, wait): self.root,self.at,self.wait = Path(root),at,wait
    def _stop(self):
        flush_saves()  # the checkpoint is written in the background: its commit is done
        if rank_distrib() == 0: (self.root/'stop').touch()
        time.sleep(self.wait)  # to be killed in; or for a node to be killed, and then fail
    def after_batch(self):
        if self.training and (self.epoch, self.iter+1) == self.at: self._stop()
    def after_epoch(self):
        if (self.epoch+1,) == self.at: self._stop()

def any_world_fit(root, run='first', every_iters=None, stop_at=None, n=96, wait=600):
    "Dropout, noise, one-cycle, `n` samples in batches of 8: resumes if a checkpoint exists; logs the samples it trains on"
    import hashlib; importlib.import_module('fastai.callback.schedule')  # Learner.fit_one_cycle
    learn = synth_learner(n=n, path=Path(root), seed=3)
    nn = torch.nn
    learn.model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    ckpt = CheckpointCallback(every_iters=every_iters)
    cbs = [ckpt, Noise(), SampleLog(root, run)] + ([StopAt(root, stop_at, wait)] if stop_at else [])
    with learn.distrib_ctx(): learn.fit_one_cycle(4, 0.02, cbs=cbs)
    h = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    return dict(sha=h, resumed_from=ckpt.resumed_from, world=num_distrib() or 1, epochs=len(learn.recorder.values),
                values=[list(map(float, v)) for v in learn.recorder.values], pct_train=learn.pct_train)

def check_here(path):
    "What `ddp-safe-check dir` reports of `path`, on rank 0 (None elsewhere); with this rank's node"
    from ddp_safe_fastai.check import check_dir
    rep = check_dir(path)
    return dict(node=node_rank_distrib(), shared=rep and rep['shared'])
