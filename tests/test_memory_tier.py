"""`memory_tier` and `checkpoint` (nbs/34_memory_tier.ipynb, nbs/48_checkpoint.ipynb): checkpoints in node memory. A rank
SIGKILLed under `torchrun --max-restarts` costs at most `memory_every_iters`+1 batches and ends bit for bit as the
uninterrupted run; a run killed on every rank resumes from memory when run again, and from its directory when memory
was wiped, holds a checkpoint cut short, is of another world size, or the directory is another run's"""
import os, sys, json, shutil, subprocess
from pathlib import Path
import pytest
from ddp_safe_fastai.launch import free_port, kill_tree
from ddp_safe_fastai.memory_tier import MemoryCheckpoints
from conftest import needs_mounts

SCRIPT = str(Path(__file__).parent/'memory_script.py')
EVERY = 5

def torchrun(root, every=EVERY, nproc=2, restarts=0, timeout=240, epochs=2, prefix=(), **env):
    "Run the script under torchrun as a user does (after `prefix`); its exit status (a run past `timeout` is killed and fails the test)"
    cmd = [*prefix, sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(nproc), '--master_addr', '127.0.0.1',
           '--master_port', str(free_port()), '--max-restarts', str(restarts), SCRIPT, str(root), str(every), str(epochs)]
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent/f"{root.name}.log", 'a') as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env})
        try: return p.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid); pytest.fail(f"torchrun still running after {timeout}s (ranks logged up to: {logged(root)})")

def logged(root): return {f.name: f.read_text().splitlines()[-1:] for f in root.glob('batches*.txt')}
def log(root): return (root.parent/f"{root.name}.log").read_text()
def results(root, nproc=2): return [json.loads((root/f"result{r}.json").read_text()) for r in range(nproc)]
def memory(root): return MemoryCheckpoints((root/'models/ckpt').absolute()).folder

def redone(root, rank):
    "The training batches done again after the kill (the killed one counted), from the batches each attempt started"
    lines = [l.split() for l in (root/f"batches{rank}.txt").read_text().splitlines()]
    first = [int(i) for a,i,_ in lines if a == '0'],[int(i) for a,i,_ in lines if a != '0']
    return sum(i >= first[1][0] for i in first[0])

pytestmark = pytest.mark.xdist_group('memory tier')  # one worker: the module's runs are made once

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    "The weights of the run without memory checkpoints (those of every run with them, killed or not, must be the same)"
    plain = tmp_path_factory.mktemp('plain')/'run'
    assert torchrun(plain, every=0) == 0, log(plain)[-3000:]
    res = results(plain)
    assert res[0]['sha'] == res[1]['sha']
    return res[0]['sha']

@pytest.mark.parametrize('victim,at,background', [(1, 43, True), (0, 58, False)])
def test_killed_rank_costs_at_most_n_plus_1_batches(uninterrupted, tmp_path, victim, at, background):
    "torchrun restarts the workers after one is SIGKILLed: they resume from memory, redo at most N+1 batches, end bit for bit (`async_save` or not)"
    root = tmp_path/'run'
    assert torchrun(root, restarts=2, KILL_AT=str(at), KILL_RANK=str(victim), ASYNC=str(int(background))) == 0, log(root)[-3000:]
    res = results(root)
    assert [r['tier'] for r in res] == ['memory']*2 and res[0]['sha'] == res[1]['sha'] == uninterrupted
    assert '(node memory)' in log(root)
    assert all(1 <= redone(root, r) <= EVERY+1 for r in range(2)), [redone(root, r) for r in range(2)]
    assert not memory(root).exists()  # removed as the fit ended

@pytest.fixture(scope='module')
def killed(tmp_path_factory):
    "A run whose every rank was SIGKILLed at batch 43: its directory (epoch_0001 complete) and its memory (batch 40), copied aside"
    root = tmp_path_factory.mktemp('killed')/'run'
    assert torchrun(root, KILL_AT='43', KILL_RANK='all') != 0
    assert MemoryCheckpoints((root/'models/ckpt').absolute()).latest()[0] == 'epoch_0001_iter_000008', \
        f"premise: the memory checkpoint of batch 40 was whole when the ranks were killed\n{log(root)[-3000:]}"
    assert (root/'models/ckpt/latest').read_text().strip() == 'epoch_0001', log(root)[-3000:]
    aside = root.parent/'aside'
    shutil.copytree(root, aside/'run'); shutil.copytree(memory(root), aside/'memory')
    yield root, aside
    shutil.rmtree(memory(root), ignore_errors=True)

def restore(killed):
    "The killed run's directory and memory as the kill left them"
    root,aside = killed
    shutil.rmtree(root); shutil.rmtree(memory(root), ignore_errors=True)
    shutil.copytree(aside/'run', root); shutil.copytree(aside/'memory', memory(root))
    return root

def check(*args):
    "`ddp-safe-check ARGS`, as a user runs it: what it printed"
    out = subprocess.run([sys.executable, '-m', 'ddp_safe_fastai.check', *map(str, args)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out
    return out.stdout

def again(killed, tmp_path, change=lambda root, mem: None, nproc=2):
    "The killed run's directory and memory as the kill left them, `change`d; the same command run again: its results"
    root = restore(killed)
    change(root, memory(root))
    assert torchrun(root, nproc=nproc) == 0, log(root)[-3000:]
    assert not memory(root).exists()
    return results(root, nproc)

def test_run_again_resumes_from_memory(uninterrupted, killed, tmp_path):
    "`ddp-safe-check inspect` shows both tiers and which one a resume takes; the same command run again takes it"
    def inspected(root, mem):
        said = check('inspect', root/'models/ckpt')
        assert f"node memory ({mem}): 1 checkpoint(s); latest names 'epoch_0001_iter_000008'" in said, said
        assert "a resume on 2 rank(s) takes epoch_0001_iter_000008 from node memory" in said, said
    res = again(killed, tmp_path, inspected)
    assert res[0]['resumed_from'] == 'epoch_0001_iter_000008' and res[0]['tier'] == 'memory' and res[0]['sha'] == uninterrupted

def test_memory_wiped_resumes_from_the_directory(uninterrupted, killed, tmp_path):
    "After a reboot memory is empty"
    res = again(killed, tmp_path, lambda root, mem: shutil.rmtree(mem))
    assert res[0]['resumed_from'] == 'epoch_0001' and res[0]['tier'] == 'disk' and res[0]['sha'] == uninterrupted

def _cut(f, keep=100):
    with open(f, 'r+b') as out: out.truncate(keep)

@pytest.mark.parametrize('damage', [
    lambda ckpt: _cut(ckpt/'tensors'),  # the raw tensors, shorter than the manifest says
    lambda ckpt: _cut(ckpt/'tensors', (ckpt/'tensors').stat().st_size - 1),  # a byte short
    lambda ckpt: _cut(ckpt/'state.pkl'),
    lambda ckpt: (ckpt/'state.pkl').write_bytes(b'x'*(ckpt/'state.pkl').stat().st_size),  # its size, not its checksum
    lambda ckpt: (ckpt/'manifest.json').unlink(),  # a write killed before its manifest: its tensors may be whole, or not
], ids=['tensors cut', 'tensors a byte short', 'state cut', 'state changed', 'no manifest'])
def test_half_written_memory_checkpoint_is_refused(uninterrupted, killed, tmp_path, damage):
    "A memory checkpoint that a killed write left half-written, or that was damaged, is refused: the run resumes from its directory, bit for bit"
    res = again(killed, tmp_path, lambda root, mem: damage(mem/'epoch_0001_iter_000008'))
    assert res[0]['resumed_from'] == 'epoch_0001' and res[0]['tier'] == 'disk' and res[0]['sha'] == uninterrupted

def test_another_runs_memory_checkpoint_is_refused(uninterrupted, killed, tmp_path):
    "The directory deleted and trained into again is another run: it starts afresh, whatever memory holds"
    res = again(killed, tmp_path, lambda root, mem: shutil.rmtree(root/'models'))
    assert res[0]['resumed_from'] is None and res[0]['sha'] == uninterrupted

def test_another_world_size_takes_the_directory(killed, tmp_path):
    "One rank: the memory checkpoint of two is another job's; the directory's resumes, as on any world size"
    res = again(killed, tmp_path, nproc=1)
    assert res[0]['resumed_from'] == 'epoch_0001' and res[0]['tier'] == 'disk'

def test_memory_of_runs_gone_is_listed_and_removed(killed):
    "`ddp-safe-check memory` lists a killed run's memory checkpoint; once its directory is gone, `--remove` removes it"
    root = restore(killed)
    said = check('memory')
    assert f"{memory(root)}: {(root/'models/ckpt').absolute()}, epoch_0001_iter_000008" in said and 'its run may resume from it' in said, said
    shutil.rmtree(root/'models')
    assert f"{memory(root)}: {(root/'models/ckpt').absolute()}, epoch_0001_iter_000008" in check('memory', '--remove')
    assert not memory(root).exists()

def test_a_bad_memory_dir_on_one_rank_is_said_on_every_rank(tmp_path):
    """Rank 1's `memory_dir` holds a folder of the library's name that is not its user's alone (mode 0777): both ranks
    raise the same error, which names the folder and the rank, as the fit starts; none waits for the other"""
    root,bad = tmp_path/'run',tmp_path/'shm'
    (bad/f"ddp_safe_fastai-{os.getuid()}").mkdir(parents=True); os.chmod(bad/f"ddp_safe_fastai-{os.getuid()}", 0o777)
    assert torchrun(root, EVERY, timeout=180, MEMORY_DIR_1=str(bad), DDP_SAFE_TIMEOUT='900') != 0  # a rank left waiting: killed after 180 s, and the test fails
    said = f"CheckpointCallback memory checkpoints: failed on rank(s) [1]: memory checkpoints in {bad}/ddp_safe_fastai-{os.getuid()}: it belongs to uid"
    assert {l.split(']')[0] + ']' for l in log(root).splitlines() if said in l and 'yours alone' in l} == {'[rank0]', '[rank1]'}, log(root)[-3000:]
    assert all(f.read_text() == '' for f in root.glob('batches*.txt'))  # no batch trained
    assert (bad/f"ddp_safe_fastai-{os.getuid()}").is_dir()  # nothing of it removed

@needs_mounts
def test_a_node_without_room_says_so_once(tmp_path):
    """A tmpfs of 256 KiB for a state of 3 MiB: the node's writer says so once, at the first memory checkpoint, and
    writes no more; the training and its durable checkpoints go on"""
    root,tiny = tmp_path/'run',tmp_path/'tiny'
    tiny.mkdir()
    mount = 'mount --make-rprivate / && mount -t tmpfs -o size=256k tmpfs "$0" && exec "$@"'
    assert torchrun(root, prefix=['unshare', '-m', 'sh', '-c', mount, str(tiny)], WIDTH='512', MEMORY_DIR=str(tiny)) == 0, log(root)[-3000:]
    said = log(root)
    assert said.count('CheckpointCallback: no more memory checkpoints on') == 1, said[-3000:]
    assert 'bytes free, a memory checkpoint needs' in said and '(rank 0) in this fit' in said, said[-3000:]
    assert (root/'models/ckpt/latest').read_text().strip() == 'epoch_0002'
    assert results(root)[0]['sha'] == results(root)[1]['sha']
