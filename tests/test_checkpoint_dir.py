"""`checkpoint_dir` (nbs/41_checkpoint_dir.ipynb), formats: the checkpoint format is versioned. Checkpoints written by
0.1.0 (format 1) and by this release (format 2) are kept here, and must load; a newer format is refused on every
rank, naming both; `ddp-safe-check inspect`"""
import json, shutil, subprocess, sys
from pathlib import Path
import pytest
import checkpoint_world_size_scenarios as s
from conftest import values
from ddp_safe_fastai.launch import torchrun_ranks
from ddp_safe_fastai.train_state import FORMAT

DATA = Path(__file__).parent/'data'

def _with_checkpoints(root, fmt):
    "`root`, holding the kept checkpoints of format `fmt` where `CheckpointCallback` looks"
    shutil.copytree(DATA/f"ckpt_format{fmt}", Path(root)/'models/ckpt')
    return root

def _run(root, nproc, every=3):
    return values(torchrun_ranks(s.any_world_fit, str(root), 'again', every, init=False, nproc=nproc, timeout=300))

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    "The run those checkpoints were taken from, uninterrupted: 2 ranks, a checkpoint every 3 batches"
    return _run(tmp_path_factory.mktemp('full'), 2)[0]

@pytest.mark.parametrize('fmt', [1, 2])
def test_kept_checkpoint_resumes_bitwise(tmp_path, uninterrupted, fmt):
    "A kept checkpoint of format 1 or 2 resumes to bitwise the uninterrupted run's weights and metrics"
    res = _run(_with_checkpoints(tmp_path, fmt), 2)
    assert res[0]['resumed_from'] == 'epoch_0001_iter_000003'
    assert res[0]['sha'] == res[1]['sha'] == uninterrupted['sha'] and res[0]['values'] == uninterrupted['values']

def test_format1_resumes_on_three_ranks(tmp_path):
    "A format 1 checkpoint taken on 2 ranks resumes on 3, with the same weights on every rank"
    res = _run(_with_checkpoints(tmp_path, 1), 3, every=2)
    assert res[0]['resumed_from'] == 'epoch_0001_iter_000003' and len({r['sha'] for r in res}) == 1

def test_newer_format_is_refused_on_every_rank(tmp_path):
    "A checkpoint of a newer format: `CheckpointFormatError` on every rank, naming both formats and the version that wrote it; no file changed"
    root = _with_checkpoints(tmp_path, 2)
    for m in (root/'models/ckpt').glob('*/manifest.json'):
        m.write_text(json.dumps({**json.loads(m.read_text()), 'format': FORMAT+1, 'library': '9.9.9'}))
    before = {p: p.read_bytes() for p in (root/'models/ckpt').rglob('*') if p.is_file()}
    res = torchrun_ranks(s.any_world_fit, str(root), 'again', 3, init=False, nproc=2, timeout=300)
    for o in res:
        assert o.error_type == 'CheckpointFormatError'
        assert f"format {FORMAT+1} (written by ddp_safe_fastai 9.9.9)" in o.error and f"reads formats 1 to {FORMAT}" in o.error
    assert {p: p.read_bytes() for p in (root/'models/ckpt').rglob('*') if p.is_file()} == before  # nothing lost

def test_inspect_says_what_a_resume_takes(tmp_path):
    "`ddp-safe-check inspect`: what `latest` names, a damaged checkpoint marked INCOMPLETE, the one a resume takes; exit status 2 where there is no directory"
    root = _with_checkpoints(tmp_path, 1)/'models/ckpt'
    (root/'epoch_0001_iter_000003'/'rng.pth').write_bytes(b'damaged')
    out = subprocess.run([Path(sys.executable).parent/'ddp-safe-check', 'inspect', str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "latest names 'epoch_0001_iter_000003'" in lines[0]
    assert 'INCOMPLETE: rng.pth has 7 bytes' in next(l for l in lines[2:] if 'epoch_0001_iter_000003' in l)
    assert next(l for l in lines[2:] if 'epoch_0001 ' in l).startswith('->')
    assert lines[-1] == 'a resume takes epoch_0001 (saved on 2 rank(s))'
    assert subprocess.run([Path(sys.executable).parent/'ddp-safe-check', 'inspect', str(tmp_path/'nothing')], capture_output=True).returncode == 2
