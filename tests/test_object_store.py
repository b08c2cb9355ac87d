"""`object_store` (nbs/33_object_store.ipynb, nbs/48_checkpoint.ipynb), checkpoints in object storage:
`CheckpointCallback` with an `s3://` URL against a real OpenStack Swift with its S3 API (tools/swift.sh), on 2 ranks
under torchrun: uploads, a resume on a machine whose disk was wiped, the store's faults. The rank-side functions are
the first in this file"""
import os, io, re, time, shutil, signal, contextlib, subprocess, sys
from pathlib import Path
import pytest, torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.launch import torchrun_ranks, kill_tree
from ddp_safe_fastai.testing import synth_learner
from conftest import values, ranks, Outage
from test_fault_tolerance import Run, check_replicas

class KillAfter(Callback):
    "Once epoch `epoch` is checkpointed and uploaded, and the best model too, say so in the file `marker` and wait to be killed"
    order = CheckpointCallback.order+1
    def __init__(self, epoch, marker): self.epoch_killed,self.marker = epoch,marker
    def after_epoch(self):
        if self.epoch != self.epoch_killed: return
        flush_saves()
        uploads = [self.learn.checkpoint.tiers['durable'].uploads]  # rank 0's
        if (best := getattr(self.learn, 'safe_save_model', None)):
            best._wait_for_saves()
            if best.uploads: best._hand_over(); uploads.append(best.uploads)
        for u in uploads:
            if u: assert u.wait(120), f"premise: {u.url} caught up before the kill"
        distrib_barrier()
        Path(self.marker).touch(); time.sleep(120)

def weights(learn): return [p.detach().clone() for p in learn.model.parameters()]

def fit_to(root, url, n_epoch=4, kill_after=None, storage_options=None, best=False):
    """`n_epoch` epochs checkpointed to `url`, killed after epoch `kill_after` if given: the weights, what the callback
    resumed from. With `best`, a `SafeSaveModelCallback` to `url`_best too, whose best model is the first epoch's: the
    weights are those it reloads at the end of the fit"""
    learn = synth_learner(n=128, path=Path(root), seed=5)
    ckpt = CheckpointCallback(url, storage_options=storage_options)
    kill = [KillAfter(kill_after, Path(root)/'killed')] if kill_after is not None else []
    first = [SafeSaveModelCallback(fname=url+'_best', comp=lambda value, best: best == -float('inf'))] if best else []
    with learn.distrib_ctx(): learn.fit(n_epoch, 0.02, cbs=[ckpt, *first, *kill])
    return dict(weights=weights(learn), resumed_from=ckpt.resumed_from, local=sorted(p.name for p in (Path(root)/'models'/local_copy_name(url)).iterdir()))

@pytest.fixture(params=['swift', 'azurite'])
def store(request):
    "A real object store: OpenStack Swift's S3 API (s3fs), or Azure's emulator (adlfs)"
    return request.getfixturevalue(request.param)

def listed(fs, path):
    "The names under `path` as the store lists them now (fsspec caches listings)"
    fs.invalidate_cache()
    return sorted(p.rstrip('/').rsplit('/', 1)[-1] for p in fs.ls(path))

def test_resume_from_the_bucket_on_a_wiped_disk(tmp_path, store):
    """Checkpoints reach the bucket in a directory's layout; the run is killed, its disk wiped, and the run started again
    (2 ranks, then 1) resumes from the bucket and ends with the uninterrupted run's weights: the best model's, which
    `SafeSaveModelCallback(fname=URL)` saved before the kill and reloads from the bucket"""
    bucket = store.bucket()
    url,path = f"{store.scheme}://{bucket}/run1",f"{bucket}/run1"
    whole = values(ranks(fit_to, str(tmp_path/'whole'), f"{store.scheme}://{bucket}/whole", 4, None, None, True, init=False, timeout=240, env=store.env))
    killed = lambda: (tmp_path/'a'/'killed').exists()
    assert ranks(fit_to, str(tmp_path/'a'), url, 4, 1, None, True, init=False, timeout=240, env=store.env, kill_when=killed) is None
    fs = store.fs()
    assert fs.exists(f"{bucket}/run1_best.pth"), "premise: the best model SafeSaveModelCallback saved at epoch 0 is in the bucket before the kill"
    assert listed(fs, path) == ['epoch_0001', 'epoch_0002', 'latest']
    assert fs.cat_file(path+'/latest') == b'epoch_0002'
    assert listed(fs, path+'/epoch_0002') == ['manifest.json', 'model.pth', 'rng.pth', 'state.pth']
    inspect = subprocess.run([sys.executable, '-m', 'ddp_safe_fastai.check', 'inspect', url], capture_output=True, text=True,
                             env={**os.environ, **store.env}, timeout=240)
    assert inspect.returncode == 0 and f"{url}: 2 checkpoint(s); latest names 'epoch_0002'" in inspect.stdout, inspect
    assert "a resume takes epoch_0002 (saved on 2 rank(s))" in inspect.stdout, inspect.stdout
    shutil.rmtree(tmp_path/'a')  # the machine is gone; a new one has an empty disk
    r0,r1 = values(ranks(fit_to, str(tmp_path/'a'), url, 4, None, None, True, init=False, timeout=240, env=store.env))
    assert r0['resumed_from'] == r1['resumed_from'] == 'epoch_0002'
    for w,v in zip(r0['weights'], whole[0]['weights']): assert torch.equal(w, v)  # bit for bit the uninterrupted run
    assert fs.cat_file(path+'/latest') == b'epoch_0004'
    # the bucket keeps what the local directory keeps: the newest 2, and the checkpoint this run resumed from
    assert listed(fs, path) == r0['local'] == ['epoch_0002', 'epoch_0003', 'epoch_0004', 'latest']
    shutil.rmtree(tmp_path/'a')  # again, on a machine of 1 process
    (r,) = values(torchrun_ranks(fit_to, str(tmp_path/'a'), url, 5, None, None, True, nproc=1, init=False, timeout=240, env=store.env))
    assert r['resumed_from'] == 'epoch_0004'

class Started(Callback):
    "Notes when the fit starts, before the other callbacks' `before_fit`"
    order = -100
    def before_fit(self): self.at = time.monotonic()

def faults(root, urls_and_options):
    "A fit checkpointing to each (url, storage_options): what each rank raised, and how long after the fit started"
    out = []
    for url,opts in urls_and_options:
        learn,started = synth_learner(path=Path(root)),Started()
        try:
            with learn.distrib_ctx(): learn.fit(1, cbs=[started, CheckpointCallback(url, storage_options=opts)])
            out.append((None, time.monotonic()-started.at))
        except CheckpointError as e: out.append((str(e), time.monotonic()-started.at))
    return out

def test_store_faults_fail_at_the_start(tmp_path, swift):
    """An endpoint that does not answer, a bucket that does not exist, refused credentials: one error on every rank as the
    fit starts, naming the URL and what is wrong, within seconds; nothing is written"""
    from ddp_safe_fastai.launch import free_port
    bucket = swift.bucket()
    cases = [(f"s3://{bucket}/run", dict(endpoint_url=f"http://127.0.0.1:{free_port()}")),
             ("s3://nosuchbucket123/run", None),
             (f"s3://{bucket}/run", dict(key='test:tester', secret='wrong'))]
    r0,r1 = values(ranks(faults, str(tmp_path), cases, init=False, timeout=240, env=swift.env))
    for (m0,t0),(m1,t1),(url,_),want in zip(r0, r1, cases, ['its endpoint does not answer (EndpointConnectionError: Could not connect', 'the bucket (or container) does not exist', 'the credentials were refused (PermissionError']):
        assert m0 == m1 and m0 is not None, (m0, m1)
        assert f"CheckpointCallback(fname='{url}')" in m0 and f"{url} cannot be written" in m0, m0
        assert any(w in m0 for w in want.split('|')), m0
        assert t0 < 20, f"the fit failed as it started, not after a retry budget: {url} after {t0:.1f}s"
    assert not (tmp_path/'models').exists() or not any((tmp_path/'models').rglob('epoch_*'))
    assert swift.fs().ls(bucket, refresh=True) == []

class SlowBatches(Callback):
    "Each training batch takes `delay` seconds longer: the run outlasts the store's absence"
    def __init__(self, delay): self.delay = delay
    def after_batch(self):
        if self.training: time.sleep(self.delay)

class Hold(Callback):
    """After epoch `at`'s checkpoint is committed: rank 0 waits until its uploads are all in the bucket (`expect='sent'`)
    or have failed past `upload_timeout` (`'failed'`), saying so in the file `marker`; then every rank waits for the file
    `go`, if given. The run gets no further than the test needs, however fast the machine"""
    order = CheckpointCallback.order+1
    def __init__(self, at, expect, marker=None, go=None): self.at,self.expect,self.marker,self.go = at,expect,marker,go
    def after_epoch(self):
        if self.epoch != self.at: return
        tier = self.learn.checkpoint.tiers['durable']
        tier.wait()  # committed locally
        if tier.uploads:  # rank 0
            try: tier.uploads.wait(); failure = None
            except CheckpointError as e: failure = e
            assert (failure is None) == (self.expect == 'sent'), f"premise: after epoch {self.at}, the uploads {self.expect} ({failure})"
            if self.marker: Path(self.marker).touch()
        end = time.monotonic() + 120
        while self.go and not Path(self.go).exists():
            assert time.monotonic() < end, f"premise: the test made {self.go} within 120 s of {self.marker}"
            time.sleep(0.05)
        distrib_barrier(timeout=120)

def fit_slowly(root, url, n_epoch, kwargs=None, models=False, export=False, holds=()):
    """`n_epoch` epochs of 16 slowed batches checkpointed to `url` (`CheckpointCallback`'s `kwargs` too), with `models`
    each epoch's model saved to `url`_model_<epoch> too (`SafeSaveModelCallback(every_epoch=True)`): the weights, or the
    error each rank raised; what it printed. With `export`, a fit that raised is followed by `Learner.export` to
    `url`.pkl with `upload_timeout=3`: what that raised, and whether its local copy is in place. `holds`: `Hold`s' arguments"""
    learn,said = synth_learner(n=128, path=Path(root), seed=5),io.StringIO()
    each = [SafeSaveModelCallback(fname=url+'_model', every_epoch=True)] if models else []
    ckpt = CheckpointCallback(url, **(kwargs or {}))
    try:
        with contextlib.redirect_stdout(said), learn.distrib_ctx(): learn.fit(n_epoch, 0.02, cbs=[ckpt, *each, SlowBatches(0.1), *[Hold(*h) for h in holds]])
    except CheckpointError as e:
        out = dict(error=str(e), epoch=learn.epoch, said=said.getvalue())
        if export:
            try: learn.export(url+'.pkl', upload_timeout=3)
            except CheckpointError as e: out.update(export_error=str(e), export_local=(Path(root)/local_copy_name(url+'.pkl')).exists())
        return out
    return dict(weights=weights(learn), error=None, said=said.getvalue(), resumed_from=ckpt.resumed_from)

class Uploaded:
    "Polled: is a first checkpoint in the bucket, its `latest` there? (asked of the store every 0.2 s; once seen, it stays seen)"
    def __init__(self, fs, url): self.fs,self.latest,self.asked,self.seen = fs,url.split('://')[1]+'/latest',0,False
    def __call__(self):
        if not self.seen and time.monotonic() - self.asked > 0.2:
            self.asked = time.monotonic(); self.fs.invalidate_cache()
            self.seen = self.fs.exists(self.latest)
        return self.seen

class AwayWhile:
    "Polled while the ranks run: stop Swift's proxy once `when()` (then touch the file `gone`, if given), start it again `away` seconds later (never if None)"
    def __init__(self, swift, when, away, gone=None): self.swift,self.when,self.away,self.gone,self.stopped = swift,when,away,gone,None
    def __call__(self):
        if self.stopped is None and self.when():
            self.swift.stop_proxy(); self.stopped = time.monotonic()
            if self.gone: Path(self.gone).touch()
        elif self.stopped and self.away is not None and time.monotonic() - self.stopped > self.away: self.swift.start_proxy(); self.away = None
        return False

def test_store_gone_fails_past_the_upload_timeout(tmp_path, swift):
    """The store stops answering for good: past `upload_timeout` the failed upload is raised on every rank at one call,
    naming the URL and the endpoint; the local checkpoints are kept; `Learner.export(URL)` then fails the same way past
    its own `upload_timeout`, its local copy not put in place; once the store is back, a run on a new machine resumes
    from the bucket's last"""
    url = f"s3://{swift.bucket()}/run"
    cache,sent,gone = tmp_path/'a'/'models'/local_copy_name(url),tmp_path/'epoch_0001_sent',tmp_path/'store_gone'
    # the run waits: after epoch_0001 is in the bucket, for the store to go; after epoch_0002, for its upload to fail for good
    holds = [(0, 'sent', str(sent), str(gone)), (1, 'failed')]
    away = AwayWhile(swift, sent.exists, None, gone)
    try: outs = ranks(fit_slowly, str(tmp_path/'a'), url, 6, dict(upload_timeout=3), False, True, holds, init=False, timeout=240, env={**swift.env, 'DDP_SAFE_UPLOAD_RETRY': '2'}, kill_when=away)
    finally: swift.start_proxy()
    r0,r1 = values(outs)
    assert r0['error'] == r1['error'] and r0['error'] is not None, (r0, r1)
    assert r0['epoch'] == r1['epoch'] == 2, f"premise: the failure was raised at epoch_0003's checkpoint, the first after the uploads failed ({r0['epoch']}, {r1['epoch']})"
    assert f"upload to {url} (endpoint {swift.endpoint}) failed, still after 3s (upload_timeout)" in r0['error'], r0['error']
    assert r0['export_error'] == r1['export_error'] and f"upload to {url}.pkl (endpoint {swift.endpoint}) failed, still after 3s (upload_timeout): " in r0['export_error'], (r0, r1)
    assert not r0['export_local'] and not swift.fs().exists(url[5:]+'.pkl')
    assert f"{url} is behind" in r0['said'], r0['said']
    assert is_complete(cache/'epoch_0002'), f"epoch_0002, which the store never took, is kept locally: {sorted(p.name for p in cache.iterdir())}"
    shutil.rmtree(tmp_path/'a')
    r0,r1 = values(ranks(fit_to, str(tmp_path/'a'), url, 3, init=False, timeout=240, env=swift.env))
    assert r0['resumed_from'] == r1['resumed_from'] == 'epoch_0001'

class OutageWhile:
    "Polled while the ranks run: once `when()`, the relay goes `mode` (then the file `out` is made, if given) for `seconds` and until `until()`, then up again"
    def __init__(self, relay, when, mode, seconds, until=lambda: True, out=None):
        self.relay,self.when,self.mode,self.seconds,self.until,self.out,self.start,self.over = relay,when,mode,seconds,until,out,None,False
    def __call__(self):
        if self.start is None and self.when():
            self.relay.set(self.mode); self.start = time.monotonic()
            if self.out: Path(self.out).touch()
        elif self.start and not self.over and time.monotonic() - self.start > self.seconds and self.until(): self.relay.set('up'); self.over = True
        return False

@pytest.mark.parametrize('mode', ['stall', 'refuse'])
def test_store_out_longer_than_the_timeout(tmp_path, swift, mode):
    """The endpoint stalls (takes connections, never answers) or refuses them for 18 s, longer than `DDP_SAFE_TIMEOUT`
    (12 s), once the first checkpoint is in the bucket: the training goes on and the run ends, rank 0 saying the bucket
    is behind and has caught up; the bucket's `latest` names the last checkpoint, every epoch's model that
    `SafeSaveModelCallback(fname=URL)` saved is there, and a run on an empty disk resumes from the bucket with the same
    weights"""
    url = f"s3://{swift.bucket()}/run"
    last = tmp_path/'a'/'models'/local_copy_name(url)/'epoch_0006'/'manifest.json'  # the fit's last checkpoint, committed locally
    with Outage(swift.endpoint) as relay:
        out = OutageWhile(relay, Uploaded(swift.fs(), url), mode, 18, until=last.exists)
        env = {**swift.env, 'AWS_ENDPOINT_URL': relay.endpoint, 'DDP_SAFE_TIMEOUT': '12'}
        r0,r1 = values(ranks(fit_slowly, str(tmp_path/'a'), url, 6, None, True, init=False, timeout=240, env=env, kill_when=out))
        assert out.over, "premise: the outage began once a first checkpoint was in the bucket, and ended once epoch_0006 was committed locally"
        assert r0['error'] is None and r1['error'] is None, (r0.get('error'), r1.get('error'))
        assert f"CheckpointCallback: {url} is behind" in r0['said'] and f"{url} has caught up: epoch_0006 uploaded" in r0['said'], r0['said']
        assert f"SafeSaveModelCallback: {url}_model is behind" in r0['said'], r0['said']
        fs = swift.fs()
        assert fs.cat_file(url[5:]+'/latest') == b'epoch_0006'
        assert [fs.cat_file(url[5:]+f'_model_{e}.pth') == (tmp_path/'a'/'models'/(local_copy_name(url)+f'_model_{e}.pth')).read_bytes() for e in range(6)] == [True]*6
        shutil.rmtree(tmp_path/'a')
        again = values(ranks(fit_slowly, str(tmp_path/'a'), url, 6, None, True, init=False, timeout=240, env=env))
    assert again[0]['resumed_from'] == 'epoch_0006'
    for w,v in zip(again[0]['weights'], r0['weights']): assert torch.equal(w, v)

def export_during_an_outage(root, url, stalled):
    """A fit, then, once the file `stalled` says the endpoint stalls, `Learner.export(url)`, the store's read timeout 3 s:
    what each rank raised, what it printed"""
    learn,said = synth_learner(n=128, path=Path(root), seed=5),io.StringIO()
    with learn.distrib_ctx(): learn.fit(1, 0.02)
    end = time.monotonic() + 120
    while not Path(stalled).exists(): assert time.monotonic() < end, f"premise: the endpoint stalled within 120 s (rank {rank_distrib()})"; time.sleep(0.05)
    try:
        with contextlib.redirect_stdout(said): learn.export(url, storage_options=dict(config_kwargs=dict(read_timeout=3)))
        error = None
    except CheckpointError as e: error = str(e)
    return dict(error=error, said=said.getvalue())

def test_export_during_an_outage(tmp_path, swift):
    """`Learner.export(URL)` while the endpoint stalls for 20 s, longer than `DDP_SAFE_TIMEOUT` (8 s): every rank waits,
    rank 0 says the bucket is behind and has caught up, the export is in the bucket. (Past `upload_timeout`:
    `test_store_gone_fails_past_the_upload_timeout`)"""
    url = f"s3://{swift.bucket()}/run/export.pkl"
    with Outage(swift.endpoint) as relay:
        env = {**swift.env, 'AWS_ENDPOINT_URL': relay.endpoint, 'DDP_SAFE_TIMEOUT': '8'}
        out = OutageWhile(relay, lambda: True, 'stall', 20, out=tmp_path/'stalled')
        r0,r1 = values(ranks(export_during_an_outage, str(tmp_path/'a'), url, str(tmp_path/'stalled'), init=False, timeout=240, env=env, kill_when=out))
    assert out.over, "premise: the endpoint stalled 20 s, the export's upload in it"
    assert r0['error'] is None and r1['error'] is None, (r0, r1)
    assert f"Learner.export: {url} is behind (" in r0['said'] and f"Learner.export: {url} has caught up" in r0['said'], r0['said']
    assert swift.fs().cat_file(url[5:]) == (tmp_path/'a'/local_copy_name(url)).read_bytes()

class HoldInUpload(Callback):
    """Rank 0's uploads: epoch_0001's waited for after the first epoch; epoch_0002's held as it starts, the file `marker`
    saying so, until the process is killed"""
    order = CheckpointCallback.order+1
    def __init__(self, marker): self.marker = marker
    def before_fit(self):
        storage,put = self.learn.checkpoint.storage,self.learn.checkpoint.storage.put
        def held(local, *names):
            if names[0] == 'epoch_0002': Path(self.marker).touch(); time.sleep(120)
            return put(local, *names)
        storage.put = held
    def after_epoch(self):
        if self.epoch != 0: return
        tier = self.learn.checkpoint.tiers['durable']
        tier.wait()
        if tier.uploads: assert tier.uploads.wait(120), "premise: epoch_0001 is in the bucket before epoch 2 trains"
        distrib_barrier()

def fit_with_ballast(root, url, n_epoch, hold=None):
    "`n_epoch` epochs checkpointed to `url`, the model carrying 64 MiB of ballast: each upload takes a while; `hold`: `HoldInUpload`'s marker"
    learn = synth_learner(n=128, path=Path(root), seed=5)
    learn.model.register_buffer('ballast', torch.zeros(2**24))
    ckpt = CheckpointCallback(url)
    with learn.distrib_ctx(): learn.fit(n_epoch, 0.02, cbs=[ckpt, SlowBatches(0.05), *([HoldInUpload(hold)] if hold else [])])
    return dict(resumed_from=ckpt.resumed_from)

def test_kill_during_an_upload(tmp_path, swift):
    """The run is killed while a checkpoint uploads: the bucket's copy of it is never taken; a new machine resumes from the
    one before, and aborts the multipart uploads a kill left open under the run's prefix (not another's)"""
    url = f"s3://{swift.bucket()}/run"
    held = tmp_path/'epoch_0002_uploading'
    assert ranks(fit_with_ballast, str(tmp_path/'a'), url, 4, str(held), init=False, timeout=240, env=swift.env, kill_when=held.exists) is None
    fs = swift.fs()
    assert fs.cat_file(url[5:]+'/latest') == b'epoch_0001', "the kill came after epoch_0001 was uploaded whole"
    assert not fs.exists(url[5:]+'/epoch_0002/manifest.json'), "the kill came before epoch_0002's manifest was uploaded"
    # what a kill inside an upload of over 100 MiB leaves (s3fs sends it in parts): an open multipart upload, its part stored
    bucket = url[5:].split('/')[0]
    for key in ('run/epoch_0002/state.pth', 'other/state.pth', 'run/sub/epoch_0001/state.pth'):  # another run's, and a run's under a longer prefix
        upload = fs.call_s3('create_multipart_upload', Bucket=bucket, Key=key)
        fs.call_s3('upload_part', Bucket=bucket, Key=key, UploadId=upload['UploadId'], PartNumber=1, Body=bytes(5*2**20))
    assert sorted(u['Key'] for u in fs.list_multipart_uploads(bucket)) == ['other/state.pth', 'run/epoch_0002/state.pth', 'run/sub/epoch_0001/state.pth']
    shutil.rmtree(tmp_path/'a')
    r0,r1 = values(ranks(fit_with_ballast, str(tmp_path/'a'), url, 3, init=False, timeout=240, env=swift.env))
    assert r0['resumed_from'] == r1['resumed_from'] == 'epoch_0001'
    assert fs.cat_file(url[5:]+'/latest') == b'epoch_0003'
    assert sorted(u['Key'] for u in fs.list_multipart_uploads(bucket)) == ['other/state.pth', 'run/sub/epoch_0001/state.pth']

def test_replica_groups_leave_the_writers_uploads(tmp_path, swift):
    """torchft's replica groups (`ddp-safe-ft`, 2 groups) checkpointing to a bucket. An upload open there, as the
    writer's in flight, is left alone when group 1 is killed and started again beside its live peer (it takes the peer's
    state, or resumes from the checkpoint at the peer's step when the peer waits there). Every group killed at once, the
    groups started again take the checkpoint, and the writer aborts the upload, as a killed run's. `--min-replicas 2`:
    no step without both groups, however long a start takes"""
    bucket,key = swift.bucket(),'run/epoch_0000_iter_000005/state.pth'  # a checkpoint's file under the run's prefix
    fs = swift.fs()
    opened = lambda: [u['Key'] for u in fs.list_multipart_uploads(bucket)]
    run = Run(tmp_path, 2, epochs=2, flags=('--min-replicas', '2'), N=6400, STEP_PAUSE=0.05, CKPT_URL=f"s3://{bucket}/run", **swift.env)
    try:
        deadline = time.monotonic() + 150
        run.until(lambda: all((r := run.last(g)) and r['step'] > 12 for g in range(2)), "the groups did not train", deadline)
        up = fs.call_s3('create_multipart_upload', Bucket=bucket, Key=key)  # after the run's start, which aborts what it finds
        fs.call_s3('upload_part', Bucket=bucket, Key=key, UploadId=up['UploadId'], PartNumber=1, Body=bytes(5*2**20))  # its part stored
        killed = run.last(1)['pid']
        os.kill(killed, signal.SIGKILL)
        run.until(lambda: run.last(1)['pid'] != killed, "group 1 did not train again", deadline)
        assert opened() == [key], "a group started again beside a live writer aborted the uploads in the bucket"
        steps = [run.last(g)['step'] for g in range(2)]
        run.until(lambda: all(run.last(g)['step'] > s + 20 for g,s in enumerate(steps)), "the groups did not train on", deadline)
        for g in range(2): os.kill(run.last(g)['pid'], signal.SIGKILL)
        (run.out/'fast').touch()
        code = run.wait(timeout=200)
    finally: kill_tree(run.p.pid)
    said = run.said.read_text()
    assert code == 0, said[-3000:]
    assert re.search(rf"aborted \d+ upload\(s\) to \S+ that a killed run left unfinished: .*{re.escape(key)}", said) and opened() == [], said[-3000:]
    assert 'resumed from' in said, said[-3000:]
    check_replicas(run)

def save_to_urls(root, bucket):
    "A fit with `SafeSaveModelCallback('s3://...')`, then `export('s3://...')`, then an export to a missing bucket: what each gave"
    learn = synth_learner(n=128, path=Path(root), seed=5)
    with learn.distrib_ctx(): learn.fit(3, 0.02, cbs=SafeSaveModelCallback(fname=f"s3://{bucket}/run/best"))
    best = weights(learn)  # the end-of-fit reload: the best epoch's weights
    learn.export(f"s3://{bucket}/run/export.pkl")
    try: learn.export("s3://nosuchbucket123/export.pkl"); error = None
    except CheckpointError as e: error = str(e)
    try:
        with learn.distrib_ctx(): learn.fit(1, cbs=SafeSaveModelCallback(fname="s3://nosuchbucket123/best")); fit_error = None
    except CheckpointError as e: fit_error = str(e)
    return dict(best=best, error=error, fit_error=fit_error, local=sorted(p.name for p in Path(root).rglob('*') if p.is_file()))

def test_export_and_best_model_to_a_bucket(tmp_path, swift):
    """`SafeSaveModelCallback(fname=URL)` uploads the best model (the end-of-fit reload reads the local copy), and
    `Learner.export(URL)` the exported Learner; a missing bucket fails on every rank, naming the URL: at the export, and
    as a fit with `SafeSaveModelCallback` starts"""
    bucket = swift.bucket()
    r0,r1 = values(ranks(save_to_urls, str(tmp_path), bucket, init=False, timeout=240, env=swift.env))
    fs = swift.fs()
    assert listed(fs, f"{bucket}/run") == ['best.pth', 'export.pkl']
    uploaded = torch.load(fs.open(f"{bucket}/run/best.pth"), weights_only=True)
    for w,v in zip(r0['best'], uploaded.values()): assert torch.equal(w, v)
    from fastai.learner import load_learner
    fs.get_file(f"{bucket}/run/export.pkl", str(tmp_path/'downloaded.pkl'))
    assert type(load_learner(tmp_path/'downloaded.pkl').model).__name__ == 'Linear'
    assert r0['error'] == r1['error'] == "upload to s3://nosuchbucket123/export.pkl: FileNotFoundError: The specified bucket does not exist.", r0['error']
    assert r0['local'] == ['s3_' + bucket + '_run_best.pth', 's3_' + bucket + '_run_export.pkl'], r0['local']
    # a store that cannot be written stops the fit as it starts, on every rank
    assert r0['fit_error'] == r1['fit_error'] and "SafeSaveModelCallback(fname='s3://nosuchbucket123/best'): failed on rank(s) [0]: s3://nosuchbucket123 cannot be written: the bucket (or container) does not exist" in r0['fit_error'], r0['fit_error']

def fit_and_export_with_options(root, bucket, options):
    """Both callbacks given in `Learner(cbs=...)`, to URLs, with `storage_options` (the environment has no credential); a
    fit, `Learner.export` to the disk and to the bucket; then a fit with a wrong secret: what it raised"""
    learn = synth_learner(n=128, path=Path(root), seed=5, cbs=[
        CheckpointCallback(f"s3://{bucket}/ckpt", storage_options=options),
        SafeSaveModelCallback(fname=f"s3://{bucket}/best", storage_options=options)])
    with learn.distrib_ctx(): learn.fit(2, 0.02)
    learn.export()
    learn.export(f"s3://{bucket}/export.pkl", storage_options=options)
    try:
        with learn.distrib_ctx(): learn.fit(1, cbs=CheckpointCallback(f"s3://{bucket}/other", storage_options={**options, 'secret': 'not' + options['secret']}))
    except CheckpointError as e: return str(e)

_loaded_elsewhere = """
import sys
from pathlib import Path
from fastai.learner import load_learner
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
export, root, options, bucket = sys.argv[1], sys.argv[2], eval(sys.argv[3]), sys.argv[4]
learn = load_learner(export, places=[bucket])  # the bucket its callbacks write to, named by the loading call (a file never chooses one)
learn.path, learn.dls = Path(root), synth_learner(n=128, path=Path(root), seed=5).dls
if options == 'none':
    try: learn.fit(1)
    except CheckpointError as e: print(e)
else:
    if options: learn.checkpoint.storage_options = learn.safe_save_model.storage_options = options
    learn.fit(1)
    print(learn.checkpoint.resumed_from, learn.checkpoint.tiers['durable'].local.named_latest())
"""

def test_no_credential_in_a_file(tmp_path, swift):
    """Credentials given in `storage_options` to both callbacks attached to the Learner: no file the run writes (export,
    checkpoints, manifests, the best model, on the disk and in the bucket) and no error holds the key or the secret; the
    export, loaded on another machine, says which options it lacks, and fits again once they are given again or the
    environment holds them"""
    bucket, owner = swift.bucket(), swift.owner
    no_credentials = {'AWS_ACCESS_KEY_ID': '', 'AWS_SECRET_ACCESS_KEY': '', 'AWS_EC2_METADATA_DISABLED': 'true',
                      'AWS_SHARED_CREDENTIALS_FILE': str(tmp_path/'none'), 'AWS_CONFIG_FILE': str(tmp_path/'none')}
    errors = values(ranks(fit_and_export_with_options, str(tmp_path/'run'), bucket, owner, init=False, timeout=240, env=no_credentials))
    assert errors[0] == errors[1] and f"s3://{bucket}/other" in errors[0], errors  # the wrong secret was refused, on every rank
    fs = swift.fs()
    written = {str(p): p.read_bytes() for p in (tmp_path/'run').rglob('*') if p.is_file()}
    written.update({f"s3://{k}": fs.cat_file(k) for k in fs.find(bucket)})
    assert f"{tmp_path}/run/export.pkl" in written and f"s3://{bucket}/export.pkl" in written and f"s3://{bucket}/ckpt/latest" in written
    assert any(k.endswith('best.pth') for k in written) and any(k.endswith('manifest.json') for k in written)
    for secret in (owner['secret'], owner['key']):
        assert not [k for k,data in written.items() if secret.encode() in data], secret  # nowhere, as bytes
        assert secret not in errors[0]
    # another machine: the export, without the options
    elsewhere = lambda options, env: subprocess.run(
        [sys.executable, '-c', _loaded_elsewhere, str(tmp_path/'run'/'export.pkl'), str(tmp_path/'elsewhere'), repr(options), f"s3://{bucket}"],
        capture_output=True, text=True, timeout=180, env={**os.environ, 'AWS_ENDPOINT_URL': swift.endpoint, **no_credentials, **env})
    lacking = elsewhere('none', {})
    assert lacking.returncode == 0, lacking.stderr[-3000:]
    # the first callback to start names its URL and the options it lacks
    assert (f"SafeSaveModelCallback(fname='s3://{bucket}/best'): failed on rank(s) [0]: s3://{bucket} cannot be written: "
            "NoCredentialsError") in lacking.stdout, lacking.stdout
    assert ("(its storage_options endpoint_url, key, secret are never saved with the Learner: set them again, "
            "`learn.safe_save_model.storage_options = {...}`, or give them in the environment)") in lacking.stdout, lacking.stdout
    given = elsewhere(owner, {})  # given again: the loaded Learner's third epoch, checkpointed to the bucket
    assert given.returncode == 0 and given.stdout.splitlines()[-1] == 'None epoch_0003', (given.stdout, given.stderr[-3000:])
    from_env = elsewhere(None, {k: v for k,v in swift.env.items() if k != 'AWS_ENDPOINT_URL'})  # the environment's: the same fit again resumes
    assert from_env.returncode == 0 and from_env.stdout.splitlines()[-1] == 'epoch_0003 epoch_0003', (from_env.stdout, from_env.stderr[-3000:])
