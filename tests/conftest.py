"""Multi-process tests start real ranks the two ways users do: `torchrun`, and `torch.multiprocessing.spawn` with no
launcher environment. Where the launcher is not what a test is about, its two ranks come from a pool that launcher
started once (`launch.RankPool`): a process of its own on each rank for each test, with a process group of its own"""
import os, sys, time, shutil, threading, importlib, subprocess, pytest
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')  # as `tools/test.sh` runs the suite, and torchrun its workers: processes that run at once share the cores (set before torch is imported)
from ddp_safe_fastai.launch import spawn_ranks, torchrun_ranks, free_port, RankPool

os.environ.setdefault('DDP_SAFE_TIMEOUT', '60')  # a stuck all-gather fails a test within a minute, naming the ranks

_pools = {}  # (launcher, nproc) -> this session's `RankPool`, started at its first use
_pooled = (2, 3)  # the world sizes most tests use; the others start ranks afresh

def pool(launcher, nproc=2):
    "This session's pool of `nproc` ranks started by `launcher` ('torchrun', 'accelerate' or 'spawn'); started again if its ranks ended (`RankPool.run` raised it)"
    if (launcher,nproc) in _pools and _pools[launcher,nproc].ended_ranks(): _pools.pop((launcher,nproc)).close()
    if (launcher,nproc) not in _pools:
        _pools[launcher,nproc] = RankPool(accelerate_cmd(nproc) if launcher == 'accelerate' else launcher, nproc,
                                          warm=('ddp_safe_fastai.all', 'ddp_safe_fastai.testing', 'fastai.basics'))
    return _pools[launcher,nproc]

def ranks(f, *args, nproc=2, timeout=120, init=True, env=None, kill_when=None):
    "`torchrun_ranks`, its ranks from the session's torchrun pool of that size: for a test whose subject is not the launcher"
    if nproc in _pooled: return pool('torchrun', nproc).run(f, *args, timeout=timeout, init=init, env=env, kill_when=kill_when)
    return torchrun_ranks(f, *args, nproc=nproc, timeout=timeout, init=init, env=env, kill_when=kill_when)

@pytest.fixture(scope='session', autouse=True)
def _pools_stopped():
    yield
    for p in _pools.values(): p.close()

@pytest.fixture(params=['torchrun', 'spawn'])
def launch(request):
    "Run a scenario on real ranks; `init=False` leaves the process group to fastai's `distrib_ctx` (torchrun only)"
    def run(f, *args, nproc=2, timeout=120, init=True, env=None):
        if nproc in _pooled: return pool(request.param, nproc).run(f, *args, timeout=timeout, init=init, env=env)
        if request.param == 'spawn': return spawn_ranks(f, *args, nproc=nproc, timeout=timeout, env=env)
        return torchrun_ranks(f, *args, nproc=nproc, timeout=timeout, init=init, env=env)
    run.name = request.param
    return run

def accelerate_cmd(nproc=2):
    "`accelerate launch` of `nproc` CPU processes on this machine, on a free port"
    return [shutil.which('accelerate', path=str(Path(sys.executable).parent)), 'launch', '--multi_gpu', '--num_processes', str(nproc),
            '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no', '--main_process_port', str(free_port())]

@pytest.fixture(scope='session')
def once(tmp_path_factory, worker_id):
    """`once(name, make)`: what `make()` returns (JSON), made by whichever of pytest-xdist's workers asks first, the others
    waiting for it: a module fixture of a module whose tests run on both workers is otherwise made on each"""
    import json
    from filelock import FileLock
    shared = tmp_path_factory.getbasetemp() if worker_id == 'master' else tmp_path_factory.getbasetemp().parent
    def get(name, make):
        f = shared/f"{name}.json"
        with FileLock(f"{f}.lock"):
            if not f.is_file(): f.write_text(json.dumps(make()))
            return json.loads(f.read_text())
    return get

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

def _can_make_netns():
    "Can this process make network namespaces (root, `ip`)?"
    import shutil
    return shutil.which('ip') is not None and _can_mount() and subprocess.run(
        ['unshare', '-n', 'true'], capture_output=True).returncode == 0

needs_netns = pytest.mark.skipif(not _can_make_netns(), reason="needs network namespaces (root, iproute2): each "
                                 "simulated host has an address of its own")

@pytest.fixture
def hosts_apart(tmp_path):
    """Two hosts that share neither a disk nor an address: each node's torchrun agent starts in a network namespace of
    its own (`10.231.N.1` and `.2`, joined by a veth pair), with a host name of its own (`node0`, `node1`: a UTS
    namespace, and an /etc/hosts naming both) and its own disk mounted at one path (a mount namespace). Only the
    namespaces' processes talk to those addresses; everything is removed afterwards. Gives
    (checkpoint path, disks, node_prefix, node 0's address, the environment gloo needs)"""
    import secrets
    tag = secrets.token_hex(3)
    net = f"10.231.{int(tag[:2], 16)}"
    ns = [f"ddpsafe{tag}n{i}" for i in range(2)]
    mnt, disks = tmp_path/'ckpt', [tmp_path/f'disk{i}' for i in range(2)]
    for d in (mnt, *disks): d.mkdir()
    hosts = tmp_path/'hosts'
    hosts.write_text(f"127.0.0.1 localhost\n{net}.1 node0\n{net}.2 node1\n")
    run = lambda *c: subprocess.run(c, check=True, capture_output=True)
    try:
        for n in ns: run('ip', 'netns', 'add', n)
        run('ip', 'link', 'add', f"v{tag}a", 'type', 'veth', 'peer', 'name', f"v{tag}b")
        for i,(n,v) in enumerate(zip(ns, 'ab')):
            run('ip', 'link', 'set', f"v{tag}{v}", 'netns', n)
            run('ip', '-n', n, 'link', 'set', f"v{tag}{v}", 'name', 'eth0')
            run('ip', '-n', n, 'addr', 'add', f"{net}.{i+1}/24", 'dev', 'eth0')
            for dev in ('eth0', 'lo'): run('ip', '-n', n, 'link', 'set', dev, 'up')
        setup = ('hostname "$0" && mount --make-rprivate / && mount --bind "$1" /etc/hosts && mount --bind "$2" "$3" '
                 '&& shift 3 && exec "$@"')
        prefix = lambda i: ['ip', 'netns', 'exec', ns[i], 'unshare', '-mu', 'sh', '-c', setup, f"node{i}", str(hosts),
                            str(disks[i]), str(mnt)]
        yield mnt, disks, prefix, f"{net}.1", {'GLOO_SOCKET_IFNAME': 'eth0'}
    finally:
        for n in ns: subprocess.run(['ip', 'netns', 'del', n], capture_output=True)  # its end of the veth pair goes too

class Swift:
    "An OpenStack Swift with its S3 API on 127.0.0.1 (tools/swift.sh): the environment s3fs reads, a bucket per test, its proxy stopped and started"
    scheme = 's3'
    def __init__(self, dir): self.dir,self.endpoint = Path(dir),Path(dir, 'endpoint').read_text().strip()
    @property
    def env(self): return dict(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID='test:tester', AWS_SECRET_ACCESS_KEY='testing',
                               AWS_DEFAULT_REGION='us-east-1')
    @property
    def owner(self):
        "A second user's `storage_options`, its secret new at each start of the server"
        return dict(endpoint_url=self.endpoint, key='test:owner', secret=Path(self.dir, 'secret').read_text().strip())
    def fs(self):
        import s3fs
        return s3fs.S3FileSystem(endpoint_url=self.endpoint, key='test:tester', secret='testing', skip_instance_cache=True)
    def bucket(self):
        "A new, empty bucket"
        import secrets
        name = f"ddpsafe{secrets.token_hex(4)}"
        self.fs().mkdir(name)
        return name
    def _tool(self, cmd): subprocess.run([str(Path(__file__).parent.parent/'tools'/'swift.sh'), cmd, str(self.dir)], check=True, capture_output=True)
    def stop_proxy(self): self._tool('proxy-stop')
    def start_proxy(self): self._tool('proxy-start')


class Outage:
    """A TCP relay on 127.0.0.1 in front of a real server's `endpoint` (http://host:port): 'up' relays every byte;
    'stall' takes connections and never answers (those open freeze too), as a hung endpoint does; those it took then
    stay unanswered when it is up again, as behind a balancer that lost them; 'refuse' closes its port, as a stopped
    server does.
    Started and stopped by the test (`with Outage(...) as o:`)"""
    def __init__(self, endpoint):
        self.target = tuple(endpoint.split('://')[1].rsplit(':', 1)); self.target = (self.target[0], int(self.target[1]))
        self.port,self.mode,self.conns,self.held,self.listener,self.done = free_port(),'up',[],[],None,False
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._listen()
        threading.Thread(target=self._accept, daemon=True).start()
    def _listen(self):
        import socket
        self.listener = socket.socket(); self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(('127.0.0.1', self.port)); self.listener.listen(64); self.listener.settimeout(0.2)
    def _accept(self):
        import socket
        while not self.done:
            if self.mode == 'refuse' or self.listener is None: time.sleep(0.05); continue
            try: c,_ = self.listener.accept()
            except (socket.timeout, OSError): continue
            if self.mode == 'stall': self.held.append(c); continue  # taken, never answered
            try: s = socket.create_connection(self.target, timeout=5)
            except OSError: c.close(); continue
            self.conns += [c, s]
            for a,b in ((c, s), (s, c)): threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
    def _pipe(self, a, b):
        try:
            while (data := a.recv(65536)):
                while self.mode == 'stall' and not self.done: time.sleep(0.05)  # frozen: nothing passes
                b.sendall(data)
        except OSError: pass
        finally:
            for x in (a, b):
                try: x.close()
                except OSError: pass
    def set(self, mode):
        "Go 'up', 'stall' or 'refuse'"
        if mode == 'refuse':
            self.mode = 'refuse'; self.listener.close(); self.listener = None
            for c in self.conns:
                try: c.close()
                except OSError: pass
            self.conns = []
        else:
            if self.listener is None: self._listen()
            self.mode = mode
    def __enter__(self): return self
    def __exit__(self, *exc):
        self.done = True
        for c in self.conns + self.held + ([self.listener] if self.listener else []):
            try: c.close()
            except OSError: pass

class Azurite:
    "Azure's storage emulator on 127.0.0.1 (tools/azurite.sh): the environment adlfs reads, a container per test"
    scheme = 'az'
    def __init__(self, dir): self.dir,self.connection = Path(dir),Path(dir, 'connection_string').read_text().strip()
    @property
    def env(self): return dict(AZURE_STORAGE_CONNECTION_STRING=self.connection)
    def fs(self):
        import adlfs
        return adlfs.AzureBlobFileSystem(connection_string=self.connection, skip_instance_cache=True)
    def bucket(self):
        "A new, empty container"
        import secrets
        name = f"ddpsafe{secrets.token_hex(4)}"
        self.fs().mkdir(name)
        return name

def _server(tool, env_var, make, tmp_path_factory):
    "The server that tools/test.sh started for the run (its directory in `env_var`), or one of this session's, stopped at its end"
    if os.environ.get(env_var): yield make(os.environ[env_var]); return
    d = tmp_path_factory.mktemp(tool)
    script = str(Path(__file__).parent.parent/'tools'/f'{tool}.sh')
    subprocess.run([script, 'start', str(d)], check=True)
    try: yield make(d)
    finally: subprocess.run([script, 'stop', str(d)])

@pytest.fixture(scope='session')
def swift(tmp_path_factory): yield from _server('swift', 'DDP_SAFE_SWIFT_DIR', Swift, tmp_path_factory)

@pytest.fixture(scope='session')
def azurite(tmp_path_factory): yield from _server('azurite', 'DDP_SAFE_AZURITE_DIR', Azurite, tmp_path_factory)

_shared = {'swift': 'object storage', 'azurite': 'object storage', 'store': 'object storage', 'storage': 'object storage', 'hosts_apart': 'network namespaces'}

@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the marks to name each test's group
def pytest_collection_modifyitems(items):
    "With pytest-xdist (`-n 2 --dist loadgroup`), the tests that share one server, or one set of addresses, run on one worker, one at a time"
    for item in items:
        group = ('slurm' if item.path.name == 'test_checkpoint_slurm.py' else 'torchft' if item.path.name in ('test_fault_tolerance.py', 'test_ft_launch.py')
                 else next((g for f,g in _shared.items() if f in item.fixturenames), None))  # torchft's: several replica groups each, one run at a time
        if group: item.add_marker(pytest.mark.xdist_group(group))

@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: the dev environment has none
def pytest_xdist_node_collection_finished(node, ids):
    "Under `--dist loadgroup`, stop at once if pytest-xdist lost the groups (pytest 9.2, pytest-xdist#1386): tests that share a server would run at once"
    lost = [i for i in ids if i.split('::')[0].endswith('test_checkpoint_slurm.py') and '@slurm' not in i]
    if node.config.getoption('dist') == 'loadgroup' and lost:
        pytest.exit(f"pytest-xdist's --dist loadgroup put {lost[0]} in no group: use a pytest that tools/requirements-latest.txt allows", returncode=4)
