"""SLURM requeues at random moments, measured: `tests/slurm_train.py` as a batch job of 2 tasks (`srun`, no torchrun)
on the one-node cluster of `tools/slurm.sh`, each job signalled with `scancel --signal=USR1` at a random batch: inside an
epoch, 3 batches before an epoch's end (the ranks stop at its last batch or the next one's first, while the epoch's
checkpoint is written in the background), or twice in one job. Each job checkpoints,
requeues itself and resumes; the table gives the batch it was signalled at, the restarts, the seconds from the signal
to training again, and whether it ended bit for bit as the uninterrupted job.

    tools/slurm.sh start /tmp/slurm && SLURM_CONF=/tmp/slurm/slurm.conf .venv-latest/bin/python benchmarks/slurm_requeues.py [--trials 10]"""
import sys, time, random, argparse, tempfile, subprocess
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
from test_checkpoint_slurm import submit, job, finished, wait_until, trained

BATCHES = 6  # per rank and epoch in `slurm_train.py`: 96 samples, batches of 8, 2 ranks
LAST = 4*BATCHES - 5  # the last batch to signal at: the ranks stop a few batches later (3 at 0.3 s a batch), before the job's end

def signal_at(root, jobid, n, restarts):
    "Signal the job once every rank has trained `n` batches in its run number `restarts`; seconds to training again"
    wait_until(lambda: int(job(jobid).get('Restarts', 0)) == restarts and trained(root, n, restarts), 180, f"job {jobid} at batch {n}")
    subprocess.run(['scancel', '--signal=USR1', jobid], check=True)
    t = time.monotonic()
    wait_until(lambda: int(job(jobid).get('Restarts', 0)) > restarts and job(jobid).get('JobState') == 'RUNNING', 180, f"job {jobid} requeued")
    return time.monotonic() - t

def trial(kind, rng, weights):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        jobid = submit(root, delay=0.3)
        at = {'inside an epoch': [rng.choice([n for n in range(2, LAST) if n % BATCHES])],
              'at an epoch end': [BATCHES*rng.randint(1, 3) - 3],
              'twice': sorted(rng.sample(range(2, LAST), 2))}[kind]
        again = [signal_at(root, jobid, n, i) for i,n in enumerate(at)]
        j,reports = finished(jobid, root)
        same = j['JobState'] == 'COMPLETED' and [r['weights'] for r in reports] == [weights]*2
        return at, int(j.get('Restarts', 0)), again, same

if __name__ == '__main__':
    p = argparse.ArgumentParser(); p.add_argument('--trials', type=int, default=10); p.add_argument('--seed', type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as d:
        j,reports = finished(submit(Path(d)), Path(d))
        weights = reports[0]['weights']
    kinds = ['inside an epoch', 'at an epoch end', 'twice']
    print("| trial | signalled | after batch | restarts | seconds from the signal to training again | bitwise = uninterrupted |")
    print("|---|---|---|---|---|---|")
    ok = 0
    for i in range(a.trials):
        kind = kinds[i % len(kinds)]
        at,restarts,again,same = trial(kind, rng, weights)
        ok += same
        print(f"| {i+1} | {kind} | {', '.join(map(str, at))} | {restarts} | {', '.join(f'{s:.1f}' for s in again)} | {'yes' if same else 'NO'} |", flush=True)
    print(f"{ok} of {a.trials} ended bit for bit as the uninterrupted job")
