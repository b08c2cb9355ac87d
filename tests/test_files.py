"""`files` (nbs/05_files.ipynb): a file written by `atomic_torch_save` is whole whenever its writer is killed (a plain
`torch.save` is not); a save the disk has no room for is refused on every rank before it is written"""
import os, sys, time, signal, random, subprocess, textwrap
import torch
import files_scenarios as s
from conftest import values, needs_mounts
from ddp_safe_fastai.files import atomic_torch_save
from ddp_safe_fastai.launch import torchrun_ranks

# Writers forked, one a trial, by a process that imported torch once: each rewrites the file until it is killed
_writers = textwrap.dedent('''
    import os, sys, torch
    from ddp_safe_fastai.files import atomic_torch_save
    for line in sys.stdin:
        cmd, *a = line.split()
        if cmd == 'reap': os.waitpid(int(a[0]), 0); print('reaped', flush=True); continue
        if os.fork(): continue
        f, n = a[0], int(a[1])
        save = atomic_torch_save if cmd == 'atomic' else (lambda o, f: torch.save(o, f))
        print(os.getpid(), flush=True)
        for v in range(1, 10**6): save({'v': v, 'w': torch.full((n,), float(v))}, f)
        os._exit(0)
''')

def _crash_trials(tmp_path, mode, trials, n=25_000_000):
    "Kill a writer with SIGKILL at random moments while it rewrites a ~100 MB file; count files that are not whole"
    f = tmp_path/'ckpt.pth'
    atomic_torch_save({'v': 0, 'w': torch.zeros(n)}, f)
    bad = 0
    with subprocess.Popen([sys.executable, '-c', _writers], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as forks:
        for i in range(trials):
            forks.stdin.write(f"{mode} {f} {n}\n"); forks.stdin.flush()
            pid = int(forks.stdout.readline())  # the writer, about to write
            time.sleep(random.uniform(0, 1.5))
            os.kill(pid, signal.SIGKILL)
            forks.stdin.write(f"reap {pid}\n"); forks.stdin.flush()
            assert forks.stdout.readline() == 'reaped\n'  # it has ended: it writes nothing more
            try:
                o = torch.load(f)
                if not torch.equal(o['w'], torch.full((n,), float(o['v']))): bad += 1
            except Exception: bad += 1
        forks.stdin.close()
    return bad

def test_atomic_save_survives_sigkill(tmp_path):
    "A writer SIGKILLed at random moments while `atomic_torch_save` rewrites a ~100 MB file: the file is whole every time; the next save leaves no temporary"
    random.seed(0)
    assert _crash_trials(tmp_path, 'atomic', 20) == 0
    atomic_torch_save({'v': -1}, tmp_path/'ckpt.pth')  # the next successful save
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt.pth']

def test_plain_torch_save_does_not(tmp_path):
    "The same kills on a plain in-place `torch.save`, for contrast"
    random.seed(0)
    bad = _crash_trials(tmp_path, 'plain', 10)
    print(f"plain torch.save: {bad} of 10 files not whole after SIGKILL")
    assert bad > 0

def _ranks_on_a_disk(f, tmp_path, fs, timeout):
    "Run `f(tmp_path)` on 2 ranks under torchrun whose agent sees `tmp_path` as a new disk of its own (`fs`: mount's type and options)"
    mount = f'mount --make-rprivate / && mount -t {fs} "$0" && exec "$@"'
    return values(torchrun_ranks(f, str(tmp_path), nproc=2, timeout=timeout,
                                 node_prefix=lambda i: ['unshare', '-m', 'sh', '-c', mount, str(tmp_path)]))

@needs_mounts
def test_save_too_large_for_the_disk(tmp_path):
    "A guarded save that the disk (a 4 MiB tmpfs) has no room for: refused on every rank before it is written, naming the directory, the bytes free and needed"
    res = _ranks_on_a_disk(s.save_too_large, tmp_path, 'tmpfs -o size=4m tmpfs', 120)
    assert res[0]['error'] == res[1]['error'] and res[0]['error'], res
    assert f"could not write {tmp_path}/models/m.pth: not enough room on the disk of {tmp_path}/models: " in res[0]['error'], res
    assert f"bytes free, {(1024*2048 + 2048)*4:,} needed; nothing was written" in res[0]['error'], res
    assert all(r['intact'] and r['files'] == ['m.pth'] for r in res), res  # the previous file, and no temporary

@needs_mounts
def test_checkpoints_where_the_disk_refuses_direct_writes(tmp_path):
    "On ramfs, which refuses `O_DIRECT`: the checkpoints that are written around the page cache elsewhere are written through it, whole, and a fit resumes from them exactly"
    res = _ranks_on_a_disk(s.checkpoint_and_resume, tmp_path, 'ramfs ramfs', 180)
    assert all(r['epoch'] == 2 and r['same_opt'] for r in res), res
    assert res[0]['files'] == ['epoch_0002', 'epoch_0003', 'latest'], res
