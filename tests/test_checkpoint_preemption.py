"""`checkpoint` and `signals` (nbs/48_checkpoint.ipynb, nbs/46_signals.ipynb), preemption: a run that survives its cluster:
SIGTERM to torchrun, SIGUSR1 to one rank, an exception on one rank or all, a worker killed under --max-restarts"""
import os, re, sys, json, time, signal, subprocess
from pathlib import Path
import pytest
from ddp_safe_fastai.launch import free_port, kill_tree

SCRIPT = str(Path(__file__).parent/'preempt_script.py')

def torchrun(root, *args, restarts=0, env=None):
    "Start the user's script under torchrun on 2 ranks; the Popen"
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr', '127.0.0.1',
           '--master_port', str(free_port()), *(['--max-restarts', str(restarts)] if restarts else []), SCRIPT, str(root), *map(str, args)]
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(cmd, stdout=open(root.parent/f"{root.name}.log", 'a'), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **(env or {})})

def finish(p, timeout=240):
    "Wait for `p`; kill it and fail, saying so, if it runs past `timeout`"
    try: return p.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid); pytest.fail(f"torchrun still running after {timeout}s")

def results(root): return [json.loads((root/f"result{r}.json").read_text()) for r in range(2)]

def when(cond, timeout=120):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, 'the run never got there'
        time.sleep(0.01)

def resumed_to_the_end(root, resumed_from, uninterrupted):
    "Run the script again in `root`: it resumes from `resumed_from` and ends with the uninterrupted run's weights on both ranks"
    assert finish(torchrun(root)) == 0, (root.parent/f"{root.name}.log").read_text()[-3000:]
    res = results(root)
    assert res[0]['resumed_from'] == resumed_from and res[0]['sha'] == res[1]['sha'] == uninterrupted

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, once):
    "The weights of the run never stopped (made once for both workers)"
    def run():
        root = tmp_path_factory.mktemp('full')/'run'
        assert finish(torchrun(root)) == 0
        res = results(root)
        assert res[0]['sha'] == res[1]['sha'] and res[0]['resumed_from'] is None
        return res[0]['sha']
    return once('checkpoint_preemption.uninterrupted', run)

def _training(root, epoch):
    "Has every rank started a training batch of `epoch` (its log, `batches<rank>.txt`)?"
    logs = [root/f"batches{r}.txt" for r in range(2)]
    return lambda: all(f.is_file() and any(l.split()[0] == str(epoch) for l in f.read_text().splitlines()) for f in logs)

@pytest.mark.parametrize('delay', [0.1, 0.7])
def test_sigterm_to_torchrun_stops_and_resumes(uninterrupted, tmp_path, delay):
    "SIGTERM to torchrun 0.1 s or 0.7 s into the second epoch, after the first checkpoint: every rank stops after one agreed batch within 10 s, checkpoints it and exits 75; run again, it resumes to the uninterrupted weights"
    root = tmp_path/'run'
    p = torchrun(root)
    when(_training(root, 1)); time.sleep(delay)
    p.send_signal(signal.SIGTERM); signalled = time.time()
    finish(p)
    log = (tmp_path/'run.log').read_text()
    assert 'CheckpointCallback: SIGTERM: every rank stopped after batch' in log and 'exit status 75' in log, \
        f"premise: the SIGTERM reached the ranks while they trained\n{log[-2000:]}"
    stopped = max(float((root/f"stopped{r}").read_text()) for r in range(2)) - signalled
    assert stopped < 10, f"every rank stopped after one agreed batch within 10 s of the SIGTERM: {stopped:.1f} s"
    latest = (root/'models/ckpt/latest').read_text()
    assert '_iter_' in latest, f"premise: the stop's checkpoint, of the agreed batch, is inside an epoch: {latest}"
    resumed_to_the_end(root, latest, uninterrupted)

def test_stop_after_an_epochs_last_batch(uninterrupted, tmp_path):
    "The ranks agreed to stop after the last batch of an epoch: run again, that epoch has no batch left and only validates"
    root = tmp_path/'run'
    finish(torchrun(root, env={'STOP_AFTER': '32'}))  # 512 samples, 2 ranks, batches of 8: 32 batches an epoch
    log = (tmp_path/'run.log').read_text()
    assert 'every rank stopped after batch 32 of epoch 0' in log, log[-2000:]
    assert (root/'models/ckpt/latest').read_text() == 'epoch_0000_iter_000032'
    resumed_to_the_end(root, 'epoch_0000_iter_000032', uninterrupted)

def test_exception_on_every_rank_checkpoints(uninterrupted, tmp_path):
    "`on_exception=True`: a batch whose loss raises on every rank: a checkpoint of the batch before, the error raised on every rank, an exact resume"
    root = tmp_path/'run'
    finish(torchrun(root, env={'RAISE_AT': '45'}))
    log = (tmp_path/'run.log').read_text()
    assert 'bad batch 45 on rank 0' in log and 'bad batch 45 on rank 1' in log, log[-3000:]  # each rank's own error
    assert 'terminate called' not in log, log[-3000:]  # no thread left to abort the exit
    assert 'every rank checkpointed batch 13 of epoch 1' in log, log[-3000:]  # 45 = 32 + 13 batches done
    assert (root/'models/ckpt/latest').read_text() == 'epoch_0001_iter_000013'
    resumed_to_the_end(root, 'epoch_0001_iter_000013', uninterrupted)

def test_exception_on_one_rank_ends_the_run(uninterrupted, tmp_path):
    "The loss raises on rank 1 alone: the other rank cannot checkpoint with it; the run ends, the last scheduled checkpoint is kept and resumed"
    root = tmp_path/'run'
    finish(torchrun(root, env={'RAISE_AT': '45', 'RAISE_ON': '1'}), timeout=120)
    ended = time.time()
    log = (tmp_path/'run.log').read_text()
    assert 'bad batch 45 on rank 1' in log and 'no checkpoint of it on rank 1' in log, log[-3000:]
    took = ended - float((root/'raised1').read_text())
    assert took < 90, f"the run ended within 90 s of rank 1's raise, no collective's timeout waited out: {took:.0f} s\n{log[-3000:]}"
    assert (root/'models/ckpt/latest').read_text() == 'epoch_0001'
    assert sorted(p.name for p in (root/'models/ckpt').iterdir()) == ['epoch_0001', 'latest']  # nothing half-made
    resumed_to_the_end(root, 'epoch_0001', uninterrupted)

def test_sigusr1_on_one_rank_stops_every_rank(uninterrupted, tmp_path):
    "SLURM's --signal=USR1@90 reaches a rank's process: the other rank learns it through the store"
    import psutil
    root = tmp_path/'run'
    p = torchrun(root)
    when(_training(root, 1))
    workers = sorted(psutil.Process(p.pid).children(), key=lambda c: c.pid)
    workers[-1].send_signal(signal.SIGUSR1)
    finish(p)
    log = (tmp_path/'run.log').read_text()
    assert 'CheckpointCallback: SIGUSR1: every rank stopped' in log or 'a signal to another rank: every rank stopped' in log, \
        f"premise: the SIGUSR1 reached a rank while the ranks trained\n{log[-2000:]}"
    assert finish(torchrun(root)) == 0
    assert results(root)[0]['sha'] == uninterrupted

def _reached(root, position):
    "Does `latest` name a checkpoint at `position` (epochs done, batches of the next) or past it?"
    def check():
        latest = root/'models/ckpt/latest'
        m = re.fullmatch(r'epoch_(\d+)(?:_iter_(\d+))?', latest.read_text().strip() if latest.is_file() else '')
        return m is not None and (int(m[1]), int(m[2] or 0)) >= position
    return check

@pytest.mark.parametrize('victim', [0, 1])
def test_worker_killed_under_max_restarts_completes(uninterrupted, tmp_path, victim):
    "torchrun restarts the group; the run resumes from its latest complete checkpoint with no code of the user's"
    import psutil
    root = tmp_path/'run'
    p = torchrun(root, 8, restarts=3)
    when(_reached(root, (0, 16)))
    seen = (root/'models/ckpt/latest').read_text()
    sorted(psutil.Process(p.pid).children(), key=lambda c: c.pid)[victim].kill()
    assert finish(p) == 0
    res = results(root)
    assert res[0]['resumed_from'] is not None, f"premise: a checkpoint existed when the worker was killed (latest named {seen})"
    assert res[0]['sha'] == res[1]['sha'] == uninterrupted
