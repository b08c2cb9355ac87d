"""`checkpoint_dir` (nbs/32_checkpoint_dir.ipynb), formats: the checkpoint format is versioned. Checkpoints written by
0.1.0 (format 1) and 0.2 (format 2) are kept here, and must load as they were written and resume alike on any
machine; a newer format is refused on every rank, naming both; `ddp-safe-check inspect`"""
import json, shutil, subprocess, sys
from pathlib import Path
import pytest
import checkpoint_world_size_scenarios as s
from conftest import values, ranks
from ddp_safe_fastai.train_state import FORMAT

DATA = Path(__file__).parent/'data'

def _with_checkpoints(root, fmt):
    "`root`, holding the kept checkpoints of format `fmt` where `CheckpointCallback` looks"
    shutil.copytree(DATA/f"ckpt_format{fmt}", Path(root)/'models/ckpt')
    return root

def _run(root, nproc, every=3, as_loaded=False):
    return values(ranks(s.any_world_fit, str(root), 'again', every, None, 96, 600, as_loaded, init=False, nproc=nproc, timeout=300))

@pytest.mark.parametrize('fmt', [1, 2])
def test_kept_checkpoint_resumes_bitwise(tmp_path, fmt):
    """A kept checkpoint of format 1 or 2 loads as it was written (the weights, the optimizer's state and each rank's
    random state, bit for bit), and two resumes from it end alike, bit for bit: what is the same on every machine, unlike
    a float the uninterrupted run computes, which a CPU of another kind may compute otherwise"""
    first,second = [_run(_with_checkpoints(tmp_path/run, fmt), 2, as_loaded=True) for run in ('first', 'second')]
    for res in (first, second):
        assert [r['resumed_from'] for r in res] == ['epoch_0001_iter_000003']*2, res
        assert [r['as_loaded'] for r in res] == [dict(model=True, opt=True, rng=True)]*2, res
        assert res[0]['sha'] == res[1]['sha'], res  # the ranks agree
    assert first[0]['sha'] == second[0]['sha'] and first[0]['values'] == second[0]['values']

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
    res = ranks(s.any_world_fit, str(root), 'again', 3, init=False, nproc=2, timeout=300)
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
