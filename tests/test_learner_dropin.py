"""`learner` (nbs/41_learner.ipynb), drop-in: `Learner.save`/`load` exact where fastai code relies on it (buffers,
`FileNotFoundError`), and one clear error on every rank for bad input (a bad timeout, a truncated file, a read-only disk)"""
import learner_dropin_scenarios as s
from conftest import values, needs_mounts, ranks
from ddp_safe_fastai.launch import torchrun_ranks

def test_buffers(launch, tmp_path):
    "`Learner.save`/`load` to a buffer of each rank's own, as in fastai: each rank gets its own weights back, and no file is written"
    assert values(launch(s.buffers, str(tmp_path))) == [dict(value=3., files=[]), dict(value=4., files=[])]

def test_missing_file_is_file_not_found(launch, tmp_path):
    "A load of a file never saved raises `CheckpointNotFoundError`, a `FileNotFoundError` as fastai code catches it, naming the file"
    for r in values(launch(s.missing_file, str(tmp_path))):
        assert r.startswith('CheckpointNotFoundError: True: load ') and 'never_saved.pth' in r and 'no such file' in r

def test_bad_timeout_fails_every_rank_at_the_save(tmp_path):
    "`DDP_SAFE_TIMEOUT='abc'`: every rank's save raises one `ValueError` saying what a timeout is; nothing is written"
    for r in values(ranks(s.bad_timeout_save, str(tmp_path), env={'DDP_SAFE_TIMEOUT': 'abc'})):
        assert r == "save: DDP_SAFE_TIMEOUT='abc': a timeout is a number of seconds, more than 0 and at most 1e+08"
    assert not (tmp_path/'models').exists()

def test_truncated_dataloaders(launch, tmp_path):
    "A `dls.pkl` cut in half: `load_dataloaders` raises `CheckpointError` on every rank, naming the file as truncated or corrupt"
    for r in values(launch(s.truncated_dataloaders, str(tmp_path))):
        assert r.startswith('CheckpointError: load_dataloaders') and 'dls.pkl' in r and 'truncated or corrupt' in r

@needs_mounts
def test_save_on_read_only_disk(tmp_path):
    "A save to a read-only disk: every rank raises `CheckpointError` naming the file and the OS's error"
    ro = tmp_path/'ro'; ro.mkdir()
    mount = 'mount --make-rprivate / && mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    res = values(torchrun_ranks(s.save_on_read_only, str(ro), node_prefix=lambda i: ['unshare', '-m', 'sh', '-c', mount, str(ro)], timeout=240))
    for r in res:
        assert r.startswith(f"CheckpointError: could not write {ro}/models/m.pth: OSError: [Errno 30] Read-only file system"), r
