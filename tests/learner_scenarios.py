"""What each rank does in the tests of `learner` (test_learner.py): `Learner.load` onto this rank's device, `export`
and `load_learner`, `DataLoaders.save` and `load_dataloaders`"""
from pathlib import Path
import torch
from ddp_safe_fastai.all import *
from persist_scenarios import _learner, _fill, _value

def stale_device(root):
    "The dls were built for a device this rank does not have; the load still maps to this rank's own device"
    learn = _learner(root)
    learn.save('m')
    learn.dls.device = torch.device('cuda', 1)
    learn.load('m')
    return [str(p.device) for p in learn.model.parameters()] + [str(v.device) for s in learn.opt.state.values() for v in s.values() if hasattr(v, 'device')]

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
