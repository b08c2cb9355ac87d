"""`distributed` (nbs/40_distributed.ipynb): fastai's `distrib_ctx` fits on CPU as fastai documents them, under torchrun,
`mp.spawn`, `accelerate launch` and accelerate's `notebook_launcher`; BatchNorm statistics stay per rank and end as rank 0's"""
import sys, json, shutil, subprocess, pytest
from pathlib import Path
import distributed_scenarios as s
from conftest import values, ranks
from ddp_safe_fastai.launch import torchrun_ranks, free_port

def test_ddp_fit_on_cpu(launch, tmp_path):
    "`with learn.distrib_ctx(): learn.fit(...)` on CPU, with no `cpu=True` and no patched broadcast in the script"
    res = values(launch(s.ddp_fit, str(tmp_path), init=False))
    assert all(r['backend'] == 'gloo' and r['world'] == 2 for r in res)
    assert res[0]['weights'] == res[1]['weights']

def test_ddp_fit_under_accelerate_launch(tmp_path):
    "The same plain fit under `accelerate launch`: 2 ranks, the same weights"
    accelerate = shutil.which('accelerate', path=str(Path(sys.executable).parent))
    cmd = [accelerate, 'launch', '--multi_gpu', '--num_processes', '2', '--num_machines', '1', '--mixed_precision', 'no',
           '--dynamo_backend', 'no', '--main_process_port', str(free_port())]
    res = values(torchrun_ranks(s.ddp_fit, str(tmp_path), init=False, launcher=cmd, timeout=180))
    assert res[0]['world'] == 2 and res[0]['weights'] == res[1]['weights']

@pytest.mark.parametrize('nproc', [1, 2])
def test_contexts_in_turn(nproc, tmp_path):
    "One Learner fitted in three `distrib_ctx`s in turn, by one process (`WORLD_SIZE=1`, where fastai kept its trainer) and by two: nothing stays of them"
    res = values(ranks(s.contexts_in_turn, str(tmp_path), nproc=nproc, init=False, timeout=180))
    assert all(r['trainers'] == 0 and r['loaders'] == ['TfmdDL', 'TfmdDL'] for r in res)
    assert all(r['weights'] == res[0]['weights'] for r in res)

def test_batchnorm_on_cpu(tmp_path):
    "BatchNorm stays per rank on CPU, and every rank validates, and ends with, rank 0's running statistics"
    res = values(ranks(s.batchnorm_fit, str(tmp_path), init=False, timeout=180))
    assert 'BatchNorm1d' in res[0]['types'] and 'SyncBatchNorm' not in res[0]['types']
    assert res[0]['stats'] == res[1]['stats']

def test_notebook_flow(tmp_path):
    "accelerate's `notebook_launcher` with fastai's `distrib_ctx(in_notebook=True)`, on a machine without CUDA"
    p = subprocess.run([sys.executable, Path(__file__).parent/'notebook_flow.py', str(tmp_path), str(free_port())],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0,r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert r0['world'] == r1['world'] == 2 and r0['backend'] == 'gloo'
    assert r0['weights'] == r1['weights'] and r0['files'] == ['model.pth']
