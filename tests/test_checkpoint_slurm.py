"""`checkpoint` and `signals` under SLURM (nbs/48_checkpoint.ipynb, nbs/46_signals.ipynb; `srun` as a launcher:
nbs/04_core.ipynb): ranks started by `srun` train as one DDP run, and a job that is signalled or preempted
checkpoints, requeues itself and resumes, ending bit for bit as the uninterrupted job. Real jobs on the one-node
cluster that `tools/slurm.sh` starts (SLURM_CONF names it)"""
import os, re, sys, json, time, subprocess
from pathlib import Path
import pytest
from ddp_safe_fastai.launch import free_port

HERE = Path(__file__).parent
pytestmark = pytest.mark.skipif(not os.environ.get('SLURM_CONF'), reason="needs the SLURM cluster of `tools/slurm.sh start DIR` "
                                "(SLURM_CONF=DIR/slurm.conf); tools/test.sh starts it")

TORCHRUN = f"{sys.executable} -m torch.distributed.run --nproc_per_node 2 --master_addr 127.0.0.1 --master_port {{port}}"

def submit(root, tasks=2, delay=0.0, partition='main', torchrun=None, tasks_requeued=None, requeue='--requeue', hold_after=None):
    """Submit the training script as a batch job: `srun` starts `tasks` ranks (`tasks_requeued` once the job is requeued),
    or one `torchrun` (its options given) that starts 2; `hold_after`: in its first run, the ranks hold after that batch
    until a signal's stop is agreed (no "no progress" exit while they wait)"""
    root.mkdir(parents=True, exist_ok=True)
    script = root/'job.sh'
    ntasks = f'--ntasks=$([ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ] && echo {tasks_requeued} || echo {tasks}) ' if tasks_requeued else ''
    start = f"--ntasks=1 --cpus-per-task=2 {TORCHRUN.format(port=free_port())} {torchrun}" if torchrun is not None else ntasks + sys.executable
    script.write_text(f"""#!/bin/bash
#SBATCH --ntasks={1 if torchrun is not None else tasks} --cpus-per-task={2 if torchrun is not None else 1}
#SBATCH --partition={partition} {requeue} --open-mode=append --output={root}/job.out
export DDP_SAFE_TIMEOUT=60 OMP_NUM_THREADS=1{f" HOLD_AFTER={hold_after} DDP_SAFE_STOP_TIMEOUT=300" if hold_after else ''}
srun {start} {HERE/'slurm_train.py'} {root} {delay}
""")
    out = subprocess.run(['sbatch', '--parsable', str(script)], capture_output=True, text=True, check=True).stdout
    return out.strip().split(';')[0]

def job(jobid):
    "The job's fields as `scontrol show job` gives them (a finished job stays listed for `MinJobAge`)"
    out = subprocess.run(['scontrol', 'show', 'job', jobid], capture_output=True, text=True).stdout
    return dict(re.findall(r'(\w+)=(\S*)', out))

def wait_until(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (v := cond()): return v
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s")

def finished(jobid, root, timeout=240):
    "Wait for the job to end; its state, and every rank's report"
    def ended():
        j = job(jobid)
        return j if j.get('JobState') in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY') else None
    try: j = wait_until(ended, timeout, f"job {jobid}")
    except AssertionError:
        subprocess.run(['scancel', jobid])
        raise AssertionError(f"job {jobid} did not end within {timeout}s; ranks that trained: "
                             f"{sorted(p.name for p in root.glob('batches.*'))}\n{(root/'job.out').read_text()[-3000:]}")
    reports = [json.loads(p.read_text()) for p in sorted(root.glob('rank*.json'))]
    return j, reports

def trained(root, n, run=0):
    "Has every rank trained at least `n` batches in the job's run number `run` (0, then 1 once requeued...)?"
    got = [tuple(map(int, p.read_text().split() or (-1, 0))) for p in root.glob('batches.*')]
    return len(got) == 2 and all(r == run and i >= n for r,i in got)

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    "The job run without a signal: the weights every other job must end with"
    root = tmp_path_factory.mktemp('uninterrupted')
    j,reports = finished(submit(root), root)
    assert j['JobState'] == 'COMPLETED', (root/'job.out').read_text()[-3000:]
    return root,reports

def test_srun_is_a_launcher(uninterrupted):
    "`srun` of 2 tasks, no torchrun: one run of 2 ranks, identical weights, one copy of each file"
    root,reports = uninterrupted
    assert [r['world'] for r in reports] == [2, 2] and [r['rank'] for r in reports] == [0, 1]
    assert reports[0]['weights'] == reports[1]['weights']
    ckpts = sorted(p.name for p in (root/'models'/'ckpt').iterdir())
    assert ckpts == ['epoch_0003', 'epoch_0004', 'latest'], ckpts
    assert not list(root.rglob('*.tmp*')), list(root.rglob('*.tmp*'))

def requeued_job(root, signal_job, **kwargs):
    """A job signalled while it trains (held after batch 8 until the stop is agreed), which checkpoints, requeues and runs
    again: the seconds from the signal to the job running again, the reports at its end, and its output"""
    jobid = submit(root, delay=0.3, hold_after=8, **kwargs)
    wait_until(lambda: trained(root, 7), 120, f"job {jobid} training")
    t = time.monotonic()
    signal_job(jobid)
    wait_until(lambda: int(job(jobid).get('Restarts', 0)) >= 1 and job(jobid).get('JobState') == 'RUNNING', 120, f"job {jobid} requeued")
    again = time.monotonic() - t
    j,reports = finished(jobid, root)
    log = (root/'job.out').read_text()
    assert j['JobState'] == 'COMPLETED' and int(j['Restarts']) == 1, log[-3000:]
    assert 'requeued: it resumes from this checkpoint' in log and 'resumed from' in log, log[-3000:]
    return again,reports,log

def requeued_run(root, uninterrupted, signal_job, **kwargs):
    "A job signalled while it trains: it checkpoints, requeues, runs again and ends as the uninterrupted one"
    again,reports,log = requeued_job(root, signal_job, **kwargs)
    assert [r['restarts'] for r in reports] == [1, 1]
    assert reports[0]['weights'] == reports[1]['weights'] == uninterrupted[1][0]['weights']  # bit for bit
    return again

def test_usr1_requeues(uninterrupted, tmp_path):
    "`scancel --signal=USR1 JOB`, as `--signal=USR1@90` sends it before the time limit"
    again = requeued_run(tmp_path, uninterrupted, lambda j: subprocess.run(['scancel', '--signal=USR1', j], check=True))
    print(f"signal to running again: {again:.1f}s")

def test_preemption_requeues(uninterrupted, tmp_path):
    "A job of a higher partition takes the node: the tasks get SIGTERM, checkpoint and requeue, and resume after it"
    urgent = []
    def preempt(j):
        (tmp_path/'urgent').mkdir()
        script = tmp_path/'urgent'/'job.sh'
        script.write_text(f"#!/bin/bash\n#SBATCH --ntasks=2 --partition=urgent --output={tmp_path}/urgent/job.out\nsleep 1\n")
        urgent.append(subprocess.run(['sbatch', '--parsable', str(script)], capture_output=True, text=True, check=True).stdout.strip())
    requeued_run(tmp_path, uninterrupted, preempt)
    assert job(urgent[0]).get('JobState') == 'COMPLETED'

@pytest.mark.parametrize('signals', ['default', 'SIGUSR1 handled'])
def test_srun_torchrun_requeues(uninterrupted, tmp_path, signals):
    """`srun torchrun`, one task running torchrun's 2 ranks, SIGUSR1 to the step: by default torchrun dies of it, its store
    with it, and the ranks stop through a store of their own; with `--signals-to-handle` it forwards it to its ranks"""
    handle = '--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1' if signals != 'default' else ''
    requeued_run(tmp_path, uninterrupted, lambda j: subprocess.run(['scancel', '--signal=USR1', j], check=True), torchrun=handle)

def test_requeued_on_fewer_tasks(uninterrupted, tmp_path):
    "A job requeued with 1 task where it had 2 (its script asks for fewer): the one process resumes the 2 ranks' checkpoint"
    _,reports,log = requeued_job(tmp_path, lambda j: subprocess.run(['scancel', '--signal=USR1', j], check=True), tasks_requeued=1)
    stopped = re.search(r'every rank stopped after batch (\d+) of epoch (\d+)', log)
    assert stopped and f"epoch {stopped[2]} of 4, batch {stopped[1]}" in log, log[-3000:]  # resumed where it stopped
    assert 'was saved on 2 rank(s), this run has 1' in log, log[-3000:]
    assert [(r['rank'], r['world'], r['restarts']) for r in reports] == [(0, 0, 1)], reports
    ckpts = sorted(p.name for p in (tmp_path/'models'/'ckpt').iterdir())
    resumed = f"epoch_{int(stopped[2]):04d}_iter_{int(stopped[1]):06d}"  # kept through the fit that resumed from it
    assert ckpts == sorted([resumed, 'epoch_0003', 'epoch_0004', 'latest']), ckpts

def test_requeue_refused_keeps_the_checkpoint(tmp_path):
    "A job submitted with `--no-requeue`: SLURM refuses the requeue; the message says so and what to do, the checkpoint stays"
    jobid = submit(tmp_path, delay=0.3, requeue='--no-requeue', hold_after=8)
    wait_until(lambda: trained(tmp_path, 7), 120, f"job {jobid} training")
    subprocess.run(['scancel', '--signal=USR1', jobid], check=True)
    j,_ = finished(jobid, tmp_path)
    log = (tmp_path/'job.out').read_text()
    assert j['JobState'] == 'FAILED' and j['ExitCode'] == '75:0' and int(j['Restarts']) == 0, (j, log[-3000:])
    assert f"SLURM job {jobid} was not requeued (" in log and f"requeue it with `scontrol requeue {jobid}` or submit it again" in log, log[-3000:]
    latest = (tmp_path/'models'/'ckpt'/'latest').read_text()
    assert '_iter_' in latest, f"premise: the signal's checkpoint, inside an epoch, is the latest: {latest}"
    assert (tmp_path/'models'/'ckpt'/latest/'state.pth').is_file(), latest

