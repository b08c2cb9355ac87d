"""`checkpoint` (nbs/48_checkpoint.ipynb), a resume on another world size: a run killed at an epoch's end or inside an
epoch resumes under `torchrun` on another number of ranks, one node or two, with dropout, augmentation and
`fit_one_cycle`; on the same number, bit for bit"""
import json
from collections import Counter
from pathlib import Path
import pytest
import checkpoint_world_size_scenarios as s
from conftest import values, ranks
from ddp_safe_fastai.launch import torchrun_ranks

EVERY = {1: 6, 2: 3, 3: 2}  # a checkpoint every half epoch: 96 samples in batches of 8, dealt to 1, 2 or 3 ranks

def _run(root, nproc, run, stop_at=None, every=None, n=96, **kw):
    Path(root).mkdir(exist_ok=True)
    stop = Path(root)/'stop'
    run_on = torchrun_ranks if kw else ranks  # nodes of their own, or an elastic run: the launcher's
    return run_on(s.any_world_fit, str(root), run, every, stop_at, n, init=False, nproc=nproc, timeout=300,
                  kill_when=(stop.exists if stop_at else None), **kw)

def _samples(root):
    return [json.loads(l) for l in (Path(root)/'samples.jsonl').read_text().splitlines()]

def fed_twice_and_never(lines, n):
    "Samples of one epoch fed more than once, and never: `lines` of `SampleLog`"
    c = Counter(i for l in lines for i in l['samples'])
    return sum(v-1 for v in c.values()), n - len(c)

def interrupted_epoch(root, epoch, done, n=96):
    "(fed twice, never) in `epoch`: batches up to `done` of the first run, and all of the resumed run's"
    lines = [l for l in _samples(root) if l['epoch'] == epoch and
             (l['iter'] < done if l['run'] == 'first' and l['attempt'] == 0 else True)]
    return fed_twice_and_never(lines, n)

def _resumed_batches(root, rank=0):
    "Batches rank `rank` trained after the resume, per epoch"
    return dict(Counter(l['epoch'] for l in _samples(root) if (l['run'] == 'again' or l['attempt']) and l['rank'] == rank))

def _kill_then_resume(root, before, after, where, n=96):
    every = EVERY[before]
    stop_at = (2,) if where == 'epoch' else (1, every)
    assert _run(root, before, 'first', stop_at, every, n) is None  # every process SIGKILLed after the checkpoint
    res = values(_run(root, after, 'again', every=EVERY.get(after), n=n))
    assert res[0]['resumed_from'] == ('epoch_0002' if where == 'epoch' else f"epoch_0001_iter_{every:06d}")
    assert len({r['sha'] for r in res}) == 1 and res[0]['epochs'] == 4  # the same weights on every rank, 4 epochs
    assert res[0]['pct_train'] == pytest.approx(1)  # the schedule ended where it ends
    return res

@pytest.mark.parametrize('where', ['epoch', 'batch'])
@pytest.mark.parametrize('before,after', [(2, 1), (2, 3), (3, 2), (1, 2)])
def test_resume_on_another_world_size(tmp_path, before, after, where):
    "Killed on `before` ranks at an epoch's end or inside an epoch, resumed on `after`: the same weights on every rank, the schedule to its end, the batches left to train; inside an epoch, each of its samples fed once"
    _kill_then_resume(tmp_path, before, after, where)
    trained = _resumed_batches(tmp_path)
    per_epoch = 96//8//after
    if where == 'epoch': assert trained == {2: per_epoch, 3: per_epoch}
    else:
        assert trained == {1: per_epoch//2, 2: per_epoch, 3: per_epoch}  # the other half of the interrupted epoch
        last = max(l['iter'] for l in _samples(tmp_path) if l['run'] == 'again' and l['epoch'] == 1)
        assert last == per_epoch-1  # the resumed epoch counted its batches to its last one
        assert interrupted_epoch(tmp_path, 1, EVERY[before]) == (0, 0)

def test_same_world_size_stays_bitwise(tmp_path):
    "Killed inside an epoch and resumed on the same 2 ranks: bitwise the uninterrupted run's weights and metrics"
    full = values(_run(tmp_path/'full', 2, 'full', every=3))
    res = _kill_then_resume(tmp_path/'cut', 2, 2, 'batch')
    assert res[0]['sha'] == full[0]['sha'] and res[0]['values'] == full[0]['values']

def test_uneven_remainder_pads_and_drops_as_fastai(tmp_path):
    "100 samples: 2 ranks leave 52 to 3 ranks, which fastai pads to 54 and trains in whole batches of 8"
    _kill_then_resume(tmp_path, 2, 3, 'batch', n=100)
    twice,never = interrupted_epoch(tmp_path, 1, 3, n=100)
    assert twice <= 3-1 and never <= 2*2 + 3*(8-1)  # fastai's padding; its `drop_last` on 2 ranks, then on 3

@pytest.mark.parametrize('where', ['epoch', 'batch'])
def test_two_nodes_then_one(tmp_path, where):
    "`torchrun --nnodes 1:2`, a rank on each of two agents: one agent killed after a checkpoint, the other restarts alone and resumes"
    stop_at,name = ((2,), 'epoch_0002') if where == 'epoch' else ((1, 3), 'epoch_0001_iter_000003')
    res = values(torchrun_ranks(s.any_world_fit, str(tmp_path), 'first', 3, stop_at, 96, 'peer', init=False, nproc=1, nnodes=2,
                                timeout=300, node_dies_when=(tmp_path/'stop').exists))
    assert len(res) == 1 and res[0]['world'] == 1 and res[0]['resumed_from'] == name
    assert res[0]['epochs'] == 4 and res[0]['pct_train'] == pytest.approx(1)
    if where == 'epoch': assert _resumed_batches(tmp_path) == {2: 12, 3: 12}
    else:
        assert interrupted_epoch(tmp_path, 1, 3) == (0, 0)
        assert _resumed_batches(tmp_path) == {1: 6, 2: 12, 3: 12}

def test_two_interruptions_in_one_epoch(tmp_path):
    "Stopped inside epoch 1 on 2 ranks, resumed on 1 and stopped again inside it, resumed on 2: every sample once"
    assert _run(tmp_path, 2, 'first', (1, 3), 3) is None
    (tmp_path/'stop').unlink()
    assert _run(tmp_path, 1, 'second', (1, 8), 2) is None  # batches 6 and 7 of 12 on one rank
    (tmp_path/'stop').unlink()
    res = values(_run(tmp_path, 2, 'again', every=3))
    assert res[0]['resumed_from'] == 'epoch_0001_iter_000008' and res[0]['sha'] == res[1]['sha']
    lines = [l for l in _samples(tmp_path) if l['epoch'] == 1 and l['iter'] < dict(first=3, second=8, again=6)[l['run']]]
    assert fed_twice_and_never(lines, 96) == (0, 0)
    assert _resumed_batches(tmp_path) == {1: 2, 2: 6, 3: 6}
