"""`FaultTolerance` (nbs/49_fault_tolerance.ipynb): a fastai script, unchanged, run by `ddp-safe-ft` on torchft's replica
groups with a real lighthouse and real `torchrun`s; groups killed with SIGKILL at random steps, started again, and joined
to their live peers. Every replica logs each committed step (`ft_train.py`); the tests compare the logs."""
import os, sys, json, time, random, signal, sysconfig, subprocess, collections
from pathlib import Path
import pytest, psutil
from ddp_safe_fastai.launch import kill_tree
from ddp_safe_fastai.manifest import why_incomplete

LAUNCHER = Path(sys.executable).parent/'ddp-safe-ft'  # the console script `pip install` makes
SCRIPT = Path(__file__).parent/'ft_train.py'

def log_tail(out, name, n=4):
    "The last `n` steps a replica logged in `out/name`, read from the end of its log"
    f = out/name
    if not f.exists(): return []
    with open(f, 'rb') as fh:
        fh.seek(max(fh.seek(0, 2) - 1000*n, 0))
        return [json.loads(l) for l in fh.read().decode().splitlines()[1:] if l.endswith('}')][-n:]

def log_records(out, name):
    "Every step a replica logged in `out/name`, every start of it in turn"
    f = out/name
    return [json.loads(l) for l in f.read_text().splitlines() if l.endswith('}')] if f.exists() else []

class Run:
    "`ddp-safe-ft --groups G --nproc-per-group P ft_train.py OUT EPOCHS`, started; its replicas' logs as they grow"
    def __init__(self, tmp_path, groups, nproc=1, epochs=2, flags=(), **env):
        self.out,self.groups,self.nproc = tmp_path/'out',groups,nproc
        self.out.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **{k: str(v) for k,v in env.items()})
        self.p = subprocess.Popen([str(LAUNCHER), '--groups', str(groups), '--nproc-per-group', str(nproc), '--max-restarts', '40', '--finish-grace', '15',
                                   *flags, str(SCRIPT), str(self.out), str(epochs)], env=env, stdout=open(tmp_path/'launcher.out', 'w'), stderr=subprocess.STDOUT)
        self.said = tmp_path/'launcher.out'

    def records(self, group, rank=0): return log_records(self.out, f'log{group}_{rank}.jsonl')
    def tail(self, group, n=4): return log_tail(self.out, f'log{group}_0.jsonl', n)

    def last(self, group):
        r = self.tail(group, 1)
        return r[-1] if r else None

    def joins(self, group):
        "How many times replica group `group` has joined its live peers so far, as the launcher's output says"
        return self.said.read_text().count(f'replica group {group} joins its live peers')

    def until(self, done, what, deadline):
        "Poll `done()` until it is true; fail saying `what` (and the launcher's last words) once `deadline` (`time.monotonic()`) passes or the launcher ends"
        while not done():
            assert time.monotonic() < deadline and self.p.poll() is None, what + ': ' + self.said.read_text()[-3000:]
            time.sleep(0.05)

    def wait(self, timeout=240):
        "The launcher's exit code; on a timeout, which groups' replicas had stopped logging, and where"
        try: return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            where = {g: (r and (r['step'], round(time.time() - r['t'], 1))) for g in range(self.groups) for r in [self.last(g)]}
            pytest.fail(f"ddp-safe-ft did not return in {timeout} s; each group's last step and how long ago: {where}\n{self.said.read_text()[-3000:]}")
        finally: kill_tree(self.p.pid)

def check_replicas(run):
    """At every committed step, every replica that took it holds the same weights, optimizer state and place in the fit,
    and each rank the random states and buffers of that rank in every other group; one group writes; the fit ends with
    one model, validated alike everywhere. A
    step is the replicas' records of it within seconds of each other: when every group was lost, the run went on from a
    checkpoint, and took the steps after it again"""
    logs = {(g, r): run.records(g, r) for g in range(run.groups) for r in range(run.nproc)}
    at = collections.defaultdict(dict)
    for who,recs in logs.items():
        for rec in recs:
            key = (rec['fit'], rec['step'])
            while who in at[key] or any(abs(rec['t'] - o['t']) > 3 for o in at[key].values()): key += ('again',)
            at[key][who] = rec
    keys = ('w', 'opt', 'epoch', 'iter', 'train_iter', 'losses')
    for step,recs in sorted(at.items()):
        seen = {tuple(rec[k] for k in keys) for rec in recs.values()}
        assert len(seen) == 1, f"fit {step[0]}, step {step[1]}: the replicas differ: { {who: [rec[k] for k in keys] + [rec['pid'], rec['t']] for who,rec in recs.items()} }"
        for rank in range(run.nproc):  # random states and buffers are a rank's, as under DDP: rank `rank` of every group holds the same
            for k,what in (('rng', 'random states'), ('bufs', 'buffers')):
                theirs = {who: rec[k] for who,rec in recs.items() if who[1] == rank}
                assert len(set(theirs.values())) <= 1, f"fit {step[0]}, step {step[1]}: rank {rank}'s {what} differ between groups: {theirs}"
        writers = {g for (g,_),rec in recs.items() if rec['writes']}
        assert writers == {min(g for g,_ in recs)} or len({g for g,_ in recs}) < run.groups, f"fit {step[0]}, step {step[1]}: the groups that write: {writers}"
    ends = {f.name: json.loads(f.read_text()) for f in run.out.glob('end*.json')}
    assert len({e['w'] for e in ends.values()}) == 1, f"the replicas ended with different weights: {ends}"
    valid = {json.dumps([v[1:] for v in e['values']]) for e in ends.values()}  # the Recorder's values but each group's own training loss
    assert len(valid) == 1, f"the replicas' validation differs: {ends}"
    return logs,at

def pids(recs): return [p for i,p in enumerate(r['pid'] for r in recs) if i == 0 or recs[i-1]['pid'] != p]

def test_groups_train_on_through_kills(tmp_path):
    """Three groups of one process, a model with a BatchNorm, `CheckpointCallback` and `SafeSaveModelCallback` in the
    script, each group starting from weights of its own. 16 SIGKILLs of a random group at a random step, one of them the writer just as it saves a
    checkpoint and one during validation, and a group stopped (SIGSTOP) for 4 s; each killed group is started again and
    joins its peers where they are. Steps take 0.1 s while the test kills (room to aim), then as long as they take.
    Every live replica is bitwise alike at every committed step; a survivor's PID changes only when it is killed; one group
    writes; every checkpoint on disk is whole; the fit ends at one step everywhere"""
    epochs,per_epoch = 4,14400 // 8 // 3
    run = Run(tmp_path, 3, epochs=epochs, N=14400, STEP_PAUSE=0.1, CKPT=1, BEST=1, BN=1)
    rng,kills,deadline = random.Random(0),[],time.monotonic() + 400
    special,want = ['writer saving', 'validating', 'stopped'],17  # 16 SIGKILLs and the SIGSTOP; the special ones as they come, random kills between
    try:
        while (len(kills) < want or special) and run.p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = {pid for _,pid,_,how in kills if how != 'stopped'}
            logs = {g: run.tail(g) for g in range(3)}
            live = {g: recs[-1] for g,recs in logs.items() if recs and time.time() - recs[-1]['t'] < 0.5 and recs[-1]['pid'] not in dead}
            top = max((r['step'] for r in live.values()), default=0)
            if len(live) < 2 or top > 0.9 * epochs * per_epoch: continue  # a survivor stays; the run leaves time to join
            near_end = 'validating' in special and top % per_epoch > per_epoch - 150  # an epoch's end soon: no random kill, the groups back for it
            live = {g: r for g,r in live.items() if len(logs[g]) > 3 and logs[g][0]['pid'] == r['pid']}  # a few steps since it joined
            picks = {'writer saving': [g for g,r in live.items() if r['writes'] and (r['iter'] + 1) % 10 == 0],  # `every_iters=10` saves after this batch
                     'validating': [g for g,r in live.items() if r['iter'] == per_epoch - 1],  # its epoch's last batch: validation next
                     'stopped': list(live) if len(kills) > 3 else []}
            how = next((k for k in special if picks[k]), 'any')
            if near_end and how != 'validating': continue
            pick = picks.get(how, list(live) if rng.random() < 0.05 else [])  # 'any': a random step
            if not pick: continue
            g = rng.choice(pick); r = live[g]
            if how == 'stopped':  # SIGSTOP for 4 s: the others wait in a collective, or go on without it, when it finds itself behind and is started again
                os.kill(r['pid'], signal.SIGSTOP); time.sleep(4); os.kill(r['pid'], signal.SIGCONT)
            else:
                try: os.kill(r['pid'], signal.SIGKILL)
                except ProcessLookupError: continue  # it ended meanwhile
            if how in special: special.remove(how)
            kills.append((g, r['pid'], r['step'], how))
        (run.out/'fast').touch()
        code = run.wait(timeout=300)
    finally: kill_tree(run.p.pid)
    assert len(kills) >= want and not special, f"only {len(kills)} kills before the run ended: {kills}"
    assert code == 0, run.said.read_text()[-3000:]
    logs,at = check_replicas(run)
    for g in range(3):  # a group's PID changes only where it was killed (or stopped, and found itself behind)
        assert set(pids(logs[(g, 0)])[:-1]) <= {pid for kg,pid,_,_ in kills if kg == g}, (g, pids(logs[(g, 0)]), kills)
    said = run.said.read_text()
    stopped = next(k for k in kills if k[3] == 'stopped')  # back, it went on (the others waited in a collective) or found itself behind and was started again
    assert 'fell behind its live peers' in said or any(r['pid'] == stopped[1] and r['step'] > stopped[2] + 1 for r in logs[(stopped[0], 0)])
    joins = said.count('joins its live peers at epoch')
    assert joins >= 8, f"{joins} joins of a group started again"
    ckpts = [d for d in (run.out/'models'/'ckpt').iterdir() if (d/'manifest.json').exists()]
    assert ckpts and all(why_incomplete(d) is None for d in ckpts), {d.name: why_incomplete(d) for d in ckpts}

def test_two_groups_of_two_processes(tmp_path):
    """Two groups of two ranks each (DDP inside a group), a model with a BatchNorm: a rank of group 1 killed, then a rank of group 0; each group is
    started again, all of it, and joins; every rank of every live group alike at every step. Steps take 0.1 s until both
    joined again (the run outlasts the starts), then as long as they take"""
    run = Run(tmp_path, 2, nproc=2, epochs=4, N=4800, STEP_PAUSE=0.1, BN=1)
    kills,deadline = [],time.monotonic() + 240
    try:
        def all_train():
            recs = [run.records(h, k) for h in range(2) for k in range(2)]
            return all(r and time.time() - r[-1]['t'] < 0.5 and r[-1]['pid'] not in {p for _,p,_ in kills} for r in recs)
        for g,rank in ((1, 1), (0, 0), (None, None)):  # each kill once both groups train, the second after the first group joined again; then both joined again
            run.until(all_train, f"the four ranks did not train (kills: {kills})", deadline)
            if g is None: break
            r = run.records(g, rank)[-1]
            os.kill(r['pid'], signal.SIGKILL); kills.append((g, r['pid'], r['step']))
        (run.out/'fast').touch()
        code = run.wait(timeout=200)
    finally: kill_tree(run.p.pid)
    assert code == 0, run.said.read_text()[-3000:]
    logs,at = check_replicas(run)
    assert run.said.read_text().count('joins its live peers at epoch') >= 2
    assert max(len(recs) for recs in at.values()) == 4  # steps with all four ranks

def test_groups_of_two_processes_that_start_together(tmp_path):
    """Two groups of two ranks each, each group initialising its model differently, `--min-replicas 2`: their first quorum
    has both at step 0, where torchft hands rank 0 group 0's state and rank 1 group 1's; the ranks of each group take
    their rank 0's, and every replica trains one model"""
    run = Run(tmp_path, 2, nproc=2, epochs=1, flags=('--min-replicas', '2'), N=800, STEP_PAUSE=0.02)
    try: code = run.wait(timeout=200)
    finally: kill_tree(run.p.pid)
    assert code == 0, run.said.read_text()[-3000:]
    check_replicas(run)

def test_a_group_joins_from_a_peer_that_just_joined(tmp_path):
    """Two groups, `--min-replicas 2`. Group 1 killed, started again, joins from group 0; group 0 killed before their
    first step together (group 1 waits 3 s before that step's all-reduce), so group 0, started again, joins from group 1,
    which took no step since it joined. What group 1 hands over is where its next batch starts, random states included:
    the two are alike at every step after"""
    run = Run(tmp_path, 2, epochs=1, flags=('--min-replicas', '2'), N=1600, STEP_PAUSE=0.05, JOIN_PAUSE=3)
    try:
        deadline = time.monotonic() + 120
        run.until(lambda: all((r := run.last(g)) and r['step'] > 10 for g in range(2)), "the groups did not train", deadline)
        joined = run.joins(1)  # at the start too: the groups start from one state
        os.kill(run.last(1)['pid'], signal.SIGKILL)
        run.until(lambda: run.joins(1) > joined, "group 1 did not join", deadline)
        joined = run.joins(0)
        os.kill(run.last(0)['pid'], signal.SIGKILL)
        code = run.wait(timeout=200)
    finally: kill_tree(run.p.pid)
    assert code == 0, run.said.read_text()[-3000:]
    assert run.joins(0) == joined + 1, run.said.read_text()[-3000:]
    logs,at = check_replicas(run)
    assert len(pids(logs[(0, 0)])) == len(pids(logs[(1, 0)])) == 2 and max(len(recs) for recs in at.values()) == 2
    first = next(r['step'] for r in logs[(1, 0)] if r['pid'] == pids(logs[(1, 0)])[1])  # group 1's first step after it joined...
    assert at[(0, first)].get((0, 0), {}).get('pid') == pids(logs[(0, 0)])[1], "group 1 took a step before group 0 was killed"  # ...was with group 0 started again

def test_a_step_trained_again_is_clipped_as_any(tmp_path):
    """fastai's `GradientClip` in the fit, a model with a BatchNorm, `--min-replicas 2`. Group 1 dies after the forward of
    step 20, before its all-reduce: group 0 discards the step, and trains the batch again with group 1 started again. The
    gradients every replica steps with, those of a batch trained again included, went through `GradientClip`; the
    BatchNorm counted each batch once, the one trained again included"""
    run = Run(tmp_path, 2, epochs=1, flags=('--min-replicas', '2'), N=1600, STEP_PAUSE=0.02, CLIP=1, DIE_AT=20, BN=1)
    code = run.wait(timeout=200)
    assert code == 0, run.said.read_text()[-3000:]
    logs,_ = check_replicas(run)
    recs = [r for rs in logs.values() for r in rs]
    assert max(r['discarded'] for r in logs[(0, 0)]) >= 1, run.said.read_text()[-3000:]
    assert max(r['norm'] for r in recs) <= 0.01 * 1.0001, sorted((r['norm'], r['step'], r['pid']) for r in recs)[-3:]
    assert all(r['tracked'] == [r['train_iter']] for r in recs), [(r['step'], r['pid'], r['tracked'], r['train_iter']) for r in recs if r['tracked'] != [r['train_iter']]][:5]

def test_every_group_killed_resumes_from_its_checkpoint(tmp_path):
    "Two groups, both killed at once after a checkpoint: the same command goes on from the checkpoint and ends with the weights of the run that was never killed, bit for bit"
    flags = ('--min-replicas', '2')  # every step has both groups, as in the run that was never killed
    whole = Run(tmp_path/'whole', 2, epochs=2, flags=flags, N=1600, STEP_PAUSE=0.01, CKPT=1)
    assert whole.wait(timeout=200) == 0, whole.said.read_text()[-3000:]
    run = Run(tmp_path/'killed', 2, epochs=2, flags=flags, N=1600, STEP_PAUSE=0.02, CKPT=1)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.02)
            last = [run.last(g) for g in range(2)]
            if all(r and r['step'] >= 64 and r['step'] % 10 in (3, 4, 5) for r in last): break  # a few steps after the checkpoint of step 60 or later
        steps = [r['step'] for r in last]
        for r in last: os.kill(r['pid'], signal.SIGKILL)
        code = run.wait(timeout=200)
    finally: kill_tree(run.p.pid)
    assert code == 0, run.said.read_text()[-3000:]
    said = run.said.read_text()
    assert 'CheckpointCallback: fit 0 resumed from' in said, said[-3000:]
    check_replicas(run)
    ends = {json.loads(f.read_text())['w'] for f in [*whole.out.glob('end*.json'), *run.out.glob('end*.json')]}
    assert len(ends) == 1, (ends, steps)

def test_lighthouse_killed_and_started_again(tmp_path):
    """The lighthouse killed while two groups train: `ddp-safe-ft` starts it again on its port; the groups' quorums retry
    and they go on, their processes the same, alike at every step. `--min-replicas 2`: the new lighthouse, which knows
    no group yet, does not let the first group that asks train alone (then the other would be a step behind)"""
    run = Run(tmp_path, 2, epochs=2, flags=('--min-replicas', '2'), N=1600, STEP_PAUSE=0.05)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all((r := run.last(g)) and r['step'] > 20 for g in range(2)): time.sleep(0.05)
        lighthouse = [p for p in psutil.Process(run.p.pid).children() if 'torchft_lighthouse' in ' '.join(p.cmdline())]
        assert len(lighthouse) == 1
        lighthouse[0].kill()
        code = run.wait(timeout=300)
    finally: kill_tree(run.p.pid)
    assert code == 0, run.said.read_text()[-3000:]
    assert 'the lighthouse died: started again on its port' in run.said.read_text()
    logs,_ = check_replicas(run)
    assert all(len(pids(recs)) == 1 for recs in logs.values()), {who: pids(recs) for who,recs in logs.items()}

def fails_on_every_rank(tmp_path, said, python=sys.executable, **env):
    "A group of two ranks under torchrun (of `python`), with `env`: it fails, each rank's error says `said`, and the output folder stays empty"
    from ddp_safe_fastai.launch import free_port
    out = tmp_path/'out'; out.mkdir()
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=f'http://127.0.0.1:{free_port()}', CKPT='1', BEST='1', **env)
    r = subprocess.run([python, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', str(SCRIPT), str(out), '1'],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    for rank in (0, 1): assert any(l.startswith(f'[rank{rank}]') and said in l for l in r.stderr.splitlines()), r.stderr[-3000:]
    assert list(out.iterdir()) == [], list(out.iterdir())

@pytest.mark.parametrize('setting,env', [
    ('TORCHFT_LIGHTHOUSE', dict(REPLICA_GROUP_ID='0', NUM_REPLICA_GROUPS='2')),  # nothing listens there
    ('REPLICA_GROUP_ID=2', dict(REPLICA_GROUP_ID='2', NUM_REPLICA_GROUPS='2'))])
def test_bad_settings_fail_on_every_rank(tmp_path, setting, env):
    "A group of two ranks started with a lighthouse nowhere, or a group number out of range: one error on each rank naming the setting, nothing written"
    fails_on_every_rank(tmp_path, setting, **env)

def test_torchft_of_another_version_fails_on_every_rank(tmp_path):
    "torchft 0.1.9 where the script looks first (its metadata ahead on the path): one error on each rank naming both versions and the install, nothing written"
    meta = tmp_path/'site'/'torchft-0.1.9.dist-info'; meta.mkdir(parents=True)
    (meta/'METADATA').write_text('Metadata-Version: 2.1\nName: torchft\nVersion: 0.1.9\n')
    path = os.pathsep.join([str(tmp_path/'site'), *filter(None, [os.environ.get('PYTHONPATH')])])
    fails_on_every_rank(tmp_path, "torchft 0.1.9 is installed; ddp_safe_fastai runs on torchft==0.2.0: `pip install 'ddp_safe_fastai[ft]'`",
                        REPLICA_GROUP_ID='0', NUM_REPLICA_GROUPS='2', PYTHONPATH=path)

def test_without_torchft_fails_on_every_rank(tmp_path):
    """A machine without torchft: the ranks run in an environment of their own holding everything this one holds but
    torchft (a venv whose packages are links to these); one error on each rank naming the install, nothing written"""
    venv = tmp_path/'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', venv], check=True, timeout=120)
    here,there = Path(sysconfig.get_paths()['purelib']),Path(subprocess.run([venv/'bin'/'python', '-c', "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                                                             capture_output=True, text=True, check=True).stdout.strip())
    for p in here.iterdir():
        if not p.name.startswith('torchft'): (there/p.name).symlink_to(p)
    r = subprocess.run([venv/'bin'/'python', '-c', "import importlib.util; print(importlib.util.find_spec('torchft'))"], capture_output=True, text=True)
    assert r.stdout.strip() == 'None', r.stdout + r.stderr  # torchft is nowhere there
    fails_on_every_rank(tmp_path, "torchft is not installed: `pip install 'ddp_safe_fastai[ft]'` installs torchft==0.2.0",
                        python=venv/'bin'/'python', REPLICA_GROUP_ID='0', NUM_REPLICA_GROUPS='2')

def test_gradient_accumulation_refused_on_every_rank(tmp_path):
    """fastai's `GradientAccumulation` in a fit under torchft (a real lighthouse, a group of two ranks started by hand):
    every rank raises one error naming it, before any step (a group lost during a batch that only accumulates would leave
    half-averaged gradients in the sum), and nothing is written"""
    groups_fail_together(tmp_path/'out', (1,), lambda g: 'FaultTolerance does not train with GradientAccumulation', GRAD_ACC='1')

def groups_by_hand(out, url, counts, nproc, epochs, **env):
    "Replica group `g` with `NUM_REPLICA_GROUPS=counts[g]`, for each `g`: its own `torchrun` of `nproc` ranks, as torchft documents; started"
    return [subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', str(nproc), str(SCRIPT), str(out), str(epochs)],
                             env=dict(os.environ, TORCHFT_LIGHTHOUSE=url, REPLICA_GROUP_ID=str(g), NUM_REPLICA_GROUPS=str(n), CKPT='1', RUST_LOG='warn', **env),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True) for g,n in enumerate(counts)]

def their_errors(procs, timeout, after):
    "Each group's standard error, once it ended; a failure naming a group still running `timeout` s `after` what the test did"
    said = []
    for g,p in enumerate(procs):
        try: said.append(p.communicate(timeout=timeout)[1])
        except subprocess.TimeoutExpired: pytest.fail(f"replica group {g} still runs {timeout} s {after}")
    return said

def groups_fail_together(out, counts, said, **env):
    "Groups started by hand (`groups_by_hand`, two ranks each, with `env`) under torchft's `torchft_lighthouse`, whose first quorum waits for them all: each group fails, every rank's error says `said(group)`, and no checkpoint or committed step is written"
    from ddp_safe_fastai.ft_launch import Lighthouse
    procs = []
    with Lighthouse(min_replicas=len(counts)) as lighthouse:
        try:
            procs = groups_by_hand(out, lighthouse.url, counts, nproc=2, epochs=1, **env)
            errs = their_errors(procs, 120, "after it started")
        finally:
            for p in procs: kill_tree(p.pid)
    for g,(p,err) in enumerate(zip(procs, errs)):
        assert p.returncode != 0, (g, err[-3000:])
        for rank in (0, 1): assert any(l.startswith(f'[rank{rank}]') and said(g) in l for l in err.splitlines()), (g, rank, err[-3000:])
    assert not list(out.glob('models/**/manifest.json')) and not list(out.glob('log*.jsonl'))  # no checkpoint, no committed step

def test_groups_of_different_counts_fail_together(tmp_path):
    """Two groups started by hand, as torchft documents (a lighthouse, then each group's `torchrun`), one with
    `NUM_REPLICA_GROUPS=2` and one with 3: every rank of both groups raises one error naming the setting, at their first
    all-reduce, before any step, and no checkpoint is written"""
    groups_fail_together(tmp_path/'out', (2, 3), lambda g: f"NUM_REPLICA_GROUPS={2+g}: the live replica groups were started with different")

def test_lighthouse_gone_for_good(tmp_path):
    """Two groups started by hand with a lighthouse of the test's own, which is stopped mid-epoch and never comes back:
    every rank of both groups raises one error naming `TORCHFT_LIGHTHOUSE`, after the writer checkpointed the last
    committed batch; the checkpoint is whole, and it is that batch's"""
    from ddp_safe_fastai.ft_launch import Lighthouse
    lighthouse = Lighthouse(join_timeout_ms=2000).start()  # a quorum waits 2 s for a late group
    out,procs,url = tmp_path/'out',[],lighthouse.url
    out.mkdir()
    try:  # torchft's own settings: 3 tries of a quorum, of 4 s each, not the library's 31 of 60 s
        procs = groups_by_hand(out, url, (2, 2), nproc=1, epochs=2, N='4800', STEP_PAUSE='0.05', TORCHFT_QUORUM_RETRIES='2', TORCHFT_QUORUM_TIMEOUT_SEC='4')
        deadline = time.monotonic() + 120
        while not all(len(log_tail(out, f'log{g}_0.jsonl')) >= 4 and log_tail(out, f'log{g}_0.jsonl')[-1]['iter'] >= 25 for g in (0, 1)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                f"the groups did not train 25 batches together: {[p.poll() is None or p.stderr.read()[-3000:] for p in procs]}"
            time.sleep(0.1)
        lighthouse.stop()
        said = their_errors(procs, 240, "after its lighthouse ended")
    finally:
        for p in procs: kill_tree(p.pid)
        lighthouse.stop()
    last = log_records(out, 'log0_0.jsonl')[-1]  # the writer's last committed batch
    for g,(p,err) in enumerate(zip(procs, said)):
        assert p.returncode != 0 and log_records(out, f'log{g}_0.jsonl')[-1]['step'] == last['step'], (g, err[-3000:])
        assert any(l.startswith('[rank0]') and f"TORCHFT_LIGHTHOUSE='{url}'" in l for l in err.splitlines()), (g, err[-3000:])
        assert f"batch {last['iter']+1} of epoch 0 is checkpointed: run again to resume from it" in err, (g, err[-3000:])
    ckpt = out/'models'/'ckpt'
    newest = (ckpt/'latest').read_text()
    assert newest == f"epoch_0000_iter_{last['iter']+1:06d}" and why_incomplete(ckpt/newest) is None, (newest, last)
