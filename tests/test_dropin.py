"Drop-in exact where fastai code relies on it, and one clear error on every rank for bad input"
import subprocess, sys
import scenarios as s
from conftest import values, needs_mounts
from ddp_safe_fastai.launch import torchrun_ranks

def test_buffers(launch, tmp_path):
    assert values(launch(s.buffers, str(tmp_path))) == [dict(value=3., files=[]), dict(value=4., files=[])]

def test_missing_file_is_file_not_found(launch, tmp_path):
    for r in values(launch(s.missing_file, str(tmp_path))):
        assert r.startswith('CheckpointNotFoundError: True: load ') and 'never_saved.pth' in r and 'no such file' in r

def test_bad_timeout_fails_every_rank_at_the_save(tmp_path):
    for r in values(torchrun_ranks(s.bad_timeout_save, str(tmp_path), env={'DDP_SAFE_TIMEOUT': 'abc'})):
        assert r == "save: DDP_SAFE_TIMEOUT='abc': a timeout is a number of seconds, more than 0 and at most 1e+08"
    assert not (tmp_path/'models').exists()

def test_truncated_dataloaders(launch, tmp_path):
    for r in values(launch(s.truncated_dataloaders, str(tmp_path))):
        assert r.startswith('CheckpointError: load_dataloaders') and 'dls.pkl' in r and 'truncated or corrupt' in r

@needs_mounts
def test_save_on_read_only_disk(tmp_path):
    ro = tmp_path/'ro'; ro.mkdir()
    mount = 'mount --make-rprivate / && mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    res = values(torchrun_ranks(s.save_on_read_only, str(ro), node_prefix=lambda i: ['unshare', '-m', 'sh', '-c', mount, str(ro)]))
    for r in res:
        assert r.startswith(f"CheckpointError: could not write {ro}/models/m.pth: OSError: [Errno 30] Read-only file system"), r

CHECK_DEFAULTS = '''
import fastai.basics
from fastai.learner import defaults
before = list(defaults.callbacks)
import ddp_safe_fastai.all
assert defaults.callbacks == before, defaults.callbacks
import fastai.callback.tracker, fastai.distributed  # what a script imports itself adds fastai's callback, as always
from fastai.callback.progress import ProgressCallback
assert defaults.callbacks == before + [ProgressCallback] and fastai.distributed.ProgressCallback is ProgressCallback
'''

def test_import_changes_no_fastai_default():
    subprocess.run([sys.executable, '-c', CHECK_DEFAULTS], check=True)

CHECK_NAMES = '''
import fastcore.all, fastai.basics, fastai.callback.all, fastai.distributed, ddp_safe_fastai.all as lib
theirs = {**vars(fastcore.all), **vars(fastai.basics), **vars(fastai.callback.all), **vars(fastai.distributed)}
clash = [n for n in lib.__all__ if n in theirs and theirs[n] is not getattr(lib, n)]
assert not clash, f"these names mean something else in fastai/fastcore: {clash}"
'''

def test_no_name_shadows_fastai_or_fastcore():
    "Each exported name that fastai or fastcore also has is the same object there (fastai's own, made DDP-aware)"
    subprocess.run([sys.executable, '-c', CHECK_NAMES], check=True)
