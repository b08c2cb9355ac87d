"""`core` (nbs/04_core.ipynb), the process group's lifetime: saves and loads where there is no process group: before any
exists (a launcher started the ranks, nobody made one yet) and after fastai's notebook flow or the user ended it.
Every rank must end with rank 0's weights, and a rerun in the same folder must never load the previous run's files"""
import sys, json, subprocess
from pathlib import Path
import pytest
import core_group_lifetime_scenarios as g, fastai_examples as fe
from conftest import values, accelerate_cmd, torchvision_imports, ranks
from ddp_safe_fastai.launch import torchrun_ranks, spawn_ranks, free_port, kill_tree

HERE = Path(__file__).parent
APPS = ['image_classification', 'segmentation', 'text_classification', 'tabular', 'collab', 'keypoints']

def notebook_cell(app, root, seed, timeout=300):
    "One cell of fastai's `distributed_app_examples` notebook on 2 CPU ranks; every rank's report"
    for f in Path(root).glob('rank*.json'): f.unlink()
    p = subprocess.Popen([sys.executable, HERE/'fastai_examples.py', app, str(root), str(free_port()), str(seed)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try: out,_ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid)
        done = sorted(f.name for f in Path(root).glob('rank*.json'))
        pytest.fail(f"{app}: still running after {timeout}s; reports written: {done} (a rank without one was stuck)")
    assert p.returncode == 0, out[-5000:]
    return [json.loads((Path(root)/f'rank{r}.json').read_text()) for r in (0, 1)]

def holds_rank0s(r0, r1, keys=('loaded', 'exported')):
    "Every rank ends with rank 0's weights, although each one's differed before the save"
    assert r0['mine'] != r1['mine']
    for k in keys: assert r0[k] == r1[k] == r0['mine'], (k, r0, r1)

TWICE = ['tabular']  # run again in the same folder, where the last run's files are (the fastest cell)

@pytest.mark.parametrize('app', APPS)
def test_notebook_cell(app, tmp_path):
    "A cell of fastai's notebook, then save, load, export and `load_learner` on every rank (twice in one folder for some)"
    if app in ('image_classification', 'segmentation', 'keypoints') and not torchvision_imports():
        pytest.skip("torchvision runs in the 'latest' environment")
    first = notebook_cell(app, tmp_path, seed=1)
    holds_rank0s(*first)
    if app not in TWICE: return
    second = notebook_cell(app, tmp_path, seed=2)
    holds_rank0s(*second)
    assert second[0]['mine'] != first[0]['mine'] and second[1]['loaded'] != first[1]['loaded']  # not the last run's file

def checks(r0, r1, fresh):
    holds_rank0s(r0, r1)
    assert r0['dls'] == r1['dls'] > 0
    assert r0['best'] == r1['best']  # SafeSaveModelCallback's reload gives every rank rank 0's best model
    # CSVLogger: rank 0 writes, every rank reads it; in the folder of a finished run, CheckpointCallback resumes its end
    assert r0['log'] == r1['log'] and len(r0['log']) == int(fresh)

@pytest.mark.parametrize('launcher', ['torchrun', 'accelerate'])
def test_before_any_group(launcher, tmp_path):
    "Saves and loads before anything made a process group, a DDP fit, saves after it; under torchrun, again in the folder"
    runs = []
    for seed in ((1, 2) if launcher == 'torchrun' else (1,)):  # again in the same folder: one launcher is enough
        launch = accelerate_cmd() if launcher == 'accelerate' else None
        r0,r1 = values(torchrun_ranks(g.before_and_after, str(tmp_path), seed, init=False, launcher=launch, timeout=240))
        assert not r0['before']['group'] and not r1['before']['group']
        for k in ('before', 'after'): checks(r0[k], r1[k], fresh=seed == 1)
        assert r0['before']['encoder'] == r1['before']['encoder'] and r0['before']['mine_encoder'] != r1['before']['mine_encoder']
        runs.append((r0, r1))
    if len(runs) > 1: assert runs[1][1]['before']['loaded'] != runs[0][1]['before']['loaded']

def test_after_user_ends_group(tmp_path):
    "Under `mp.spawn`: a DDP fit, `destroy_process_group()`, then saves and loads; then the same again in the folder"
    runs = []
    for seed in (1, 2):
        r0,r1 = values(spawn_ranks(g.after_destroy, str(tmp_path), seed, timeout=240))
        checks(r0['after'], r1['after'], fresh=seed == 1)
        runs.append((r0, r1))
    assert runs[1][1]['after']['loaded'] != runs[0][1]['after']['loaded']

def test_groups_formed_one_after_another(tmp_path):
    "Under `mp.spawn`: 30 times a save and a load, then `destroy_process_group()`: every group is a new one on every rank"
    r0,r1 = values(spawn_ranks(g.groups_one_after_another, str(tmp_path), 1, timeout=120, env=dict(DDP_SAFE_TIMEOUT='20')))
    assert r0['groups'] == r1['groups'] == 30  # each rank noticed each new group (before: not one whose id was the last's)
    assert r0['loaded'] == r1['loaded'] and len(set(r0['loaded'])) == 30  # each load is rank 0's save of that round

@pytest.mark.parametrize('script', ['distrib_py', 'train_imagenette_py', 'train_imdbclassifier'])
def test_fastai_script(script, tmp_path):
    "fastai's scripts for torchrun, on small data, then save, load, export and `load_learner` (by default) on every rank"
    if script in ('distrib_py', 'train_imagenette_py') and not torchvision_imports(): pytest.skip("torchvision runs in the 'latest' environment")
    r0,r1 = values(ranks(getattr(fe, script), str(tmp_path), init=False, timeout=300))
    assert r0['world'] == r1['world'] == 2
    holds_rank0s(r0, r1)
