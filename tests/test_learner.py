"""`learner` (nbs/41_learner.ipynb): `Learner.load` maps onto this rank's device; `export` and `load_learner`,
`DataLoaders.save` and `load_dataloaders` give every rank rank 0's copy"""
import learner_scenarios as s
from conftest import values

def test_load_maps_to_this_ranks_device(launch, tmp_path):
    "`Learner.load` where the DataLoaders name a device this rank does not have (cuda:1): model and optimizer state land on this rank's own device"
    assert all(set(r) == {'cpu'} for r in values(launch(s.stale_device, str(tmp_path))))

def test_export_load_learner(launch, tmp_path):
    "`export` on every rank with different weights, then `load_learner` on every rank: rank 0's weights everywhere"
    assert values(launch(s.export_roundtrip, str(tmp_path))) == [10., 10.]

def test_dataloaders(launch, tmp_path):
    "Every rank saves its own DataLoaders (rank 1's data differs): every rank loads rank 0's, on its own device"
    r0,r1 = values(launch(s.dataloaders_roundtrip, str(tmp_path)))
    assert r1['own'] != r0['own'] and r0['loaded'] == r1['loaded'] == r0['own'] and r0['device'] == r1['device'] == 'cpu'
