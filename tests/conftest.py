"Multi-process tests start real ranks the two ways users do: `torchrun`, and `torch.multiprocessing.spawn` with no launcher environment"
import os, importlib, subprocess, pytest
from ddp_safe_fastai.launch import spawn_ranks, torchrun_ranks

os.environ.setdefault('DDP_SAFE_TIMEOUT', '60')  # a stuck meeting fails a test within a minute, naming the ranks

@pytest.fixture(params=['torchrun', 'spawn'])
def launch(request):
    "Run a scenario on real ranks; `init=False` leaves the process group to fastai's `distrib_ctx` (torchrun only)"
    def run(f, *args, nproc=2, timeout=120, init=True, env=None):
        if request.param == 'spawn': return spawn_ranks(f, *args, nproc=nproc, timeout=timeout, env=env)
        return torchrun_ranks(f, *args, nproc=nproc, timeout=timeout, init=init, env=env)
    run.name = request.param
    return run

def values(outcomes):
    "The value of every rank, failing with every rank's error if any rank raised"
    bad = [o for o in outcomes if not o.ok]
    assert not bad, '\n'.join(f"{o!r}\n{getattr(o, 'traceback', '')}" for o in bad)
    return [o.value for o in outcomes]

def torchvision_imports():
    "Does torchvision import here (not beside the 'dev' environment's small CPU torch)?"
    try: importlib.import_module('torchvision'); return True
    except Exception: return False

def _can_mount():
    "Can this process make a mount namespace of its own and bind-mount in it (root)?"
    return subprocess.run(['unshare', '-m', 'true'], capture_output=True).returncode == 0

needs_mounts = pytest.mark.skipif(not _can_mount(), reason="needs mount namespaces (root): each simulated node or "
                                  "process mounts a disk of its own")

def own_disks(tmp_path, nnodes=2):
    "A checkpoint path and a disk per node: node i's torchrun agent, started under `prefix(i)`, sees disk i mounted there"
    mnt, disks = tmp_path/'ckpt', [tmp_path/f'disk{i}' for i in range(nnodes)]
    for d in (mnt, *disks): d.mkdir()
    mount = 'mount --make-rprivate / && mount --bind "$0" "$1" && shift && exec "$@"'
    return mnt, disks, lambda i: ['unshare', '-m', 'sh', '-c', mount, str(disks[i]), str(mnt)]
