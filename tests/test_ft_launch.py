"""`ddp-safe-ft` (nbs/56_ft_launch.ipynb): torchft's lighthouse and replica groups under torchrun on this machine, run as
a user runs the command; a group that dies is started again, all of it, and the others go on untouched"""
import os, sys, json, time, signal, socket, subprocess
from pathlib import Path
import pytest, psutil
from ddp_safe_fastai.launch import kill_tree

LAUNCHER = Path(sys.executable).parent/'ddp-safe-ft'  # the console script `pip install` makes
SCRIPT = r'''
import os, sys, json, time, socket, urllib.parse
out,how = sys.argv[1],sys.argv[2]
g,r = os.environ['REPLICA_GROUP_ID'],os.environ['RANK']
attempt = len([f for f in os.listdir(out) if f.startswith(f'g{g}-r{r}-')])
u = urllib.parse.urlparse(os.environ['TORCHFT_LIGHTHOUSE']); socket.create_connection((u.hostname, u.port), timeout=5).close()  # it serves
said = {k: os.environ[k] for k in ('REPLICA_GROUP_ID', 'NUM_REPLICA_GROUPS', 'TORCHFT_LIGHTHOUSE', 'RANK', 'WORLD_SIZE')}
json.dump(dict(said, pid=os.getpid(), torchrun=os.getppid()), open(f'{out}/g{g}-r{r}-{attempt}.tmp', 'w'))
os.rename(f'{out}/g{g}-r{r}-{attempt}.tmp', f'{out}/g{g}-r{r}-{attempt}.json')  # whole, or not there
def wait_for(*names):
    while not all(os.path.exists(f'{out}/{n}.json') for n in names): time.sleep(0.1)
if how == 'fail' and g == '0': sys.exit(3)  # group 0 fails whenever it starts
if how == 'fail' and g == '1':  # it ends once ddp-safe-ft has left group 0: its second torchrun (--max-restarts 1) reaped
    wait_for('g0-r0-1')
    while os.path.exists(f"/proc/{json.load(open(f'{out}/g0-r0-1.json'))['torchrun']}"): time.sleep(0.1)
if how == 'die' and g == '1' and r == '1' and attempt == 0: time.sleep(1); os.kill(os.getpid(), 9)  # a rank of group 1 dies once
if how == 'die' and g != '1': wait_for('g1-r0-1', 'g1-r1-1')  # the others end only after group 1 was started again
time.sleep(60 if how == 'wait' else 4)
'''

def run(tmp_path, how, *flags, timeout=240):
    "`ddp-safe-ft FLAGS train.py OUT HOW`: its outcome, and what each start of each rank said ({'g1-r0-0': ...}: group, rank, start)"
    (tmp_path/'train.py').write_text(SCRIPT)
    out = tmp_path/'out'; out.mkdir()
    p = subprocess.Popen([str(LAUNCHER), *flags, str(tmp_path/'train.py'), str(out), how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try: stdout,stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired: pytest.fail(f"ddp-safe-ft did not return in {timeout} s; the ranks that started: {sorted(f.stem for f in out.glob('*.json'))}")
    finally: kill_tree(p.pid)  # on any way out, its lighthouse and groups too (each in a session of its own, still its descendants)
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr),{f.stem: json.loads(f.read_text()) for f in out.glob('*.json')}

def serves(url):
    try: socket.create_connection(('127.0.0.1', int(url.rsplit(':', 1)[1])), timeout=1).close(); return True
    except OSError: return False

def test_a_dead_group_started_again(tmp_path):
    "Three groups of two ranks; a rank of group 1 is killed: its group (both ranks) is started again, once; groups 0 and 2 ran once, untouched; every rank was told the same lighthouse and how many groups there are; the lighthouse stops with the run"
    r,ran = run(tmp_path, 'die', '--groups', '3', '--nproc-per-group', '2', '--max-restarts', '2')
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(ran) == sorted([f'g{g}-r{k}-0' for g in range(3) for k in range(2)] + ['g1-r0-1', 'g1-r1-1']), sorted(ran)
    lighthouse = ran['g0-r0-0']['TORCHFT_LIGHTHOUSE']
    assert all(v['NUM_REPLICA_GROUPS'] == '3' and v['WORLD_SIZE'] == '2' and v['TORCHFT_LIGHTHOUSE'] == lighthouse for v in ran.values()), ran
    assert lighthouse.startswith('http://127.0.0.1:') and ran['g1-r0-1']['pid'] != ran['g1-r0-0']['pid']
    assert 'replica group 1 exited with' in r.stdout and 'started again (1 of --max-restarts 2)' in r.stdout, r.stdout
    assert not serves(lighthouse)

def test_a_group_that_keeps_failing(tmp_path):
    "A group that fails at every start is started again `--max-restarts` times, then left; the other ends well; the run says so and exits 1"
    r,ran = run(tmp_path, 'fail', '--groups', '2', '--max-restarts', '1')
    assert r.returncode == 1, r.stdout + r.stderr
    assert sorted(ran) == ['g0-r0-0', 'g0-r0-1', 'g1-r0-0'], sorted(ran)
    assert 'replica group 0 exited with 1 after 1 restarts (--max-restarts 1): not started again' in r.stdout, r.stdout

def test_lighthouse_started_again_then_sigterm(tmp_path):
    "The lighthouse killed while the groups run is started again on its port; then SIGTERM to ddp-safe-ft reaches every group's ranks, the lighthouse stops, and it exits 128 + 15"
    (tmp_path/'train.py').write_text(SCRIPT)
    out = tmp_path/'out'; out.mkdir()
    p = subprocess.Popen([str(LAUNCHER), '--groups', '2', str(tmp_path/'train.py'), str(out), 'wait'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob('*.json'))) < 2:
            assert time.monotonic() < deadline and p.poll() is None, f"the ranks did not start: {sorted(f.stem for f in out.glob('*.json'))}"
            time.sleep(0.2)
        url = json.loads(next(out.glob('*.json')).read_text())['TORCHFT_LIGHTHOUSE']
        port = int(url.rsplit(':', 1)[1])
        lighthouse = next(c.pid for c in psutil.net_connections('tcp') if c.status == psutil.CONN_LISTEN and c.laddr.port == port)
        os.kill(lighthouse, signal.SIGKILL)
        while not [c for c in psutil.net_connections('tcp') if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid not in (None, lighthouse)]:  # another lighthouse on its port
            assert time.monotonic() < deadline and p.poll() is None, "the lighthouse was not started again"
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 128 + signal.SIGTERM, p.stdout.read()
        assert 'the lighthouse died: started again on its port' in p.stdout.read()
    finally: kill_tree(p.pid)
    ran = [json.loads(f.read_text()) for f in out.glob('*.json')]
    for v in ran:
        with pytest.raises(ProcessLookupError): os.kill(v['pid'], 0)  # no rank left behind
    assert not serves(ran[0]['TORCHFT_LIGHTHOUSE'])

def test_bad_input(tmp_path):
    "No group, no script, or another torchft than the one it runs on: one line naming what is wrong, exit 2, nothing started"
    (tmp_path/'train.py').write_text('')
    r = subprocess.run([str(LAUNCHER), '--groups', '0', str(tmp_path/'train.py')], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'groups=0' in r.stderr, r.stderr
    r = subprocess.run([str(LAUNCHER), str(tmp_path/'missing.py')], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'missing.py is no file' in r.stderr, r.stderr
    other = tmp_path/'other'/'torchft-0.1.0.dist-info'; other.mkdir(parents=True)  # another torchft, first on the path
    (other/'METADATA').write_text('Metadata-Version: 2.1\nName: torchft\nVersion: 0.1.0\n')
    r = subprocess.run([str(LAUNCHER), str(tmp_path/'train.py')], capture_output=True, text=True, timeout=120, env={**os.environ, 'PYTHONPATH': str(tmp_path/'other')})
    assert r.returncode == 2 and "torchft 0.1.0 is installed; ddp_safe_fastai runs on torchft==0.2.0: `pip install 'ddp_safe_fastai[ft]'`" in r.stderr, r.stderr

def test_lighthouse_gone_for_good(tmp_path):
    "The lighthouse killed and its port taken by another web server: ddp-safe-ft stops every group's ranks and says, in one line, that the lighthouse did not start again, naming its address; exit 2"
    import threading, http.server
    (tmp_path/'train.py').write_text(SCRIPT)
    out = tmp_path/'out'; out.mkdir()
    p = subprocess.Popen([str(LAUNCHER), '--groups', '2', str(tmp_path/'train.py'), str(out), 'wait'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = None
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob('*.json'))) < 2:
            assert time.monotonic() < deadline and p.poll() is None, f"the ranks did not start: {sorted(f.stem for f in out.glob('*.json'))}"
            time.sleep(0.2)
        port = int(json.loads(next(out.glob('*.json')).read_text())['TORCHFT_LIGHTHOUSE'].rsplit(':', 1)[1])
        os.kill(p.pid, signal.SIGSTOP)  # held while the port changes hands
        os.kill(next(c.pid for c in psutil.net_connections('tcp') if c.status == psutil.CONN_LISTEN and c.laddr.port == port), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while other is None:
            try: other = http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler)  # it answers, and is no lighthouse
            except OSError: assert time.monotonic() < deadline, f"port {port} not freed"; time.sleep(0.1)
        threading.Thread(target=other.serve_forever, daemon=True).start()
        os.kill(p.pid, signal.SIGCONT)
        assert p.wait(120) == 2
        for v in [json.loads(f.read_text()) for f in out.glob('*.json')]:
            with pytest.raises(ProcessLookupError): os.kill(v['pid'], 0)  # no rank left behind
        err = p.stderr.read()
        assert f"ddp-safe-ft: torchft's lighthouse did not start on 127.0.0.1:{port}" in err, err
    finally:
        kill_tree(p.pid)
        if other is not None: other.shutdown(); other.server_close()
