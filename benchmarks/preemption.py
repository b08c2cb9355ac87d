"""Preemption, measured: 2 ranks under torchrun on CPU, `tests/preempt_script.py` (dropout, random noise on the
inputs, `fit_one_cycle`, 3 epochs of 32 batches of at least 20 ms).

- SIGTERM to the torchrun agent at `--trials` random moments: seconds from the signal to the end of every process,
  the batch the ranks stopped after, and whether the re-run ends with the uninterrupted run's weights (sha256);
- one worker SIGKILLed at random moments under `torchrun --max-restarts 3`, checkpoints every 8 batches: whether the
  run completes by itself with the same weights;
- the cost of watching for signals, and of checkpoints every 8 batches: an epoch's time with and without, one run.

    .venv-latest/bin/python benchmarks/preemption.py [--trials 10]"""
import sys, time, random, signal, argparse, tempfile, statistics, subprocess
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
import psutil
from test_checkpoint_preemption import torchrun, results

def wait(p):
    try: return p.wait(300)
    except subprocess.TimeoutExpired: p.kill(); return 'timeout'

def run_time(root, *args, extra=()):
    t = time.monotonic(); assert wait(torchrun(root, *args)) == 0; return time.monotonic() - t

def sigterm_trial(root, full, rng):
    p = torchrun(root)
    while not (root/'models/ckpt/latest').is_file(): time.sleep(0.01)   # past the start-up: training is under way
    time.sleep(rng.uniform(0, 1.5))
    p.send_signal(signal.SIGTERM); t = time.monotonic(); wait(p); stopped = time.monotonic() - t
    at = (root/'models/ckpt/latest').read_text()
    wait(torchrun(root))
    return stopped, at, results(root)[0]['sha'] == results(root)[1]['sha'] == full

def restart_trial(root, full, rng):
    p = torchrun(root, 8, restarts=3)
    while not (root/'models/ckpt/latest').is_file(): time.sleep(0.01)
    time.sleep(rng.uniform(0, 1.5))
    victim = rng.choice(sorted(psutil.Process(p.pid).children(), key=lambda c: c.pid))
    victim.kill(); code = wait(p)
    if code != 0: return code, None, False
    return code, results(root)[0]['resumed_from'], results(root)[0]['sha'] == results(root)[1]['sha'] == full

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0]); ap.add_argument('--trials', type=int, default=10)
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--parts', nargs='+', default=['sigterm', 'restart', 'cost']); a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        run_time(d/'full'); full = results(d/'full')[0]['sha']
        rows = [sigterm_trial(d/f"term{i}", full, rng) for i in range(a.trials if 'sigterm' in a.parts else 0)]
        if rows: stops = sorted(s for s,_,_ in rows)
        if rows: print(f"SIGTERM to torchrun, {a.trials} random moments: stopped in {stops[0]:.2f}-{stops[-1]:.2f} s "
              f"(median {statistics.median(stops):.2f} s); checkpoints {[at for _,at,_ in rows]}; "
              f"re-run bitwise equal: {sum(ok for _,_,ok in rows)}/{a.trials}")
        rows = [restart_trial(d/f"kill{i}", full, rng) for i in range(a.trials if 'restart' in a.parts else 0)]
        if rows: print(f"one worker SIGKILLed under --max-restarts 3, {a.trials} random moments: completed by itself "
              f"{sum(c == 0 for c,_,_ in rows)}/{a.trials}, resumed from {[r for _,r,_ in rows]}, bitwise equal "
              f"{sum(ok for _,_,ok in rows)}/{a.trials}")
        per = {}
        for name,args in [('checkpoints per epoch, no signal watch', (0, 0, 0)), ('with the signal watch', (0, 1, 0)),
                          ('and checkpoints every 8 batches', (8, 1, 0))]:
            if 'cost' in a.parts: per[name] = min(run_time(d/f"cost{name[:5]}{k}", *args) and results(d/f"cost{name[:5]}{k}")[0]['seconds'] for k in range(3))
        if per: base = per['checkpoints per epoch, no signal watch']
        if per: print('cost (3 epochs of 32 batches, fastest of 3 runs): ' + '; '.join(f"{k}: {v:.2f} s ({v/base:.3f}x)" for k,v in per.items()))
