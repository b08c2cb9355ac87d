"""The memory tier, measured: 2 CPU ranks under torchrun, `tests/memory_script.py` (dropout, noise on the inputs,
`fit_one_cycle`, 3 epochs of 32 batches a rank, a durable checkpoint every epoch).

- `--kills` SIGKILLs of a random rank at a random training batch under `torchrun --max-restarts 2`, with
  `memory_every_iters=5`: the batches done again (the killed one counted; max over the ranks), the seconds from the kill
  to training again, the tier resumed from, whether the run ends with the uninterrupted weights (sha256), whether
  anything of the run is left in memory; beside it, what the durable checkpoints alone would redo (every batch since the
  epoch's start);
- the cost, in one run: fits of 12 epochs (384 batches a rank) of a wider model (`--width`, default 1024: 12 MiB of
  weights and optimizer state) with `memory_every_iters` 1, 10 and 100 and without, interleaved: the fit's time against the plain one's, rank 0's CPU per memory checkpoint beyond the plain fit's,
  and rank 0's peak resident memory.

    .venv-latest/bin/python benchmarks/memory_tier.py [--kills 20] [--seed 0] [--repeats 2] [--out FILE.json]"""
import sys, json, random, argparse, tempfile, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
from test_memory_tier import torchrun, results, redone, memory

BATCHES,COST_EPOCHS = 96,12  # training batches a rank over the 3 epochs of a kill trial; epochs of a fit of the cost

def kill_trial(d, i, rng, full, every=5):
    root,victim,at = Path(d)/f"kill{i}",rng.randrange(2),rng.randrange(1, BATCHES)
    rc = torchrun(root, every, restarts=2, epochs=3, KILL_AT=str(at), KILL_RANK=str(victim))
    res = results(root) if rc == 0 else [{}]
    lines = [l.split() for l in (root/f"batches{victim}.txt").read_text().splitlines()]
    killed_at = max(float(t) for a,_,t in lines if a == '0')
    again = min(float(t) for a,_,t in lines if a == '1')
    return dict(victim=victim, kill_at=at, redone=max(redone(root, r) for r in range(2)), durable_alone=at % 32 + 1,
                seconds=again - killed_at, tier=res[0].get('tier'), same=res[0].get('sha') == full and rc == 0,
                left_in_memory=memory(root).exists())

def cost(d, repeats, width):
    arms = {'plain': 0, 'N=100': 100, 'N=10': 10, 'N=1': 1}
    out = {a: [] for a in arms}
    for r in range(repeats):
        for a,n in arms.items():
            root = Path(d)/f"cost_{a}_{r}"
            assert torchrun(root, n, epochs=COST_EPOCHS, WIDTH=str(width)) == 0
            out[a].append(results(root)[0])
    med = lambda a, k: statistics.median(x[k] for x in out[a])
    rows = {}
    for a,n in arms.items():
        saves = 32*COST_EPOCHS // n if n else 0
        rows[a] = dict(fit_seconds=med(a, 'seconds'), ratio=med(a, 'seconds')/med('plain', 'seconds'),
                       cpu_ms_per_memory_checkpoint=(med(a, 'cpu') - med('plain', 'cpu'))/saves*1000 if saves else None,
                       peak_rss_mb=med(a, 'maxrss_mb'))
    return rows

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--kills', type=int, default=20); p.add_argument('--seed', type=int, default=0)
    p.add_argument('--repeats', type=int, default=2); p.add_argument('--width', type=int, default=1024)
    p.add_argument('--out', default=None)
    a = p.parse_args()
    rng,report = random.Random(a.seed),{}
    with tempfile.TemporaryDirectory() as d:
        if a.kills:
            assert torchrun(Path(d)/'full', 0, epochs=3) == 0
            full = results(Path(d)/'full')[0]['sha']
        trials = [kill_trial(d, i, rng, full) for i in range(a.kills)]
        if trials: print(f"{'rank':>4} {'batch':>6} {'redone':>7} {'durable alone':>14} {'s to training':>14} {'tier':>7} {'same':>5} {'left':>5}")
        for t in trials: print(f"{t['victim']:>4} {t['kill_at']:>6} {t['redone']:>7} {t['durable_alone']:>14} {t['seconds']:>14.2f} {t['tier']!s:>7} {t['same']!s:>5} {t['left_in_memory']!s:>5}")
        if trials: print(f"max batches redone {max(t['redone'] for t in trials)} (N+1 = 6); all the same weights: {all(t['same'] for t in trials)}; "
              f"nothing left in memory: {not any(t['left_in_memory'] for t in trials)}; median s to training {statistics.median(t['seconds'] for t in trials):.2f}")
        report['kills'] = trials
        if a.repeats:
            report['cost'] = cost(d, a.repeats, a.width)
            for k,v in report['cost'].items(): print(k, {n: (round(x, 3) if isinstance(x, float) else x) for n,x in v.items()})
    if a.out: Path(a.out).write_text(json.dumps(report, indent=1))
