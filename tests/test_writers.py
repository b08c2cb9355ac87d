"Issue 21: fastai's everyday writers under DDP (lr_find, CSVLogger, get_preds' files, tokenizer caches), on 2 CPU ranks"
import sys, shutil
from pathlib import Path
import pytest
import writer_scenarios as w
from conftest import values
from ddp_safe_fastai.launch import torchrun_ranks, spawn_ranks, free_port

def accelerate_cmd():
    return [shutil.which('accelerate', path=str(Path(sys.executable).parent)), 'launch', '--multi_gpu', '--num_processes', '2',
            '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no', '--main_process_port', str(free_port())]

@pytest.fixture(params=['torchrun', 'accelerate', 'spawn'])
def run(request):
    "A scenario on 2 ranks started by torchrun, `accelerate launch` or `torch.multiprocessing.spawn`"
    def run(f, *args, timeout=180):
        if request.param == 'spawn': return values(spawn_ranks(f, *args, timeout=timeout))
        launcher = accelerate_cmd() if request.param == 'accelerate' else None
        return values(torchrun_ranks(f, *args, init=False, launcher=launcher, timeout=timeout))
    return run

def test_lr_find(run, tmp_path):
    r0,r1 = run(w.lr_find_then_fit, str(tmp_path))
    for r in (r0, r1): assert r['after'] == r['before'], r    # model and optimizer as they were before lr_find
    assert r0['before'] == r1['before']                          # ...the same on every rank
    assert r0['suggestion'] == r1['suggestion'] and r0['recorder'] == r1['recorder']
    assert r0['weights'] == r1['weights']                        # the fit after it trains identical replicas
    assert r0['files'] == r1['files'] == []                      # no temporary folder left

def test_csv_logger(run, tmp_path):
    r0,r1 = run(w.csv_logger_two_fits, str(tmp_path))
    headers = [l for l in r0['lines'] if l.startswith('epoch')]
    assert len(headers) == 2 and len(r0['lines']) == 2 + 5, r0['lines']  # one header a fit, one row an epoch
    assert r0['valid_loss'] == pytest.approx(r0['values'])               # rank 0's values
    assert r1['lines'] == r0['lines'] and r1['rows'] == r0['rows'] == 6   # read_log on every rank after the fit

def test_get_preds_save_preds(run, tmp_path):
    for r in run(w.saved_preds, str(tmp_path)):
        assert r['preds_match'] and r['targs_match'], r
        assert r['n'] == 16 and r['files'] == ['0']  # one file a batch: the 16 validation items are one batch of 8 a rank, gathered

@pytest.mark.parametrize('how', ['every rank', 'rank0_first'])
def test_tokenizer_cache(how, tmp_path):
    w.make_texts(tmp_path/'txt')
    for trial in range(2):  # made once, then read from the cache
        r0,r1 = values(torchrun_ranks(w.text_from_folder, str(tmp_path/'txt'), how, init=False, timeout=180))
        assert r0['vocab'] == r1['vocab'] and r0['size'] > 8
        assert r0['tokenized'] + r1['tokenized'] == (1 if trial == 0 else 0), (r0, r1)
    assert sorted(p.name for p in (tmp_path/'txt_tok').iterdir()) == ['counter.pkl', 'lengths.pkl', 'test', 'train']
