"""The nccl and CUDA paths, on a machine with a GPU: a fit under torchrun (one rank per GPU) and one by a plain `python`,
their checkpoints resumed and loaded onto the GPU, fastai's notebook flow, one Learner in several contexts. Skipped where
there is no GPU (CI has none)"""
import sys, pytest, torch
from conftest import values
from ddp_safe_fastai.launch import torchrun_ranks
import cuda_scenarios as sc, distributed_scenarios as ds

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: nccl and tensors on the GPU")

@needs_cuda
@pytest.mark.parametrize('group', ['user', 'fastai'])
def test_fit_resume_and_load_on_the_gpu(group, tmp_path):
    "Checkpoints of a CUDA model resume onto the GPU (the optimizer's state there, bit for bit) and load there; nccl carries what the ranks share"
    [r] = values(torchrun_ranks(sc.fit_resume_load, str(tmp_path), group, nproc=1, timeout=240, init=False))
    print(r)
    assert r['first']['backend'] == 'nccl' and r['first']['device'] == 'cuda:0'
    assert r['first']['wrapped'] == 'Sequential' and r['first']['sync_bn']  # one process on a GPU: accelerate does not wrap it in DDP
    assert r['resumed_epoch'] == 2 and r['same_opt'] and r['opt_devices'] == ['cuda:0'] and r['same_cuda_rng']
    assert len(r['resumed_losses']) == 3 and all(l == l for l in r['resumed_losses'])
    assert r['best'].startswith('epoch') and r['best_opt_devices'] == ['cuda:0']
    assert r['stale_device_load'] == ['cuda:0']
    assert r['broadcast'] == b'ddp_safe' and r['pinned']

@needs_cuda
def test_fit_alone_on_the_gpu(tmp_path):
    "A plain `learn.fit` on one GPU, started by `python` (no launcher, no group): checkpoints resume and load onto the GPU"
    [r] = values(torchrun_ranks(sc.fit_alone, str(tmp_path), nproc=1, timeout=180, init=False, launcher=[sys.executable]))
    print(r)
    assert not r['group'] and r['device'] == 'cuda:0' and r['resumed_epoch'] == 2
    assert r['same_opt'] and r['opt_devices'] == ['cuda:0']
    assert r['best'].startswith('epoch') and r['best_devices'] == ['cuda:0']

@needs_cuda
def test_notebook_flow_on_the_gpu(tmp_path):
    "fastai's notebook flow on the GPU: the group it makes is nccl; the save and load after its context read back the weights, on the GPU"
    [r] = values(torchrun_ranks(sc.notebook_flow, str(tmp_path), nproc=1, timeout=180, init=False))
    print(r)
    assert r['backend'] == 'nccl' and r['same'] and r['device'] == 'cuda:0'

@needs_cuda
def test_contexts_in_turn_on_the_gpu(tmp_path):
    "One process on the GPU, one Learner fitted in three `distrib_ctx`s in turn: no trainer and no wrapped loader stays"
    [r] = values(torchrun_ranks(ds.contexts_in_turn, str(tmp_path), nproc=1, init=False, timeout=180))
    assert r['trainers'] == 0 and r['loaders'] == ['TfmdDL', 'TfmdDL'], r
