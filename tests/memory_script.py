"""A user's training script with memory checkpoints: dropout, random noise on the inputs, one-cycle, a durable checkpoint
every epoch. torchrun ... ROOT MEMORY_EVERY [EPOCHS]. KILL_AT=N KILL_RANK=R: in torchrun's first attempt, rank R is
SIGKILLed as training batch N starts (KILL_RANK=all: every rank, once the last epoch's checkpoint is written). MEMORY_DIR: the tmpfs (MEMORY_DIR_<rank>: that rank's). Each rank logs the training batches it starts
(`batches<rank>.txt`: attempt, batch, time). WIDTH=W: the hidden layer's width (default 32). ASYNC=0: `async_save=False`.
COPY=1: after the fit, time one copy of the state into memory already there, its cache flushed. COPY_EACH=1: rank 0 times
one copy of the state into memory already there after every training batch, as a memory checkpoint would take it.
LEAST=1 (with MEMORY_EVERY 0): after every training batch, the least a memory checkpoint does (`LeastCheckpoint`)"""
import time; started = time.time()  # the worker's start: torchrun's restart ends here
import os, sys, json, signal, hashlib, resource, threading, statistics, pickle, tempfile, shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch
from fastai.basics import *
from fastai.callback.schedule import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from ddp_safe_fastai.memory_tier import RngHandoff
from ddp_safe_fastai.raw_state import TensorFile
from ddp_safe_fastai.train_state import RecordedFloats, _callback_states

attempt = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0))
imported = time.time()

def resident(peak={'private': 0}, stop=threading.Event()):
    "Sample this process's resident memory but the tmpfs pages it maps (RssAnon + RssFile), every 20 ms: its peak, in MiB"
    def sample():
        while not stop.wait(0.02):
            kb = {l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(('RssAnon', 'RssFile'))}
            peak['private'] = max(peak['private'], sum(kb.values())/1024)
    threading.Thread(target=sample, daemon=True).start()
    return peak

class Noise(Callback):
    def before_batch(self):
        if self.training: self.learn.xb = (self.xb[0] + 0.1*torch.randn_like(self.xb[0]),)

class LogAndKill(Callback):
    order = -20  # before any other callback sees the batch
    def before_fit(self): self.log = open(root/f"batches{rank_distrib()}.txt", 'a')
    def before_batch(self):
        if not self.training: return
        self.log.write(f"{attempt} {self.train_iter} {time.time()}\n"); self.log.flush()
        if attempt == 0 and self.train_iter == int(os.environ.get('KILL_AT', -1)) and os.environ.get('KILL_RANK', '0') in ('all', str(rank_distrib())):
            if os.environ['KILL_RANK'] == 'all': ckpt.tiers['durable'].wait()  # the last epoch's checkpoint is whole on disk, however slow the machine
            os.kill(os.getpid(), signal.SIGKILL)

class Ready(Callback):
    "Just before `CheckpointCallback` resumes: the process group and DDP are up, every rank has met once"
    order = CheckpointCallback.order - 1
    def before_fit(self):
        if torch.distributed.is_initialized(): torch.distributed.barrier()
        self.at = time.time()

root,every,epochs = Path(sys.argv[1]),int(sys.argv[2]),int((sys.argv[3:] or [3])[0])
root.mkdir(parents=True, exist_ok=True)
learn = synth_learner(n=512, path=root, seed=4)
width = int(os.environ.get('WIDTH', 32))
learn.model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Dropout(0.3), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)) if width > 32 else \
              nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
ckpt = CheckpointCallback(memory_every_iters=every or None, async_save=os.environ.get('ASYNC', '1') != '0', memory_dir=os.environ.get(f"MEMORY_DIR_{os.environ.get('RANK')}", os.environ.get('MEMORY_DIR')))
def state_tensors():
    "The tensors a memory checkpoint copies, but the small ones: the weights and the optimizer's state"
    return [p.detach() for p in learn.model.state_dict().values()] + [t for st in learn.opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]

def copy_ms(dest, state):
    "CPU milliseconds of one copy of the tensors `state` into `dest`, memory already there"
    start = time.thread_time()
    for d,x in zip(dest, state): d.copy_(x)
    return 1000*(time.thread_time() - start)

class CopyEach(Callback):
    "On rank 0, after every training batch: one copy of the state into memory already there, its CPU time"
    order = CheckpointCallback.order + 1
    def __init__(self): self.ms,self.dest = [],None
    def after_batch(self):
        if not self.training or rank_distrib() != 0: return
        state = state_tensors()
        if self.dest is None: self.dest = [torch.empty_like(x) for x in state]
        self.ms.append(copy_ms(self.dest, state))

def put(f, at, data):
    "Write the bytes `data` into the mapped `TensorFile` `f` at byte `at`"
    f.bytes[at:at+len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)

class LeastCheckpoint(Callback):
    """The least a memory checkpoint after each training batch does, its CPU time on rank 0 (the writer) as `memory_cost` counts it:
    every rank hands its random states (`RngHandoff`); rank 0 copies the tensors into one of two mapped files, laid out
    once (the state is not laid out again, nor checked to be laid out the same), puts the Recorder's lists and the pickled
    rest of the state after them, and in a thread of its own gathers the random states and writes a header. No manifest,
    no rotation, no run identity, no checks: what it leaves is not a checkpoint anyone reads"""
    order = CheckpointCallback.order + 1
    def before_fit(self):
        self.writes = rank_distrib() == 0
        self.rngs = RngHandoff.of_this_process(sole_writer=self.writes)
        self.recorded,self.files,self.pending,self.n = RecordedFloats(),None,None,0
        self.cpu = dict(training=0., writer=0.)
        if self.writes: self.writer,self.folder = ThreadPoolExecutor(max_workers=1),Path(tempfile.mkdtemp(prefix='least_checkpoint', dir='/dev/shm'))

    def _lay_out(self, tensors):
        "Two files, each with a view of its bytes for each tensor, and where the rest goes"
        room = lambda at: -(-at // 64) * 64
        end = 64 + sum(room(t.nbytes) for t in tensors)
        files = []
        for i in range(2):
            f,views,at = TensorFile(self.folder/str(i), end + 2**20),[],64
            for t in tensors: views.append(f.bytes[at:at+t.nbytes].view(t.dtype).view(t.shape)); at += room(t.nbytes)
            files.append((f, views, end))
        return files

    def after_batch(self):
        if not self.training: return
        start,name = time.thread_time(),str(self.train_iter)
        self.rngs.hand(name)
        if self.writes:
            if self.pending is not None: self.pending.result()
            if self.files is None: self.tensors = state_tensors(); self.files = self._lay_out(self.tensors)
            f,views,at = self.files[self.n % 2]
            with torch.no_grad(): torch._foreach_copy_(views, self.tensors)
            rec = learn.recorder
            rest = dict(epoch=self.epoch, iter=self.iter+1, pct_train=learn.pct_train, train_iter=learn.train_iter, hypers=learn.opt.hypers,
                        values=[list(v) for v in rec.values], smooth_count=rec.smooth_loss.count, smooth_loss=float(rec.smooth_loss.val),
                        callbacks=[(type(cb).__name__, st) for cb,st in _callback_states(learn)])
            for k in RecordedFloats.kinds:
                t = self.recorded.tensor(getattr(rec, k), k)
                f.bytes[at:at+t.nbytes].view(t.dtype).copy_(t); rest[k] = (at, len(t)); at += t.nbytes
            data = pickle.dumps(rest, protocol=2)
            put(f, at, data)
            self.pending = self.writer.submit(self._commit, f, name, at + len(data))
        self.cpu['training'] += time.thread_time() - start; self.n += 1

    def _commit(self, f, name, at):
        "Gather every rank's random states after the rest, then write the header"
        start,rngs = time.thread_time(),b''.join(self.rngs.gather(name))
        put(f, at, rngs)
        put(f, 0, f"{name} {at} {len(rngs)}".encode())
        self.cpu['writer'] += time.thread_time() - start

    def after_fit(self):
        if self.pending is not None: self.pending.result()
        self.rngs.close()
        if self.writes: self.writer.shutdown(); self.files = None; shutil.rmtree(self.folder)

    def cost(self): return dict(checkpoints=self.n, **{f"{k}_ms": 1000*v/max(self.n, 1) for k,v in {**self.cpu, 'handoff': self.rngs.cpu}.items()})

peak,ready,copies,least = resident(),Ready(),CopyEach(),LeastCheckpoint() if os.environ.get('LEAST') else None
t,cpu = time.monotonic(),time.process_time()
with learn.distrib_ctx(): learn.fit_one_cycle(epochs, 0.02, cbs=[ckpt, Noise(), LogAndKill(), ready, *([copies] if os.environ.get('COPY_EACH') else []), *([least] if least else [])])
t,cpu = time.monotonic()-t,time.process_time()-cpu
(root/f"times{rank_distrib()}_{attempt}.json").write_text(json.dumps(dict(started=started, imported=imported, ready=ready.at, **ckpt.resume_seconds)))

def one_copy_ms():
    "A copy of the state's tensors into memory already there, its cache flushed first, as a memory checkpoint's is: the median of 20"
    state = state_tensors()
    dest,flush,times = [torch.empty_like(x) for x in state],torch.ones(2**26),[]
    for _ in range(20): flush.add_(1); times.append(copy_ms(dest, state))
    return statistics.median(times)
sha = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
(root/f"result{rank_distrib()}.json").write_text(json.dumps(dict(sha=sha, resumed_from=ckpt.resumed_from, tier=ckpt.resumed_tier, seconds=t, cpu=cpu,
    maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, private_peak_mb=peak['private'], memory_cost=least.cost() if least else ckpt.memory_cost,
    copy_ms=one_copy_ms() if os.environ.get('COPY') else None, copy_each_ms=statistics.median(copies.ms) if copies.ms else None)))
