"Learner, TextLearner, DataLoaders and SafeSaveModelCallback under DDP, on 2 CPU ranks"
import scenarios as s
from conftest import values, needs_mounts
from ddp_safe_fastai.launch import torchrun_ranks

def test_only_main_writes(launch, tmp_path):
    res = values(launch(s.only_main_writes, str(tmp_path)))
    assert res == [dict(loaded=10., on_disk=10.)]*2

def test_lagging_writer(launch, tmp_path):
    assert values(launch(s.lagging_writer, str(tmp_path))) == [2., 2.]

def test_lagging_writer_saving_alone(launch, tmp_path):
    assert values(launch(s.lagging_writer_load_only, str(tmp_path))) == [2., 2.]

def test_tutorial_idiom(launch, tmp_path):
    assert values(launch(s.tutorial_idiom, str(tmp_path), timeout=60)) == [5., 5.]

def test_load_on_one_rank_alone(launch, tmp_path):
    r0, r1 = values(launch(s.load_alone, str(tmp_path), 4))
    assert r1 == 'not loading'
    assert 'rank(s) [1] did not arrive within 4s' in r0['error'] and 'local_io' in r0['error']
    assert 4 <= r0['seconds'] < 4 + 3
    assert r0['value'] == 4.

def test_write_failure_on_rank0(launch, tmp_path):
    res = values(launch(s.write_failure, str(tmp_path), 20))
    for r in res:
        assert r['error'].startswith('CheckpointError: could not write') and 'm.pth' in r['error'], r
        assert r['value'] == 1.                # the previous checkpoint still loads
        assert r['files'] == ['m.pth']         # and no temporary is left

def test_unshared_disks_get_rank0s_bytes(launch, tmp_path):
    "Each rank has its own disk and only rank 0's holds the file: the load sends rank 0's bytes (issue 4's default)"
    assert values(launch(s.unreadable_on_some, str(tmp_path))) == [10., 10.]

def test_unshared_disks_without_sending(launch, tmp_path):
    "The same with `DDP_SAFE_BROADCAST_FILES=0`: every rank raises the same error, naming the file and rank 1"
    for r in values(launch(s.unreadable_on_some, str(tmp_path), env={'DDP_SAFE_BROADCAST_FILES': '0'})):
        assert r.startswith('CheckpointError') and 'rank(s) [1] on node(s) [0] do not have the file' in r and 'm.pth' in r

@needs_mounts
def test_unreadable_on_some_ranks(launch, tmp_path):
    for r in values(launch(s.unreadable_in_shared_dir, str(tmp_path))):
        assert r.startswith('CheckpointError') and 'failed on rank(s) [1]: truncated or corrupt' in r and 'm.pth' in r

def test_corrupt_file(launch, tmp_path):
    for r in values(launch(s.corrupt_file, str(tmp_path))):
        assert r.startswith('CheckpointError') and 'truncated or corrupt' in r and 'm.pth' in r

def test_load_maps_to_this_ranks_device(launch, tmp_path):
    assert all(set(r) == {'cpu'} for r in values(launch(s.stale_device, str(tmp_path))))

def test_planted_payload_never_runs(launch, tmp_path):
    for r in values(launch(s.planted_payload, str(tmp_path))):
        assert not r['ran'] and 'not plain weights' in r['error'] and 'model.pth' in r['error']

def test_encoder(launch, tmp_path):
    assert values(launch(s.encoder_roundtrip, str(tmp_path), timeout=180)) == [10., 10.]

def test_export_load_learner(launch, tmp_path):
    assert values(launch(s.export_roundtrip, str(tmp_path))) == [10., 10.]

def test_dataloaders(launch, tmp_path):
    "Every rank saves its own DataLoaders (rank 1's data differs): every rank loads rank 0's, on its own device"
    r0,r1 = values(launch(s.dataloaders_roundtrip, str(tmp_path)))
    assert r1['own'] != r0['own'] and r0['loaded'] == r1['loaded'] == r0['own'] and r0['device'] == r1['device'] == 'cpu'

def test_safe_save_model_callback_end_to_end(launch, tmp_path):
    "3 epochs in `distrib_ctx`, rank 0 0.7 s slower each epoch, the last epoch worse: every rank ends with the saved best"
    res = values(launch(s.ddp_fit_best, str(tmp_path), init=False, timeout=240))
    assert res[0]['best_epoch'] < res[0]['epochs'] - 1  # the reload at the end of the fit changes the weights
    assert res[0]['weights'] == res[1]['weights'] == res[0]['saved'] == res[1]['saved']

def test_batchnorm_on_cpu(tmp_path):
    "Issue 10: BatchNorm stays per rank on CPU, and every rank validates, and ends with, rank 0's running statistics"
    res = values(torchrun_ranks(s.batchnorm_fit, str(tmp_path), init=False, timeout=180))
    assert 'BatchNorm1d' in res[0]['types'] and 'SyncBatchNorm' not in res[0]['types']
    assert res[0]['stats'] == res[1]['stats']
