"""What each rank does in the tests of `learner` kept drop-in (test_learner_dropin.py): saves to buffers, a missing
file, a bad timeout, a truncated DataLoaders file, a read-only disk"""
from pathlib import Path
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from persist_scenarios import _fill, _value

def buffers(root):
    "Each rank saves to a buffer of its own and loads it back, as in fastai"
    import io
    learn = synth_learner(path=Path(root)); _fill(learn, 3. + rank_distrib())
    buf = io.BytesIO(); learn.save(buf); buf.seek(0)
    _fill(learn, 0.); learn.load(buf)
    return dict(value=_value(learn), files=sorted(p.name for p in Path(root).rglob('*')))

def missing_file(root):
    "A load of a file that does not exist, caught the way fastai code catches it"
    learn = synth_learner(path=Path(root))
    try: learn.load('never_saved')
    except FileNotFoundError as e: return f"{type(e).__name__}: {isinstance(e, CheckpointError)}: {e}"

def bad_timeout_save(root):
    "Every rank saves with DDP_SAFE_TIMEOUT set to something that is not a timeout; what each raised, and where"
    learn = synth_learner(path=Path(root))
    try: learn.save('m'); return 'saved'
    except ValueError as e: return f"save: {e}"

def truncated_dataloaders(root):
    "`dls.save()`, the file cut in half, then `load_dataloaders` on every rank; what each raised"
    learn = synth_learner(path=Path(root))
    f = learn.dls.save()
    if rank_distrib() == 0:
        data = f.read_bytes(); f.write_bytes(data[:len(data)//2])
    distrib_barrier()
    try: load_dataloaders(root); return 'loaded'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"

def save_on_read_only(root):
    "Every rank saves into a directory that cannot be made (the disk is mounted read-only); what each raised"
    learn = synth_learner(path=Path(root))
    try: learn.save('m'); return 'saved'
    except CheckpointError as e: return f"{type(e).__name__}: {e}"
