"""`writers` (nbs/44_writers.ipynb): fastai's everyday writers under DDP (lr_find, CSVLogger, get_preds' files, image
folders, TensorBoard), on 2 CPU ranks started by torchrun, `accelerate launch` or `mp.spawn`"""
import importlib
import pytest
import writers_scenarios as w
from conftest import values, torchvision_imports, ranks, pool

@pytest.fixture(params=['torchrun', 'accelerate', 'spawn'])
def run(request):
    "A scenario on 2 ranks started by torchrun, `accelerate launch` or `torch.multiprocessing.spawn` (from the session's pools)"
    def run(f, *args, timeout=180): return values(pool(request.param, 2).run(f, *args, init=False, timeout=timeout))
    return run

def test_lr_find(run, tmp_path):
    "`lr_find` in `distrib_ctx`: model and optimizer as they were before it, on every rank; one suggestion and record; identical replicas after the fit; no temporary folder"
    r0,r1 = run(w.lr_find_then_fit, str(tmp_path))
    for r in (r0, r1): assert r['after'] == r['before'], r    # model and optimizer as they were before lr_find
    assert r0['before'] == r1['before']                          # ...the same on every rank
    assert r0['suggestion'] == r1['suggestion'] and r0['recorder'] == r1['recorder']
    assert r0['weights'] == r1['weights']                        # the fit after it trains identical replicas
    assert r0['files'] == r1['files'] == []                      # no temporary folder left

def test_csv_logger(run, tmp_path):
    "`CSVLogger` over two fits, rank 0 logging late: one header a fit and one row an epoch, rank 0's values, the whole log read by every rank"
    r0,r1 = run(w.csv_logger_two_fits, str(tmp_path))
    headers = [l for l in r0['lines'] if l.startswith('epoch')]
    assert len(headers) == 2 and len(r0['lines']) == 2 + 5, r0['lines']  # one header a fit, one row an epoch
    assert r0['valid_loss'] == pytest.approx(r0['values'])               # rank 0's values
    assert r1['lines'] == r0['lines'] and r1['rows'] == r0['rows'] == 6   # read_log on every rank after the fit

def test_get_preds_save_preds(run, tmp_path):
    "`get_preds(save_preds=, save_targs=)`: rank 0 alone writes, one file a batch; every rank reads back the gathered predictions and targets"
    r0,r1 = run(w.saved_preds, str(tmp_path))
    assert (r0['writes'], r1['writes']) == (2, 0)  # one writer: rank 0 writes the batch's predictions and targets
    for r in (r0, r1):
        assert r['preds_match'] and r['targs_match'], r
        assert r['n'] == 16 and r['files'] == ['0']  # one file a batch: the 16 validation items are one batch of 8 a rank, gathered

@pytest.mark.skipif(not torchvision_imports(), reason="torchvision does not import beside the 'dev' environment's torch")
def test_image_folders(tmp_path):
    "`download_images` and `resize_images` on every rank: each image downloaded once, one copy of each, none broken"
    from PIL import Image
    (tmp_path/'web').mkdir()
    for i in range(6): Image.new('RGB', (32, 24), (40*i, 0, 0)).save(tmp_path/'web'/f'{i}.png')
    urls = [f"file://{tmp_path/'web'/f'{i}.png'}" for i in range(6)]
    r0,r1 = values(ranks(w.image_folders, str(tmp_path), urls, timeout=180))
    assert r0['downloaded'] == r1['downloaded'] == 6 and r0['small'] == r1['small'] == 6  # one copy of each image
    assert r0['broken'] == r1['broken'] == 0 and r0['downloads'] + r1['downloads'] == 6

@pytest.mark.skipif(importlib.util.find_spec('tensorboard') is None, reason="tensorboard is installed in the 'latest' environment")
def test_tensorboard_logs_once(run, tmp_path):
    "fastai's `TensorBoardCallback` writes on `rank_distrib() == 0`, which is every process under `mp.spawn` without this library"
    assert run(w.tensorboard_logs, str(tmp_path)) == [1, 1]  # one event file: rank 0's
