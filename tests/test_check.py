"""`check` (nbs/60_check.ipynb): the `ddp-safe-check` command, run as a user runs it: the installed console script, and
under torchrun"""
import os, re, sys, subprocess
from pathlib import Path
from conftest import values, own_disks, needs_mounts
from ddp_safe_fastai.check import RACES, check_dir
from ddp_safe_fastai.launch import torchrun_ranks, free_port

BIN = Path(sys.executable).parent

def run(*args, timeout=600):
    "Run a command of this environment; (exit status, stdout, stderr)"
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr

def test_races_library_never_fails():
    "`ddp-safe-check races`: with the library no race fails a trial; the plain code fails some, and rank 0's failed plain save goes unheard every time"
    rc, out, err = run(BIN/'ddp-safe-check', 'races', '--nproc', 4, '--trials', 5)
    assert rc == 0, out + err
    rows = {m[0]: (int(m[1]), int(m[2]), int(m[3])) for m in re.findall(r"^\| ([\w-]+) \| (\d+) \| (\d+) \| (\d+) \|$", out, re.M)}
    assert list(rows) == list(RACES), out
    assert all(trials == 5 and lib == 0 for trials, plain, lib in rows.values()), out
    assert rows['write-failure'][1] == 5, out  # the other ranks never hear of rank 0's failed plain save
    assert sum(plain for _, plain, _ in rows.values()) > 10, out

def test_one_race_only():
    "`--race` runs that race alone, and what it prints is the table and its legend only (no progress bar)"
    rc, out, err = run(BIN/'ddp-safe-check', 'races', '--nproc', 2, '--trials', 2, '--race', 'rmtree-mkdir')
    assert rc == 0 and re.search(r"^\| rmtree-mkdir \| 2 \| \d \| 0 \|$", out, re.M) and 'lagging-writer' not in out, out + err
    # `ddp-safe-check races > table.md`: the file holds the table and its legend, no progress bar
    assert [l for l in out.strip().splitlines() if l and not l.startswith(('|', '- ', '  First', '2 trials'))] == [], out

def test_dir_on_a_local_disk(tmp_path):
    "`ddp-safe-check dir` on a local disk with 3 ranks: shared, no torn or missing read, fsync works, a speed figure; nothing left behind"
    rc, out, err = run(BIN/'ddp-safe-check', 'dir', tmp_path, '--nproc', 3)
    assert rc == 0, out + err
    assert f"`{tmp_path}`" in out and 'checked by 3 rank(s) on 1 node(s)' in out
    assert '| shared by all ranks | yes |' in out and re.search(r"yes: 0 torn or missing of [\d,]+ reads", out)
    assert '| fsync | works' in out and re.search(r"atomic_torch_save [\d,]+ MB/s \(\d\.\d\dx\)", out)
    assert os.listdir(tmp_path) == []  # it leaves nothing behind

def test_dir_that_does_not_exist(tmp_path):
    "A directory that does not exist: exit status 2 and an error naming it"
    rc, out, err = run(BIN/'ddp-safe-check', 'dir', tmp_path/'nope')
    assert rc == 2 and f"{tmp_path/'nope'}" in err and 'No such file or directory' in err, out + err

def test_dir_under_torchrun(tmp_path):
    "`python -m ddp_safe_fastai.check dir` under torchrun: one report, rank 0's, of the 2 ranks"
    rc, out, err = run(BIN/'torchrun', '--nproc_per_node', 2, '--master_addr', '127.0.0.1', '--master_port', free_port(),
                       '-m', 'ddp_safe_fastai.check', 'dir', tmp_path)
    assert rc == 0, out + err
    assert out.count('| shared by all ranks | yes |') == 1 and 'checked by 2 rank(s)' in out  # rank 0 reports

@needs_mounts
def test_dir_not_shared_across_nodes(tmp_path):
    "Two torchrun agents, each with its own disk mounted at the same path: the check says the directory is not shared"
    mnt, _, prefix = own_disks(tmp_path)
    rep = values(torchrun_ranks(check_dir, str(mnt), nproc=1, nnodes=2, node_prefix=prefix, timeout=240))[0]
    assert rep['shared'] is False and rep['nodes'] == 2 and rep['replace'] is None and isinstance(rep['fsync'], tuple)
