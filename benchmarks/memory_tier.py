"""The memory tier, measured: 2 CPU ranks under torchrun, `tests/memory_script.py` (dropout, noise on the inputs,
`fit_one_cycle`, 3 epochs of 32 batches a rank, a durable checkpoint every epoch).

- `--kills` SIGKILLs of a random rank at a random training batch under `torchrun --max-restarts 2`, with
  `memory_every_iters=5`: the batches done again (the killed one counted; max over the ranks), the seconds from the kill
  to training again and their parts on rank 0 (torchrun's restart to the worker's start, its imports, the Learner, the
  process group and DDP up to a first barrier, the ranks' agreement on a checkpoint, its read, the rest of `before_fit`
  and the first batch's start), the tier resumed from, whether the run ends with the uninterrupted weights (sha256), whether anything of the
  run is left in memory; beside it, what the durable checkpoints alone would redo (every batch since the epoch's start);
- the cost, in one run: fits of 12 epochs (384 batches a rank) of a wider model (`--width`, default 1024: 12 MiB of
  weights and optimizer state) with `memory_every_iters` 1, 10 and 100, without, and without but with one copy of the
  state after every batch ("one copy"), and without but with the least a memory checkpoint after every batch does
  ("least": `LeastCheckpoint` in `tests/memory_script.py`, the tier's work without its layout, checks, manifest and
  rotation), interleaved: the fit's time against the plain one's, and rank 0's CPU time
  against the plain fit's; on rank 0 (a node's writer), the CPU of each memory checkpoint in every thread of the tier
  (`CheckpointCallback.memory_cost`) against one copy of the same tensors into memory already there. That copy is taken
  where a checkpoint takes its state, after each batch of the "one copy" fit (the median); beside it, as it was measured
  before, one copy in the same process after the fit, its cache flushed (the median of 20), which varies between runs
  with whether the other rank copies at the same time; rank 0's peak resident memory (`ru_maxrss`, which counts the tmpfs
  pages it maps) and its peak private memory (RssAnon + RssFile, sampled every 20 ms).

    .venv-latest/bin/python benchmarks/memory_tier.py [--kills 20] [--seed 0] [--repeats 2] [--out FILE.json]"""
import sys, json, random, argparse, tempfile, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
from test_memory_tier import torchrun, results, redone, memory

BATCHES,COST_EPOCHS = 96,12  # training batches a rank over the 3 epochs of a kill trial; epochs of a fit of the cost

def recovery_parts(root, victim):
    "Seconds from the kill to training again on rank 0, in parts: torchrun's restart, imports, the Learner and the group, the agreement, the read, the rest"
    lines = [l.split() for l in (root/f"batches{victim}.txt").read_text().splitlines()]
    killed_at = max(float(t) for a,_,t in lines if a == '0')
    again = min(float(t) for a,_,t in (l.split() for l in (root/'batches0.txt').read_text().splitlines()) if a == '1')
    t = json.loads((root/'times0_1.json').read_text())
    parts = dict(restart=t['started'] - killed_at, imports=t['imported'] - t['started'], group=t['ready'] - t['imported'],
                 agreement=t.get('agreement', 0.), read=t.get('read', 0.))
    parts['rest'] = again - t['ready'] - parts['agreement'] - parts['read']
    return again - killed_at, parts

def kill_trial(d, i, rng, full, every=5):
    root,victim,at = Path(d)/f"kill{i}",rng.randrange(2),rng.randrange(1, BATCHES)
    rc = torchrun(root, every, restarts=2, epochs=3, KILL_AT=str(at), KILL_RANK=str(victim))
    res = results(root) if rc == 0 else [{}]
    seconds,parts = recovery_parts(root, victim)
    return dict(victim=victim, kill_at=at, redone=max(redone(root, r) for r in range(2)), durable_alone=at % 32 + 1,
                seconds=seconds, parts=parts, tier=res[0].get('tier'), same=res[0].get('sha') == full and rc == 0,
                left_in_memory=memory(root).exists())

def cost(d, repeats, width):
    arms = {'plain': 0, 'one copy': 0, 'least': 0, 'N=100': 100, 'N=10': 10, 'N=1': 1}
    saves = lambda a: arms[a] or a == 'least'  # the arms that checkpoint into memory
    out = {a: [] for a in arms}
    for r in range(repeats):
        for a,n in arms.items():
            root = Path(d)/f"cost_{a.replace(' ', '_')}_{r}"
            assert torchrun(root, n, epochs=COST_EPOCHS, timeout=900, WIDTH=str(width), COPY='1' if saves(a) else '',
                            COPY_EACH='1' if a == 'one copy' else '', LEAST='1' if a == 'least' else '') == 0
            out[a].append(results(root)[0])
    med = lambda a, f: statistics.median(f(x) for x in out[a])
    copy_ms = med('one copy', lambda x: x['copy_each_ms'])  # one copy of the state, where a checkpoint takes it
    rows = {}
    for a,n in arms.items():
        rows[a] = dict(fit_seconds=med(a, lambda x: x['seconds']), ratio=med(a, lambda x: x['seconds'])/med('plain', lambda x: x['seconds']),
                       cpu_ratio=med(a, lambda x: x['cpu'])/med('plain', lambda x: x['cpu']),  # rank 0's CPU seconds: the fit's work, without what the machine's neighbours take
                       peak_rss_mb=med(a, lambda x: x['maxrss_mb']), peak_private_mb=med(a, lambda x: x['private_peak_mb']),
                       fits=[(round(x['seconds'], 3), round(x['cpu'], 3)) for x in out[a]])  # each fit's seconds and rank 0's CPU seconds, in the order run
        if saves(a):
            c = lambda x: x['memory_cost']
            rows[a].update(checkpoints=med(a, lambda x: c(x)['checkpoints']), cpu_ms_per_checkpoint=med(a, lambda x: c(x)['training_ms'] + c(x)['writer_ms'] + c(x)['handoff_ms']),
                           training_ms=med(a, lambda x: c(x)['training_ms']), writer_ms=med(a, lambda x: c(x)['writer_ms']), handoff_ms=med(a, lambda x: c(x)['handoff_ms']),
                           one_copy_ms=copy_ms, one_copy_flushed_ms=med(a, lambda x: x['copy_ms']))
            rows[a]['cpu_per_checkpoint_vs_one_copy'] = rows[a]['cpu_ms_per_checkpoint']/copy_ms
            rows[a]['cpu_per_checkpoint_vs_one_copy_flushed'] = rows[a]['cpu_ms_per_checkpoint']/rows[a]['one_copy_flushed_ms']
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
        names = ['restart', 'imports', 'group', 'agreement', 'read', 'rest']
        if trials: print("| rank | batch | redone | durable alone | s to training | " + ' | '.join(names) + " | tier | same | left |\n|" + "---|"*(8+len(names)))
        for t in trials: print(f"| {t['victim']} | {t['kill_at']} | {t['redone']} | {t['durable_alone']} | {t['seconds']:.2f} | " +
                               ' | '.join(f"{t['parts'][n]:.3f}" for n in names) + f" | {t['tier']} | {t['same']} | {t['left_in_memory']} |")
        if trials:
            med = {n: statistics.median(t['parts'][n] for t in trials) for n in names}
            total = statistics.median(t['seconds'] for t in trials)
            share = statistics.median((t['parts']['agreement'] + t['parts']['read'])/t['seconds'] for t in trials)
            print(f"max batches redone {max(t['redone'] for t in trials)} (N+1 = 6); all the same weights: {all(t['same'] for t in trials)}; "
                  f"nothing left in memory: {not any(t['left_in_memory'] for t in trials)}; median s to training {total:.2f}; "
                  f"medians of the parts: " + ', '.join(f"{n} {v:.3f}" for n,v in med.items()) + f"; agreement and read: {share:.1%} of the recovery (median)")
        report['kills'] = trials
        if a.repeats:
            report['cost'] = cost(d, a.repeats, a.width)
            for k,v in report['cost'].items(): print(k, {n: (round(x, 3) if isinstance(x, float) else x) for n,x in v.items()})
    if a.out: Path(a.out).write_text(json.dumps(report, indent=1))
