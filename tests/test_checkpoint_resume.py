"""`checkpoint` (nbs/48_checkpoint.ipynb), resume: a DDP run killed with SIGKILL on every rank resumes, with the same
command, to bitwise the same weights"""
import sys, time, random
from pathlib import Path
import pytest
import checkpoint_resume_scenarios as s
from conftest import values, ranks
from ddp_safe_fastai.checkpoint_dir import latest_complete, is_complete

def _run(root, kill_when=None, hold_third_write=False):
    "`resume_fit` on two ranks; with `kill_when`, they wait after the fit for the kill, which then always lands"
    return ranks(s.resume_fit, str(root), 4, 1500, hold_third_write, kill_when is not None,
                 init=False, timeout=300, kill_when=kill_when)

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, once):
    "The weights of the run never killed (made once for both workers)"
    def run():
        res = values(_run(tmp_path_factory.mktemp('full')))
        assert res[0]['sha'] == res[1]['sha'] and res[0]['resumed_from'] is None and res[0]['epochs'] == 4
        return res[0]['sha']
    return once('checkpoint_resume.uninterrupted', run)

def _after_second_checkpoint(root, frac):
    """True `frac` epochs after the second checkpoint was committed (an epoch timed between the first two commits): the
    times are the run's own, its manifests' (each checkpoint's commit marker), noted while the rotation keeps them"""
    committed = {}
    def check():
        for name in ('epoch_0001', 'epoch_0002'):
            try: committed.setdefault(name, (Path(root)/'models/ckpt'/name/'manifest.json').stat().st_mtime)
            except FileNotFoundError: pass
        if len(committed) < 2: return False
        epoch = committed['epoch_0002'] - committed['epoch_0001']
        return time.time() - committed['epoch_0002'] >= frac * epoch
    return check

def _during_third_write(root):
    "True while the third checkpoint's state is being written"
    return lambda: any((Path(root)/'models/ckpt/epoch_0003').glob('.state.pth.*.tmp'))

@pytest.mark.parametrize('trial', range(3))
def test_killed_at_random_resumes_bitwise(uninterrupted, tmp_path, trial):
    "Every rank SIGKILLed at a random moment after the second checkpoint: run again, it resumes from a complete checkpoint to bitwise the uninterrupted weights"
    random.seed(trial)
    # two epochs remain after the second checkpoint: a kill within 1.8 epochs of it lands before the end, if the epochs
    # keep their pace, and otherwise after the fourth checkpoint: the resume from it is the run's end
    assert _run(tmp_path, _after_second_checkpoint(tmp_path, random.uniform(0, 1.8))) is None, \
        "premise: the ranks were killed, timed from the commits of the first two checkpoints"
    assert latest_complete(tmp_path/'models/ckpt') is not None
    res = values(_run(tmp_path))
    assert res[0]['resumed_from'] in ('epoch_0002', 'epoch_0003', 'epoch_0004')
    assert res[0]['sha'] == res[1]['sha'] == uninterrupted

def test_killed_during_checkpoint_write_resumes_bitwise(uninterrupted, tmp_path):
    "Every rank SIGKILLed while the third checkpoint is written: that checkpoint is incomplete and never used; the resume from the second ends bitwise the same"
    assert _run(tmp_path, _during_third_write(tmp_path), hold_third_write=True) is None
    assert not is_complete(tmp_path/'models/ckpt/epoch_0003'), "premise: the kill landed inside the third checkpoint's write"
    res = values(_run(tmp_path))
    assert res[0]['resumed_from'] == 'epoch_0002'   # the third checkpoint was incomplete: never used
    assert res[0]['sha'] == res[1]['sha'] == uninterrupted

@pytest.mark.parametrize('cbset', ['trackers', 'two_fits'])
def test_resume_matrix(cbset):
    "One random SIGKILL of a set of `benchmarks/resume_matrix.py` (dropout, random augmentation), resumed: identical"
    sys.path.insert(0, str(Path(__file__).parent.parent/'benchmarks'))
    import resume_matrix
    assert resume_matrix.main(['--trials', '1', '--set', cbset, '--seed', '1'], ranks=ranks) == 0

def _within_epoch(root, name):
    "True once `latest` names the checkpoint `name`, taken inside an epoch"
    return lambda: (Path(root)/'models/ckpt/latest').is_file() and (Path(root)/'models/ckpt/latest').read_text() == name

@pytest.mark.parametrize('at', ['epoch_0001_iter_000006', 'epoch_0002_iter_000003'])
def test_killed_within_an_epoch_resumes_at_its_next_batch(tmp_path, at):
    "Checkpoints every 3 batches; every process killed once one inside an epoch is complete: bitwise the same"
    full = values(ranks(s.resume_within_epoch, str(tmp_path/'full'), init=False, timeout=300))
    assert full[0]['sha'] == full[1]['sha'] and full[0]['resumed_from'] is None
    assert ranks(s.resume_within_epoch, str(tmp_path/'cut'), 3, at, init=False, timeout=300,  # held at `at` until killed
                 kill_when=_within_epoch(tmp_path/'cut', at)) is None
    res = values(ranks(s.resume_within_epoch, str(tmp_path/'cut'), init=False, timeout=300))
    assert res[0]['resumed_from'] == at
    for r,f in zip(res, full): assert r == {**f, 'resumed_from': at}  # weights, losses, learning rates, metrics
