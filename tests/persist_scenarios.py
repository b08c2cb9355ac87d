"""What each rank does in the tests of `persist` (test_persist.py): one writer whose bytes every rank loads, a late
writer, failed writes, files some ranks cannot read, `prepare_dir`. `_learner`, `_fill` and `_value` serve the other
scenario modules too"""
import os, time, signal, resource
from pathlib import Path
import torch, torch.distributed as dist
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner

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
