"""`applications` (nbs/51_applications.ipynb): the four fastai applications in `examples/`, run as users run them, under
torchrun and accelerate launch"""
import os, sys, json, time, subprocess
from pathlib import Path
import pytest
from ddp_safe_fastai.launch import free_port, kill_tree
from conftest import torchvision_imports

EXAMPLES = Path(__file__).parent.parent/'examples'
BIN = Path(sys.executable).parent

def launch_cmd(launcher, script, path):
    port = str(free_port())
    if launcher == 'torchrun':
        return [BIN/'torchrun', '--nproc_per_node', '2', '--master_addr', '127.0.0.1', '--master_port', port, script, path]
    return [BIN/'accelerate', 'launch', '--multi_gpu', '--num_processes', '2', '--main_process_port', port, script, path]

def run_example(launcher, app, path, timeout=420):
    "Run `examples/{app}.py` on 2 CPU ranks; its report, or a failure with the end of what the ranks printed"
    log = Path(path).parent/f'{Path(path).name}.log'
    t = time.monotonic()
    with open(log, 'w') as f:
        p = subprocess.Popen([str(c) for c in launch_cmd(launcher, EXAMPLES/f'{app}.py', path)], stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, 'DDP_SAFE_TIMEOUT': '60'})
        try: p.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            pytest.fail(f"{app} under {launcher} still running after {timeout}s (a stuck meeting names its missing "
                        f"rank within 60s):\n{log.read_text()[-4000:]}")
    assert p.returncode == 0, f"{app} under {launcher} failed:\n{log.read_text()[-6000:]}"
    rep = json.loads((Path(path)/'report.json').read_text())
    rep['seconds'] = time.monotonic() - t
    return rep

CKPT = ['manifest.json', 'model.pth', 'rng.pth', 'state.pth']
def ckpts(name, epochs): return [f'models/{name}/epoch_{e:04d}/{f}' for e in epochs for f in CKPT] + [f'models/{name}/latest']

FILES = {  # what each example leaves: one copy of each file, written by rank 0 alone, no temporaries
    'vision': ['digits/dls.pkl', 'export.pkl', *ckpts('ckpt', [4, 5]), 'models/model.pth'],
    'tabular': ['dls.pkl', 'export.pkl', *ckpts('ckpt', [3, 4]), 'models/model.pth'],
    'collab': ['dls.pkl', 'export.pkl', *ckpts('ckpt', [3, 4]), 'models/model.pth'],
    'text': ['dls.pkl', 'export.pkl', *ckpts('ckpt', [2, 3]), 'models/encoder.pth', 'models/lm.pth',
             *ckpts('lm_ckpt', [1, 2]), 'models/model.pth'],
}

@pytest.mark.parametrize('launcher', ['torchrun', 'accelerate'])
@pytest.mark.parametrize('app', list(FILES))
def test_application(app, launcher, tmp_path):
    "Each example on 2 ranks: every rank ends with the best model's weights and gives one prediction; one copy of each file, written by rank 0 alone, no temporaries"
    if app == 'vision' and not torchvision_imports():
        pytest.skip("torchvision does not import beside this environment's torch (the dev environment's small CPU "
                    "wheel): the vision example runs in the 'latest' environment")
    rep = run_example(launcher, app, tmp_path/app)
    print(f"{app} under {launcher}: {rep['seconds']:.1f}s, weights {rep['best']}")
    assert rep['world'] == 2
    assert rep['identical_weights'], rep['ranks']      # every rank ends with the same weights...
    assert rep['weights_are_best'], rep                # ...those of the best model saved, reloaded at the end
    assert rep['same_prediction'], rep['ranks']        # load_learner + predict give one answer on every rank
    assert all(r['dls_items'] == rep['ranks'][0]['dls_items'] > 0 for r in rep['ranks'])  # dls.save after training
    assert rep['files'] == sorted(FILES[app]), rep['files']
