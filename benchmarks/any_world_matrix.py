"""Resumes on another world size, as a matrix: a run of `tests/checkpoint_world_size_scenarios.any_world_fit` (dropout,
noise, `fit_one_cycle`, 96 samples in batches of 8) SIGKILLed under `torchrun` after a checkpoint at an epoch's end
or inside an epoch, resumed on another world size; what the resume trained, and the samples of the interrupted epoch
fed twice or never. Not part of the tests, which assert the same cases (`tests/test_checkpoint_world_size.py`); run
`../.venv-latest/bin/python any_world_matrix.py` from here."""
import sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
from test_checkpoint_world_size import _run, _kill_then_resume, _resumed_batches, interrupted_epoch, EVERY, s, values, torchrun_ranks

def one_node(before, after, where):
    with tempfile.TemporaryDirectory() as d:
        res = _kill_then_resume(Path(d), before, after, where)
        return res, _resumed_batches(d), (interrupted_epoch(d, 1, EVERY[before]) if where == 'batch' else None)

def two_nodes_to_one(where):
    with tempfile.TemporaryDirectory() as d:
        stop_at = (2,) if where == 'epoch' else (1, 3)
        res = values(torchrun_ranks(s.any_world_fit, d, 'first', 3, stop_at, 96, 5, init=False, nproc=1, nnodes=2,
                                    timeout=300, node_dies_when=(Path(d)/'stop').exists))
        return res, _resumed_batches(d), (interrupted_epoch(d, 1, 3) if where == 'batch' else None)

def uninterrupted(nproc):
    with tempfile.TemporaryDirectory() as d: return values(_run(d, nproc, 'full', every=EVERY[nproc]))[0]

def main():
    full = {n: uninterrupted(n) for n in (1, 2, 3)}
    print("| ranks | killed after | resumed from | batches trained after the resume (rank 0, by epoch) | interrupted epoch: "
          "fed twice / never | weights equal on every rank | bitwise = uninterrupted run on the new world size |")
    print('|---|---|---|---|---|---|---|')
    cases = [(f"{b} -> {a}", w, lambda b=b, a=a, w=w: one_node(b, a, w)) for b,a in [(2, 1), (2, 3), (3, 2), (1, 2), (2, 2)]
             for w in ('epoch', 'batch')] + [("2 nodes -> 1 (--nnodes 1:2)", w, lambda w=w: two_nodes_to_one(w)) for w in ('epoch', 'batch')]
    for name, where, run in cases:
        res, batches, fed = run()
        n = res[0]['world']
        print(f"| {name} | {'2 epochs' if where == 'epoch' else 'half of epoch 2'} | {res[0]['resumed_from']} | "
              f"{dict(sorted(batches.items()))} | {'-' if fed is None else f'{fed[0]} / {fed[1]}'} | "
              f"{'yes' if len({r['sha'] for r in res}) == 1 else 'NO'} | {'yes' if res[0]['sha'] == full[n]['sha'] else 'no'} |", flush=True)

if __name__ == '__main__': main()
