"""What each rank does in the tests of `persist`'s background saves (test_persist_async.py): a save returns at once and
the next load still sees it; a failed background write reaches every rank; a checkpoint holds its own step's weights"""
import time, resource, contextlib
from pathlib import Path
import torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.persist import flush_saves
from ddp_safe_fastai.testing import synth_learner
from persist_scenarios import _learner, _fill, _value, _limit_file_size

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
    import ddp_safe_fastai.background as background
    copy = background._copy_pairs
    def slow_copy(pairs): time.sleep(slow); copy(pairs)  # a copy that ends batches later, as one of gigabytes would
    background._copy_pairs = slow_copy
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
    def saved(e, it): return torch.load(ckpt/(f"epoch_{e-1 if it else e:04d}" + (f"_iter_{it:06d}" if it else ''))/'model.pth', weights_only=True)
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

def one_callback_fails(root, which):
    """One epoch; both callbacks write in the background, and the write of one of them fails on rank 0 (`which`: 'best',
    its file a directory; 'checkpoint', the checkpoint's directory a file), found as the fit ends: what each rank
    raises, and what the other wrote"""
    learn = synth_learner(path=Path(root), seed=1)
    models = Path(root)/'models'
    if rank_distrib() == 0:
        if which == 'best': (models/'model.pth').mkdir(parents=True)
        else: (models/'ckpt').mkdir(parents=True); (models/'ckpt'/'epoch_0001').write_text('in the way')
    distrib_barrier()
    cbs = [SafeSaveModelCallback(comp=lambda a,b: True), CheckpointCallback(resume=False)]  # a new best every epoch
    try:
        with learn.distrib_ctx(): learn.fit(1, 0.1, cbs=cbs)
        error = None
    except CheckpointError as e: error = str(e)
    flush_saves()  # the other callback's writes: they succeeded
    return dict(error=error, latest=(models/'ckpt'/'latest').read_text() if (models/'ckpt'/'latest').exists() else None,
                best=(models/'model.pth').is_file())
