"""Checkpoints in object storage, measured side by side in one run against a real OpenStack Swift with its S3 API on
this machine (tools/swift.sh, started and stopped here; issue 34): the upload of a committed checkpoint against plain
s3fs `put_file`s of the same files (s3fs with its own defaults); the download of a resume against plain `get_file`s; on 2 ranks under torchrun, an
epoch of a fit that checkpoints to the bucket after every epoch against one that checkpoints nothing (and one that
checkpoints to a local directory only), and the host memory rank 0 holds above the fit without checkpoints, in checkpoints (with glibc's default allocator, which gives
large blocks back: run it without tools/bench.sh's `MALLOC_*` settings, under which freed memory stays resident).

    .venv-latest/bin/python benchmarks/object_store.py [--remote-like]"""
import os, sys, time, statistics, tempfile, threading, subprocess, secrets
from pathlib import Path
import psutil, torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from ddp_safe_fastai.launch import torchrun_ranks

MB = 100  # the checkpoint of the transfer measures

def transfers(d, url, reps=5):
    "Seconds (medians of `reps`, the side that goes first alternating) of the library's upload and download of a MB-sized checkpoint, and of plain s3fs's"
    root = Path(d)/'local'
    CheckpointDir(root).commit('epoch_0001', {'state.pth': {'w': torch.randn(MB*2**20//4)}}, dict(epoch=1, iter=0, fit=0, world_size=1), root/'latest')
    ckpt,files = root/'epoch_0001',['state.pth', 'manifest.json']
    got = {k: [] for k in ('upload', 'put', 'download', 'get')}
    def timed(key, f):
        t = time.perf_counter(); f(); got[key].append(time.perf_counter() - t)
    import fsspec
    plain = fsspec.filesystem('s3', skip_instance_cache=True)  # s3fs as a user makes it: its defaults, the endpoint from the environment
    for i in range(reps):
        store = ObjectStoreDir(f"{url}/{i}")
        def put():
            for f in files: plain.put_file(str(ckpt/f), store.path('plain', f))
        def get():
            for f in files: plain.get_file(store.path('plain', f), str(Path(d)/f'get{i}_{f}'))
        sides = [('upload', lambda: store.upload(ckpt)), ('put', put)]
        for key,f in (sides if i % 2 == 0 else sides[::-1]): timed(key, f)
        sides = [('download', lambda: store.download('epoch_0001', Path(d)/f'down{i}'/'epoch_0001')), ('get', get)]
        for key,f in (sides if i % 2 == 0 else sides[::-1]): timed(key, f)
    return {k: statistics.median(v) for k,v in got.items()}

class EpochTimes(Callback):
    "The seconds of each epoch, and (on rank 0) the most resident memory seen during the fit above that at its start"
    order = CheckpointCallback.order+1  # after the checkpoint's own work in `after_epoch`
    def before_fit(self):
        self.times,self.peak,self.done = [],0,threading.Event()
        start = psutil.Process().memory_info().rss
        def sample():
            while not self.done.wait(0.005): self.peak = max(self.peak, psutil.Process().memory_info().rss - start)
        self.sampler = threading.Thread(target=sample, daemon=True); self.sampler.start()
    def before_epoch(self): self.t = time.perf_counter()
    def after_epoch(self): self.times.append(time.perf_counter() - self.t)
    def after_fit(self): flush_saves(); self.done.set(); self.sampler.join()

def fits(root, url, reps=2, n_epoch=4, arms=('plain', 'local', 'bucket')):
    "On each rank: the median epoch of each of `arms` (no checkpoint, one in a local directory, in `url`: in turns) and its peak extra memory"
    learn = synth_learner(n=2**12, path=Path(root), seed=1)
    learn.model.register_buffer('ballast', torch.randn(2**23))  # 32 MiB: each checkpoint takes a while to upload
    got = {k: ([], []) for k in arms}
    for i in range(len(arms)*reps):
        key = arms[i % len(arms)]
        times = EpochTimes()
        cbs = [times] + ([CheckpointCallback(f"{url}/fit{i}", resume=False)] if key == 'bucket' else
                         [CheckpointCallback(f"local{i}", resume=False)] if key == 'local' else [])
        with learn.distrib_ctx(): learn.fit(n_epoch, 1e-3, cbs=cbs)
        got[key][0].extend(times.times[1:]); got[key][1].append(times.peak)  # the first epoch warms up
    return {k: (statistics.median(t), max(m)) for k,(t,m) in got.items()}, state_bytes(learn.model.state_dict())

if __name__ == '__main__':
    tools = Path(__file__).parent.parent/'tools'
    with tempfile.TemporaryDirectory() as d:
        server = Path(d)/'swift'
        # `--remote-like`: Swift's processes at the lowest CPU priority, as if the store were on another machine (its CPU
        # no longer the training's): what is left of an epoch's cost is the library's and its client's
        nice = ['nice', '-n', '19'] if '--remote-like' in sys.argv else []
        subprocess.run([*nice, str(tools/'swift.sh'), 'start', str(server)], check=True, capture_output=True)
        try:
            endpoint = (server/'endpoint').read_text().strip()
            env = dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID='test:tester', AWS_SECRET_ACCESS_KEY='testing', AWS_DEFAULT_REGION='us-east-1')
            os.environ.update(env)
            bucket = f"bench{secrets.token_hex(4)}"
            import s3fs; s3fs.S3FileSystem().mkdir(bucket)
            t = transfers(d, f"s3://{bucket}/transfers")
            print(f"{MB} MiB checkpoint, Swift S3 API on 127.0.0.1: upload {t['upload']:.2f} s, plain s3fs put_file {t['put']:.2f} s: "
                  f"throughput {t['put']/t['upload']:.2f} of plain; download {t['download']:.2f} s (checksums checked), plain get_file "
                  f"{t['get']:.2f} s: throughput {t['get']/t['download']:.2f} of plain")
            outcomes = torchrun_ranks(fits, str(Path(d)/'fits'), f"s3://{bucket}/fits", 4, init=False, timeout=1500, env=env)  # 4 fits of each arm
            assert all(o.ok for o in outcomes), [o.error for o in outcomes]
            for r,o in enumerate(outcomes):
                res,ckpt_bytes = o.value
                (plain,mem_plain),(local_t,mem_local),(bucket_t,mem_bucket) = res['plain'],res['local'],res['bucket']
                print(f"rank {r}: median epoch {plain:.2f} s without checkpoints, {local_t:.2f} s checkpointing locally, {bucket_t:.2f} s "
                      f"checkpointing to the bucket after each ({ckpt_bytes/2**20:.0f} MiB): {bucket_t/plain:.3f}x" + (
                      f"; most memory above the fit's start: {mem_plain/2**20:.0f} MiB plain, {mem_local/2**20:.0f} MiB with local "
                      f"checkpoints ({(mem_local-mem_plain)/ckpt_bytes:.2f} checkpoints), {mem_bucket/2**20:.0f} MiB with uploads "
                      f"({(mem_bucket-mem_plain)/ckpt_bytes:.2f} checkpoints)" if r == 0 else ''))
        finally: subprocess.run([str(tools/'swift.sh'), 'stop', str(server)])
