"""A fuzzer of the default `load_learner`: it mutates real exports' pickles at the opcode level and loads each mutant, as a
user would, in a child process, checking that nothing escapes.

    python fuzz_exports.py OUT [-n N] [--seed S] [--exports DIR] [--jobs J] # OUT/results.jsonl, a line a mutant; a summary printed

The exports it mutates are `testing.synth_learner`'s (made here, with a callback, a partial and a hook of fastai's on its
model) and, with `--exports`, every `*.pkl` of a folder (`export_corpus.py`'s). Each mutant is one change to one export's
`data.pkl`, the rest of the archive as it was:

- a global swapped for another: one the policy admits, or one that runs commands, touches files or imports (`os.system`,
  `shutil.rmtree`, `builtins.eval`, `fastcore.xtras.run`...);
- a value swapped for one of another type (a string for a tuple, a module's hooks for a dict, a path for a number);
- a state given slots, or a tensor a `grad`; a memo reference pointed at another object;
- deep nesting; large counts (a size, a memo index, a string's length); a byte flipped.

A child process loads the mutants one after the other (`load_learner` by default, then `predict`), and `ddp-safe-check
inspect`'s decision is taken on each (read and checked, never built). For each it records: the load's outcome (loaded,
refused with `UnsafeExportError`, or another error), inspect's, whether a marker file was made, a victim file removed or
changed, an environment variable or a class attribute set, a hook registry changed, and the seconds and memory it took. A
child that dies (a crash) or runs over its time is recorded as such, and a new one goes on with the next mutant.
Disagreements, where inspect admits what the load refuses or refuses what the load loads, are counted."""
import os, sys, json, time, random, struct, zipfile, argparse, subprocess, pickletools, concurrent.futures
from pathlib import Path

DANGEROUS = [('posix', 'system'), ('os', 'system'), ('shutil', 'rmtree'), ('builtins', 'eval'), ('builtins', 'exec'), ('fastcore.xtras', 'run'),
             ('builtins', '__import__'), ('importlib', 'import_module'), ('subprocess', 'run'), ('pathlib', 'Path.unlink'), ('os', 'remove'),
             ('builtins', 'getattr'), ('functools', 'partial'), ('torch.utils.hooks', 'RemovableHandle'), ('builtins', 'bytes'), ('builtins', 'set'),
             ('torch', 'Size'), ('numpy', 'dtype'), ('plum._method', 'Method'), ('inspect', 'Parameter')]

def base_exports(out, folder=None):
    "The exports to mutate: `synth_learner`'s, made here, and those of `folder`"
    import functools
    from fastai.callback.hook import Hook
    from ddp_safe_fastai.testing import synth_learner
    made = []
    learn = synth_learner(path=out)
    learn.export(Path(out)/'base_synth.pkl'); made.append(Path(out)/'base_synth.pkl')
    from fastai.callback.hook import _hook_inner
    learn.hook = Hook(learn.model, _hook_inner)  # a hook of fastai's, with its handle
    learn.partial = functools.partial(max, 1)
    learn.export(Path(out)/'base_hook.pkl'); made.append(Path(out)/'base_hook.pkl')
    if folder: made += sorted(p for p in Path(folder).glob('*.pkl') if not p.name.endswith('_dls.pkl'))
    return made

def archive(file):
    "(the name of the archive's pickle, its bytes, every member's bytes)"
    with zipfile.ZipFile(file) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in members if n.endswith('data.pkl'))
    return name,members[name],members

def ops(data):
    "Each opcode of a pickle: (name, argument, position, length)"
    found = list(pickletools.genops(data))
    return [(op.name, arg, pos, (found[i + 1][2] if i + 1 < len(found) else len(data)) - pos) for i,(op,arg,pos) in enumerate(found)]

def s_uni(text): b = text.encode(); return b'X' + struct.pack('<I', len(b)) + b
def glob(module, name): return b'c' + f'{module}\n{name}\n'.encode()

def mutate(data, rng):
    "One mutant of the pickle `data`, and what was done"
    o = ops(data)
    kind = rng.choice(['swap_global', 'swap_global', 'wrong_type', 'slots', 'grad', 'memo', 'deep', 'large', 'flip', 'swap_admitted'])
    def at(names):
        found = [x for x in o if x[0] in names]
        return rng.choice(found) if found else rng.choice(o)
    if kind in ('swap_global', 'swap_admitted'):
        name,arg,pos,n = at(('GLOBAL', 'STACK_GLOBAL'))
        if kind == 'swap_global': module,qual = rng.choice(DANGEROUS)
        else:
            from ddp_safe_fastai.unpickle_policy import export_policy
            module,qual = rng.choice(sorted(export_policy()))
        new = glob(module, qual) if name == 'GLOBAL' else b'0' * 0 + glob(module, qual) + b'0' * 0
        if name == 'STACK_GLOBAL': new = b'00' + glob(module, qual)  # drop the two strings, push the global
        return data[:pos] + new + data[pos + n:], f"{kind} at {pos}: {module}.{qual}"
    if kind == 'wrong_type':
        name,arg,pos,n = at(('EMPTY_TUPLE', 'TUPLE1', 'TUPLE2', 'BININT1', 'NEWFALSE', 'NEWTRUE', 'NONE', 'BINFLOAT', 'EMPTY_DICT'))
        value = rng.choice([s_uni('/etc/passwd'), s_uni('file:///tmp/elsewhere'), b'J' + struct.pack('<i', 2**31 - 1), b')', b'}', glob('pathlib', 'Path') + b')R',
                            glob('collections', 'OrderedDict') + b')R', b'N'])
        if name in ('TUPLE1', 'TUPLE2'): value = b'0' * int(name[-1]) + value  # pop what the tuple would take
        return data[:pos] + value + data[pos + n:], f"{kind} at {pos}: {name} -> {value[:20]!r}"
    if kind in ('slots', 'grad'):
        name,arg,pos,n = at(('BUILD',))
        if kind == 'slots': extra = b'N}' + s_uni('f') + glob('posix', 'system') + b's\x86'
        else: extra = b'}' + s_uni('grad') + glob('torch', 'Size') + b'(K\x01tRs'
        return data[:pos] + b'0' + extra + data[pos:], f"{kind} at {pos}"  # the state replaced
    if kind == 'memo':
        name,arg,pos,n = at(('BINGET', 'LONG_BINGET'))
        keys = [x[1] for x in o if x[0] in ('BINPUT', 'LONG_BINPUT', 'MEMOIZE') and isinstance(x[1], int)]
        key = rng.choice(keys) if keys else 0
        return data[:pos] + b'j' + struct.pack('<I', key) + data[pos + n:], f"{kind} at {pos}: -> {key}"
    if kind == 'deep':
        name,arg,pos,n = at(('NONE', 'NEWFALSE', 'BININT1'))
        depth = rng.choice([1000, 100_000, 1_000_000])
        return data[:pos] + b']' * depth + b'a' * (depth - 1) + data[pos + n:], f"{kind} at {pos}: {depth}"
    if kind == 'large':
        name,arg,pos,n = at(('BININT1', 'BININT2', 'BININT', 'BINUNICODE', 'LONG_BINPUT'))
        big = rng.choice([2**31 - 1, 2**30, 10**8])
        if name == 'BINUNICODE': return data[:pos] + b'X' + struct.pack('<I', big) + data[pos + 5:], f"{kind} at {pos}: a string of {big}"
        if name == 'LONG_BINPUT': return data[:pos] + b'r' + struct.pack('<I', 2**32 - 1) + data[pos + n:], f"{kind} at {pos}: memo index"
        return data[:pos] + b'J' + struct.pack('<i', big) + data[pos + n:], f"{kind} at {pos}: {name} -> {big}"
    pos = rng.randrange(2, len(data) - 1)
    return data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1:], f"flip at {pos}"

CHILD = r'''
import os, sys, json, time, resource, warnings, collections
warnings.filterwarnings('ignore')
from pathlib import Path
import torch
from ddp_safe_fastai.all import load_learner, UnsafeExportError
from ddp_safe_fastai.safe_unpickle import export_verdict
import fastai.learner, fastai.data.core, torch.nn, torch.utils.hooks, pathlib
work, files = Path(sys.argv[1]), sys.argv[2:]
USE, PLACES = os.environ.get('FUZZ_USE') == '1', tuple(p for p in os.environ.get('FUZZ_PLACES', '').split(',') if p)
def new_dls(learn):
    from ddp_safe_fastai.testing import synth_learner
    learn.dls = synth_learner(path=learn.path).dls
USES = [('predict', lambda l: l.predict(torch.tensor([0.5, 0.5, 0.5, 0.5]))),
        ('get_preds', lambda l: l.get_preds(dl=l.dls.test_dl([0, 1]) if l.dls.loaders else None)),
        ('fine_tune', lambda l: (new_dls(l), l.fine_tune(1))),
        ('lr_find', lambda l: l.lr_find(num_it=5, show_plot=False)),
        ('export', lambda l: l.export('again.pkl'))]
marker, victim = work/'ran', work/'victim'
CLASSES = [fastai.learner.Learner, fastai.data.core.DataLoaders, torch.nn.Module, torch.nn.Linear, torch.utils.hooks.RemovableHandle, pathlib.Path, pathlib.PosixPath]
def snapshot(): return dict(env=dict(os.environ), attrs=[sorted(vars(c)) for c in CLASSES], hooks=[len(torch.nn.modules.module._global_forward_hooks), len(torch.nn.modules.module._global_backward_hooks)])
from ddp_safe_fastai.testing import synth_learner
synth_learner(path=work).export(work/'warm.pkl')
warm = load_learner(work/'warm.pkl')  # a plain export loaded and used first, as the mutants will be: what a load and those uses import, before the snapshots
for _,use in USES if USE else USES[:1]:
    with warm.no_bar(), warm.no_logging(): use(warm)
for f in files:
    victim.write_text('intact')
    if marker.exists(): marker.unlink()
    before, rss = snapshot(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print('START', f, flush=True)
    t,said,used = time.perf_counter(),'',[]
    try:
        learn = load_learner(f, places=PLACES); load = 'loaded'
        for name,use in USES if USE else USES[:1]:
            try:
                with learn.no_bar(), learn.no_logging(): use(learn); used.append(name)
            except UnsafeExportError as e: used.append(f"{name}: UnsafeExportError: {str(e)[:200]}")
            except Exception as e: used.append(f"{name}: {type(e).__name__}")  # a mutant's model that does not predict: what matters is what it did
    except UnsafeExportError as e: load,said = 'refused',str(e)
    except Exception as e: load,said = f'error: {type(e).__name__}',str(e)
    took = time.perf_counter() - t
    try: inspected = 'refused' if export_verdict(f, places=PLACES) is not None else 'admitted'
    except Exception as e: inspected = f'error: {type(e).__name__}'  # inspect must decide: said as a disagreement
    after = snapshot()
    print('RESULT', json.dumps(dict(file=f, load=load, said=said[:600], used=used, inspect=inspected, seconds=round(took, 3),
          mib=round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024, 1), marker=marker.exists(),
          victim=victim.exists() and victim.read_text() == 'intact', env=after['env'] == before['env'], attrs=after['attrs'] == before['attrs'],
          hooks=after['hooks'] == before['hooks'])), flush=True)
'''

def run_children(work, files, limit, use=False, places=(), jobs=1):
    "Every file loaded by children, one after the other (with `use`, then used as a user does: `predict`, `get_preds`, `fine_tune` on new DataLoaders, `lr_find`, `export`); a child that dies or runs over `limit` seconds a file is recorded, and a new one goes on. With `jobs`, so many children at once, each with a folder of its own in `work` (its marker, its victim), the files dealt among them"
    if jobs > 1:
        folders = [Path(work)/f'child{k}' for k in range(jobs)]
        for d in folders: d.mkdir(exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
            parts = list(ex.map(lambda k: run_children(folders[k], files[k::jobs], limit, use, places), range(jobs)))
        order = {str(f): i for i,f in enumerate(files)}
        return sorted((r for part in parts for r in part), key=lambda r: order[r['file']])
    results,left = [],[str(f) for f in files]
    env = {**os.environ, 'FUZZ_USE': '1' if use else '0', 'FUZZ_PLACES': ','.join(places)}
    while left:
        p = subprocess.Popen([sys.executable, '-c', CHILD, str(work), *left], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=work, env=env)
        current,started = None,time.monotonic()
        import selectors
        sel = selectors.DefaultSelector(); sel.register(p.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(timeout=1):
                if current is not None and time.monotonic() - started > limit:
                    p.kill(); p.wait(); results.append(dict(file=current, load='timeout', inspect='?')); left = left[left.index(current) + 1:]; break
                if p.poll() is not None and current is None: left = []; break
                continue
            line = p.stdout.readline()
            if not line:
                code = p.wait()
                if current is not None: results.append(dict(file=current, load=f'crash: exit {code}', inspect='?')); left = left[left.index(current) + 1:]
                elif code == 0: left = []
                elif results: results[-1]['load'] = f"crash after: exit {code}"  # it died between two files: after the last it said
                break
            if line.startswith('START '): current,started = line[6:].strip(),time.monotonic()
            elif line.startswith('RESULT '):
                results.append(json.loads(line[7:])); left = left[left.index(current) + 1:]; current = None
        sel.close()
    return results

def fuzz(out, n=500, seed=0, folder=None, limit=60, jobs=1):
    "`n` mutants of the base exports, loaded (by `jobs` children at once); their results (a dict a mutant) and a summary"
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    bases = [archive(f) for f in base_exports(out, folder)]
    files,done = [],{}
    for i in range(n):
        name,data,members = rng.choice(bases)
        mutant,what = mutate(data, rng)
        f = out/f'mutant_{i:05d}.pkl'
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED) as z:
            for k,v in members.items(): z.writestr(k, mutant if k == name else v)
        files.append(f); done[str(f)] = what
    results = run_children(out, files, limit, jobs=jobs)
    for r in results: r['mutation'] = done.get(r['file'])
    (out/'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in results))
    return results,summary(results)

def summary(results):
    "Counts: the load's outcomes, disagreements with inspect, effects, crashes, time-outs, the slowest and largest"
    loads = {}
    for r in results: loads[r['load'].split(':')[0]] = loads.get(r['load'].split(':')[0], 0) + 1
    effects = [r for r in results if r.get('marker') or r.get('victim') is False or r.get('env') is False or r.get('attrs') is False or r.get('hooks') is False]
    disagree = [r for r in results if (r['load'] == 'refused' and r['inspect'] == 'admitted') or (r['load'] == 'loaded' and r['inspect'] == 'refused')
                or r['inspect'].startswith('error')]
    return dict(mutants=len(results), loads=loads, disagreements=len(disagree), effects=len(effects),
                crashes=sum(r['load'].startswith('crash') for r in results), timeouts=sum(r['load'] == 'timeout' for r in results),
                slowest_s=max((r.get('seconds', 0) for r in results), default=0), most_mib=max((r.get('mib', 0) for r in results), default=0),
                examples=[(r.get('mutation'), r['load'], r['inspect']) for r in (effects + disagree)[:10]])

if __name__ == '__main__':
    a = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    a.add_argument('out'); a.add_argument('-n', type=int, default=500); a.add_argument('--seed', type=int, default=0)
    a.add_argument('--exports', default=None, help="a folder of exports to mutate too (export_corpus.py's)")
    a.add_argument('--limit', type=float, default=60, help="seconds a mutant may take")
    a.add_argument('--jobs', type=int, default=1, help="children loading mutants at once")
    args = a.parse_args()
    _,s = fuzz(args.out, args.n, args.seed, args.exports, args.limit, args.jobs)
    print(json.dumps(s, indent=1))
