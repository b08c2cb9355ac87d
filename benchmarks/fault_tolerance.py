"""torchft's replica groups under fastai (`FaultTolerance`), measured against torchrun's restarts, on one script
(`tests/ft_train.py`: a synth learner, every training step about `--step` seconds, a pause standing in for the compute).

- The survivors' loss per kill: 3 groups of 1 process under `ddp-safe-ft` (heartbeat 1 s), `--kills` SIGKILLs of a random
  live group at a random step (another group always live); for each kill, the longest pause of a surviving group's steps
  after it, less a step's median. Beside it, the same script under `torchrun --nproc-per-node 3 --max-restarts` with
  `CheckpointCallback(memory_every_iters=1)`: `--restarts` SIGKILLs of a random rank; the seconds from the kill until the
  job is again at the step it was at (every rank stops and starts again).
- A step's cost: the median time between steps of `ddp-safe-ft` with 2 and 3 groups against plain DDP (`torchrun`) with
  2 and 3 processes, interleaved, `--repeats` runs of each.

    .venv-latest/bin/python benchmarks/fault_tolerance.py [--kills 10] [--restarts 5] [--repeats 2] [--step 0.1] [--out FILE.json]"""
import os, sys, json, time, random, signal, argparse, statistics, subprocess, tempfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
SCRIPT,BIN = ROOT/'tests'/'ft_train.py',Path(sys.executable).parent
sys.path.insert(0, str(ROOT/'tests'))
from test_fault_tolerance import log_tail as tail, log_records as records  # the replicas' logs, as the tests read them

def step_time(recs):
    "The median seconds between one process's consecutive steps"
    return statistics.median(b['t'] - a['t'] for a,b in zip(recs, recs[1:]) if b['step'] == a['step'] + 1 and b['pid'] == a['pid'])

def start(cmd, out, **env):
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, env=dict(os.environ, **{k: str(v) for k,v in env.items()}), stdout=open(out/'launcher.out', 'w'), stderr=subprocess.STDOUT)

def ft_kills(root, kills, step, seed):
    "Each kill's cost to the surviving groups, in seconds (the longest pause of their steps after it, less a step)"
    out = root/'ft_kills'
    n = 3 * 8 * int((kills * 8 + 20) / step)  # samples for 3 groups of bs 8: long enough for the kills and the groups' returns
    p = start([str(BIN/'ddp-safe-ft'), '--groups', '3', '--max-restarts', str(kills+5), str(SCRIPT), str(out), '1'], out, N=n, STEP_PAUSE=step)
    rng,done = random.Random(seed),[]
    try:
        while len(done) < kills and p.poll() is None:
            time.sleep(0.05)
            logs = {g: tail(out, f'log{g}_0.jsonl') for g in range(3)}
            live = {g: l[-1] for g,l in logs.items() if l and time.time() - l[-1]['t'] < 3*step and len(l) > 3 and l[0]['pid'] == l[-1]['pid']
                    and l[-1]['pid'] not in {k['pid'] for k in done}}
            if len(live) < 2 or rng.random() > 0.05: continue
            g = rng.choice(list(live))
            os.kill(live[g]['pid'], signal.SIGKILL); done.append(dict(group=g, pid=live[g]['pid'], t=time.time()))
        p.wait(600)
    finally: p.kill()
    logs = {g: records(out, f'log{g}_0.jsonl') for g in range(3)}
    typical = statistics.median(step_time(l) for l in logs.values())
    lost = []
    for k in done:
        after = [b['t'] - a['t'] for g,l in logs.items() if g != k['group'] for a,b in zip(l, l[1:])
                 if a['pid'] == b['pid'] and b['t'] > k['t'] and a['t'] < k['t'] + 10]
        if after: lost.append(max(after) - typical)
    return dict(kills=len(done), step=typical, lost=lost)

def torchrun_restarts(root, restarts, step, seed):
    "Each kill's cost to the whole job under torchrun's restarts with the memory tier: from the kill until a rank is past the step it was at"
    out = root/'torchrun_restarts'
    n = 3 * 8 * int((restarts * 10 + 20) / step)
    p = start([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '3', '--max-restarts', str(restarts+2),
               str(SCRIPT), str(out), '1'], out, N=n, STEP_PAUSE=step, MEMORY=1)
    rng,done = random.Random(seed),[]
    try:
        while len(done) < restarts and p.poll() is None:
            time.sleep(0.05)
            l = tail(out, f'log0_{rng.randrange(3)}.jsonl')
            if not l or time.time() - l[-1]['t'] > 3*step or len(l) < 4 or l[0]['pid'] != l[-1]['pid'] or any(l[-1]['pid'] == k['pid'] for k in done): continue
            if rng.random() > 0.05: continue
            os.kill(l[-1]['pid'], signal.SIGKILL); done.append(dict(pid=l[-1]['pid'], step=l[-1]['step'], t=time.time()))
        p.wait(600)
    finally: p.kill()
    recs = sorted((r for f in out.glob('log0_*.jsonl') for r in records(out, f.name)), key=lambda r: r['t'])
    typical = step_time(records(out, 'log0_0.jsonl'))
    lost = [next(r['t'] for r in recs if r['t'] > k['t'] and r['step'] > k['step']) - k['t'] - typical for k in done]
    return dict(kills=len(done), step=typical, lost=lost)

def step_costs(root, repeats, step):
    "The median seconds a step, per run: plain DDP and `ddp-safe-ft`, 2 and 3, interleaved"
    times = {}
    n_steps = int(15 / step)
    for rep in range(repeats):
        for g in (2, 3):
            for how in ('ddp', 'ft'):
                out = root/f'cost_{how}{g}_{rep}'
                cmd = ([str(BIN/'ddp-safe-ft'), '--groups', str(g), '--min-replicas', str(g)] if how == 'ft' else
                       [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', str(g)])
                start([*cmd, str(SCRIPT), str(out), '1'], out, N=g*8*n_steps, STEP_PAUSE=step).wait(600)
                times.setdefault(f'{how}{g}', []).append(step_time(records(out, 'log0_0.jsonl')[5:]))
    return times

def main():
    a = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    a.add_argument('--kills', type=int, default=10); a.add_argument('--restarts', type=int, default=5)
    a.add_argument('--repeats', type=int, default=2); a.add_argument('--step', type=float, default=0.1)
    a.add_argument('--seed', type=int, default=0); a.add_argument('--out')
    args = a.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        ft = ft_kills(root, args.kills, args.step, args.seed)
        tr = torchrun_restarts(root, args.restarts, args.step, args.seed)
        costs = step_costs(root, args.repeats, args.step)
    med = lambda xs: statistics.median(xs) if xs else float('nan')
    res = dict(ft=ft, torchrun=tr, costs=costs, ratios={g: med(costs[f'ft{g}']) / med(costs[f'ddp{g}']) for g in (2, 3)})
    print(f"survivors' loss per kill, torchft ({ft['kills']} kills, steps of {ft['step']:.3f} s): median {med(ft['lost']):.2f} s, worst {max(ft['lost'], default=float('nan')):.2f} s")
    print(f"the job's loss per kill, torchrun --max-restarts with the memory tier ({tr['kills']} kills): median {med(tr['lost']):.2f} s, worst {max(tr['lost'], default=float('nan')):.2f} s")
    print(f"torchrun's loss against torchft's (medians): {med(tr['lost']) / med(ft['lost']):.1f}x")
    for g in (2, 3): print(f"a step with the quorum, {g} groups, against plain DDP on {g} processes: {res['ratios'][g]:.3f}x "
                           f"({med(costs[f'ft{g}'])*1000:.1f} ms against {med(costs[f'ddp{g}'])*1000:.1f} ms)")
    if args.out: Path(args.out).write_text(json.dumps(res, indent=1))

if __name__ == '__main__': main()
