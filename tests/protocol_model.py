"""A model check of the save/load protocol: random programs of saves, loads, barriers, writer failures (a full disk,
a killed writer), other runs and delays, run on real gloo ranks; every call's outcome on every rank is compared with
a small reference model"""
import io, os, sys, signal, resource, time
from pathlib import Path
import torch, torch.distributed as dist

FILES = ('a', 'b')
# (op, file, who). who: 'all' every rank calls it; 'main' rank 0 alone (the PyTorch tutorial's `if rank == 0:`);
# 'local' rank 0 alone inside `local_io`
SAVES = [('save', f, w) for f in FILES for w in ('all', 'main', 'local')]
FULL = [('save_full', f, w) for f in FILES for w in ('all', 'main')]  # rank 0's disk is full during this save
LOADS = [('load', f, w) for f in FILES for w in ('all', 'local')] + [('reload', f, 'all') for f in FILES]
OTHERS = [('other_run', f, 'main') for f in FILES] + [('barrier', None, 'all'), ('collective', None, 'all')]
# rank 0 is killed inside this save: half-way through writing the file, or once the file is in place; it ends the
# program, and `torchrun --max-restarts 1` starts the run again
KILLS = [(k, f, w) for k in ('kill_writing', 'kill_placed') for f in FILES for w in ('all', 'main')]

def generate(rng, nproc, n_ops=None):
    "A random program for `nproc` ranks: a list of `(op, file, who, delays)`; rank r first sleeps `delays[r]` s"
    return [(*rng.choice(SAVES*3 + FULL + LOADS*2 + OTHERS), tuple(rng.choice([0, 0, 0, .02, .1]) for _ in range(nproc)))
            for _ in range(n_ops or rng.randint(3, 12))]

def generate_killed(rng, nproc, kill=None):
    "A random program whose last op kills rank 0 inside a save (`kill`, one of `KILLS`, or a random one)"
    return generate(rng, nproc) + [(*(kill or rng.choice(KILLS)), (0,)*nproc)]

def show(ops):
    "`ops`, one per line, as Python that `replay` takes back"
    return '[\n' + ''.join(f"  {o!r},\n" for o in ops) + ']'

# the reference model -----------------------------------------------------------------------------------------------

def expected(ops, nproc):
    "Per op, per rank: `('ok', value)`, `('error', kind)`, or None where the rank does not call it"
    disk, ours, rank0 = {}, {}, []  # ours: does the file still hold this run's last write
    for i,(op,f,who,_) in enumerate(ops):
        if op.startswith('kill'):
            if op == 'kill_placed': disk[f] = i
            res = ('killed', None)
        elif op in ('save', 'save_full'):
            res = ('ok', None) if op == 'save' else ('error', 'CheckpointError')
            if op == 'save': disk[f], ours[f] = i, True
        elif op == 'other_run':
            disk[f], res = -1, ('ok', None)
            if f in ours: ours[f] = False
        elif op in ('load', 'reload'):
            if op == 'reload' and ours.get(f) is False: res = ('error', 'replaced')
            elif f not in disk: res = ('error', 'CheckpointNotFoundError')
            else: res = ('ok', disk[f])
        else: res = ('ok', None)
        rank0.append(res)
    # every rank that calls a save learns the outcome of rank 0's write of that same call: not of a save rank 0 made
    # alone, nor inside `local_io`, at the same place in the run (they are told apart by where they are called from)
    return [[rank0[i]] + [rank0[i] if who == 'all' else None]*(nproc-1) for i,(op,f,who,_) in enumerate(ops)], disk

def expected_after_kill(ops, nproc):
    "What every rank of the restarted run finds: each file as the killed run left it; the killed file saved anew; no temporaries"
    disk = expected(ops, nproc)[1]
    found = [('ok', disk[f]) if f in disk else ('error', 'CheckpointNotFoundError') for f in FILES]
    return [found + [('ok', len(ops)), ('ok', [])]]*nproc

# what each rank runs -------------------------------------------------------------------------------------------------

def _full_disk():
    "Make writes past 100 bytes fail in this process, as on a full disk (EFBIG instead of ENOSPC)"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, old[1]))
    return old

def _other_run_writes(file):
    "Another run's atomic save of `file`: a new file put in its place, not through this process's library"
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.parent/f".{file.name}.other"
    torch.save({'weight': torch.full((1, 4), -1.), 'bias': torch.zeros(1)}, tmp); os.replace(tmp, file)

def _killed_while_writing(obj, f, **kwargs):
    "`torch.save` that writes half of the file, then SIGKILLs this process"
    buf = io.BytesIO(); _torch_save(obj, buf, **kwargs)
    with open(f, 'wb') as out: out.write(buf.getvalue()[:len(buf.getvalue())//2])
    os.kill(os.getpid(), signal.SIGKILL)

def _killed_once_placed(tmp, file):
    "The library's atomic rename, then SIGKILL of this process"
    _swap_in(tmp, file); os.kill(os.getpid(), signal.SIGKILL)

def _die_inside(op):
    "Make this process die inside its next write: half-way through the file (`kill_writing`) or once it is in place"
    global _torch_save, _swap_in
    import ddp_safe_fastai.files as files
    if op == 'kill_writing': _torch_save,torch.save = torch.save,_killed_while_writing
    else: _swap_in,files._swap_in = files._swap_in,_killed_once_placed

def _call(learn, op, f, who, i):
    "One op of a program on this rank: None if this rank does not take part, else its outcome"
    from ddp_safe_fastai.all import local_io, distrib_barrier, rank_distrib, check_not_replaced
    r = rank_distrib()
    if who != 'all' and r != 0: return None
    with torch.no_grad(): learn.model.weight.fill_(i)
    if op.startswith('kill'):
        if r == 0: _die_inside(op)
        learn.save(f, with_opt=False)
        return ('killed', None)  # rank 0 is not here any more; the others are stopped by torchrun
    if op in ('save', 'save_full'):
        old = _full_disk() if op == 'save_full' and r == 0 else None
        try:
            if who == 'local':
                with local_io(): learn.save(f, with_opt=False)
            elif who == 'main': learn.save(f, with_opt=False)  # a line of its own, as under a script's `if rank == 0:`
            else: learn.save(f, with_opt=False)
        finally:
            if old: resource.setrlimit(resource.RLIMIT_FSIZE, old)
        return ('ok', None)
    if op == 'other_run': _other_run_writes(learn.path/learn.model_dir/f"{f}.pth"); return ('ok', None)
    if op in ('load', 'reload'):
        if op == 'reload': check_not_replaced(learn.path/learn.model_dir/f"{f}.pth")
        if who == 'local':
            with local_io(): learn.load(f, with_opt=False)
        else: learn.load(f, with_opt=False)
        return ('ok', int(learn.model.weight.flatten()[0].item()))
    if op == 'barrier': distrib_barrier()
    if op == 'collective': dist.barrier()
    return ('ok', None)

def _kind(e): return 'replaced' if 'was replaced' in str(e) else type(e).__name__

def run_program(root, ops):
    "Run `ops` on this rank, in `root`; per op, this rank's outcome (and the error's message)"
    from ddp_safe_fastai.testing import synth_learner
    learn = synth_learner(path=Path(root))
    dist.barrier()
    res = []
    for i,(op,f,who,delays) in enumerate(ops):
        time.sleep(delays[dist.get_rank()])
        try: res.append((_call(learn, op, f, who, i), None))
        except Exception as e: res.append((('error', _kind(e)), f"{type(e).__name__}: {e}"))
    return res

def resume_after_kill(root, ops):
    "First attempt: `ops`, whose last save kills rank 0; the attempt torchrun restarts: what a resumed run finds"
    from ddp_safe_fastai.all import restart_attempt, join_launched_group
    from ddp_safe_fastai.testing import synth_learner
    join_launched_group()  # as the library joins torchrun's group: a restarted attempt through keys of its own
    if restart_attempt() == 0: return run_program(root, ops)
    learn, res = synth_learner(path=Path(root)), []
    for f in FILES:
        try: learn.load(f, with_opt=False); res.append(('ok', int(learn.model.weight.flatten()[0].item())))
        except Exception as e: res.append(('error', _kind(e)))
    f = ops[-1][1]
    with torch.no_grad(): learn.model.weight.fill_(len(ops))
    learn.save(f, with_opt=False); learn.model.weight.data.zero_(); learn.load(f, with_opt=False)
    res.append(('ok', int(learn.model.weight.flatten()[0].item())))
    dist.barrier()  # every rank has loaded: what is left beside the files is left for good
    res.append(('ok', sorted(p.name for p in (learn.path/learn.model_dir).iterdir() if p.name not in {f"{g}.pth" for g in FILES})))
    return res

def save_while_writer_dies(root, kill):
    "Every rank saves `a` twice, rank 0 dying inside the second save (`kill`): the others write what their save did"
    from ddp_safe_fastai.all import rank_distrib, distrib_barrier
    from ddp_safe_fastai.testing import synth_learner
    learn, r = synth_learner(path=Path(root)), rank_distrib()
    learn.save('a', with_opt=False)
    distrib_barrier()  # every rank has the outcome of the first save
    if r == 0: _die_inside(kill)
    t0 = time.monotonic()
    try: learn.save('a', with_opt=False); got = 'returned'
    except Exception as e: got = f"{type(e).__name__}: {e}"
    (Path(root)/f"rank{r}.txt").write_text(f"{time.monotonic()-t0:.1f}\n{got}")

def run_programs(root, programs):
    "Run each program in a directory of its own under `root`; the outcomes of each"
    return [run_program(Path(root)/str(k), ops) for k,ops in enumerate(programs)]

# checking ------------------------------------------------------------------------------------------------------------

def mismatches(ops, nproc, outcomes):
    "Where the outcomes of the ranks (`outcomes[rank][op]`) differ from the model, or an error does not name its file"
    want, bad = expected(ops, nproc)[0], []
    for i,(op,f,who,_) in enumerate(ops):
        for r in range(nproc):
            got,msg = outcomes[r][i]
            if got != want[i][r]: bad.append(f"op {i} {op, f, who} on rank {r}: expected {want[i][r]}, got {got} {msg or ''}")
            elif msg and f and f"{f}.pth" not in msg: bad.append(f"op {i} on rank {r}: the error does not name {f}.pth: {msg}")
    return bad

def check(programs, nproc, root, timeout=600):
    "Run `programs` on `nproc` torchrun ranks; per program, its mismatches (an empty list when it is right)"
    from ddp_safe_fastai.launch import torchrun_ranks
    outs = torchrun_ranks(run_programs, str(root), programs, nproc=nproc, timeout=timeout,
                          env={'DDP_SAFE_TIMEOUT': '20', 'OMP_NUM_THREADS': '1'})
    bad = [o for o in outs if not o.ok]
    if bad: raise AssertionError('\n'.join(f"{o!r}\n{getattr(o, 'traceback', '')}" for o in bad))
    return [mismatches(ops, nproc, [o.value[k] for o in outs]) for k,ops in enumerate(programs)]

def check_killed(programs, nproc, root, timeout=240):
    "Run each of `programs` (ending with a killed writer) under `torchrun --max-restarts 1`; per program, its mismatches"
    from ddp_safe_fastai.launch import torchrun_ranks, free_port
    res = []
    for k,ops in enumerate(programs):
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(nproc), '--max-restarts', '1',
               '--master_addr', '127.0.0.1', '--master_port', str(free_port())]
        outs = torchrun_ranks(resume_after_kill, str(Path(root)/str(k)), ops, nproc=nproc, timeout=timeout, launcher=cmd, init=False,
                              env={'DDP_SAFE_TIMEOUT': '20', 'OMP_NUM_THREADS': '1'})
        got, want = [o.value if o.ok else ('raised', o.error) for o in outs], expected_after_kill(ops, nproc)
        res.append([f"rank {r}: expected {w}, got {g}" for r,(g,w) in enumerate(zip(got, want)) if g != w])
    return res

def ends_killed(ops):
    "Does the program `ops` end with a killed writer?"
    return ops[-1][0].startswith('kill')

def checker(ops):
    "What checks programs like `ops`: `check_killed` if it ends with a killed writer, else `check`"
    return check_killed if ends_killed(ops) else check

def check_one(ops, nproc, root):
    "The mismatches of one program, killed writer or not"
    return checker(ops)([ops], nproc, root)[0]

def shrink(ops, nproc, root):
    "A smallest program found by removing ops one at a time from failing `ops`, that still fails (a killed writer stays last)"
    run = checker(ops)
    while len(ops) > 1:
        cands = [ops[:i] + ops[i+1:] for i in range(len(ops) - ends_killed(ops))]
        failing = [c for c,m in zip(cands, run(cands, nproc, Path(root)/f"shrink{len(ops)}")) if m]
        if not failing: break
        ops = failing[0]
    return ops
