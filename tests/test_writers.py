"fastai's everyday writers under DDP (lr_find, CSVLogger, get_preds' files, tokenizer caches), on 2 CPU ranks"
import sys, json, time, importlib, subprocess
from pathlib import Path
import pytest
import writer_scenarios as w
from conftest import values, accelerate_cmd, needs_mounts, own_disks, torchvision_imports
from ddp_safe_fastai.launch import torchrun_ranks, spawn_ranks, free_port

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
    r0,r1 = run(w.saved_preds, str(tmp_path))
    assert (r0['writes'], r1['writes']) == (2, 0)  # one writer: rank 0 writes the batch's predictions and targets
    for r in (r0, r1):
        assert r['preds_match'] and r['targs_match'], r
        assert r['n'] == 16 and r['files'] == ['0']  # one file a batch: the 16 validation items are one batch of 8 a rank, gathered

@pytest.mark.parametrize('how,launcher', [('every rank', 'torchrun'), ('rank0_first', 'torchrun'), ('rank0_first', 'spawn')])
def test_tokenizer_cache(how, launcher, tmp_path):
    w.make_texts(tmp_path/'txt')
    for trial in range(2):  # made once, then read from the cache
        args = (w.text_from_folder, str(tmp_path/'txt'), how)
        r0,r1 = values(spawn_ranks(*args, timeout=180) if launcher == 'spawn' else torchrun_ranks(*args, init=False, timeout=180))
        assert r0['vocab'] == r1['vocab'] and r0['size'] > 8
        assert r0['tokenized'] + r1['tokenized'] == (1 if trial == 0 else 0), (r0, r1)
    assert sorted(p.name for p in (tmp_path/'txt_tok').iterdir()) == ['counter.pkl', 'lengths.pkl', 'test', 'train']

def test_notebook_flow(tmp_path):
    "accelerate's `notebook_launcher` with fastai's `distrib_ctx(in_notebook=True)`, on a machine without CUDA"
    p = subprocess.run([sys.executable, Path(__file__).parent/'notebook_flow.py', str(tmp_path), str(free_port())],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r0,r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    assert r0['world'] == r1['world'] == 2 and r0['backend'] == 'gloo'
    assert r0['weights'] == r1['weights'] and r0['files'] == ['model.pth']

def texts_csv(path):
    "A CSV of labelled texts with many tied token counts"
    import pandas as pd
    words = 'the cat dog sat ran on in a park mat sun hot cold day night big small red blue green'.split()
    texts = [' '.join(words[(i*j) % len(words)] for j in range(1, 9)) for i in range(40)]
    pd.DataFrame({'text': texts, 'label': [i % 2 for i in range(40)]}).to_csv(path, index=False)

def test_tokenize_csv(tmp_path):
    texts_csv(tmp_path/'texts.csv')
    r0,r1 = values(torchrun_ranks(w.csv_tokenized, str(tmp_path), timeout=180))
    assert r0['rows'] == r1['rows'] == 40 and r0['text'] == r1['text'] and r0['counter'] == r1['counter']
    assert r0['tokenized'] + r1['tokenized'] == 4  # one rank tokenized the 4 chunks of 10 rows

@pytest.mark.skipif(importlib.util.find_spec('sentencepiece') is None, reason="sentencepiece is installed in the 'latest' environment")
def test_sentencepiece(tmp_path):
    texts_csv(tmp_path/'texts.csv')
    r0,r1 = values(torchrun_ranks(w.sentencepiece_from_df, str(tmp_path), timeout=180))
    assert r0['vocab'] == r1['vocab'] and r0['trained'] + r1['trained'] == 1
    assert r0['files'] == ['spm.model', 'spm.vocab']  # texts.out removed once, after the one training

@needs_mounts
def test_tokenizer_cache_per_node(tmp_path):
    "Two nodes with disks of their own: each tokenizes its copy of the texts once, and both get one vocabulary"
    mnt,disks,prefix = own_disks(tmp_path)
    for i,d in enumerate(disks): w.make_texts(d/'txt', reverse=bool(i))
    r0,r1 = values(torchrun_ranks(w.text_from_folder, str(mnt/'txt'), 'every rank', init=False, nproc=1, nnodes=2,
                                  node_prefix=prefix, timeout=180))
    assert r0['vocab'] == r1['vocab'] and r0['tokenized'] == r1['tokenized'] == 1
    for d in disks: assert (d/'txt_tok'/'counter.pkl').exists()

@pytest.mark.skipif(not torchvision_imports(), reason="torchvision does not import beside the 'dev' environment's torch")
def test_image_folders(tmp_path):
    from PIL import Image
    (tmp_path/'web').mkdir()
    for i in range(6): Image.new('RGB', (32, 24), (40*i, 0, 0)).save(tmp_path/'web'/f'{i}.png')
    urls = [f"file://{tmp_path/'web'/f'{i}.png'}" for i in range(6)]
    r0,r1 = values(torchrun_ranks(w.image_folders, str(tmp_path), urls, timeout=180))
    assert r0['downloaded'] == r1['downloaded'] == 6 and r0['small'] == r1['small'] == 6  # one copy of each image
    assert r0['broken'] == r1['broken'] == 0 and r0['downloads'] + r1['downloads'] == 6

def test_killed_tokenizer_leaves_no_whole_cache(tmp_path):
    "A run killed while it tokenizes changed texts again: the next run takes the old cache for whole neither way"
    from fastai.text.all import tokenize_folder, load_pickle
    w.make_texts(tmp_path/'txt')
    out = tokenize_folder(tmp_path/'txt', n_workers=0)
    for f in (tmp_path/'txt').rglob('*.txt'): f.write_text(f.read_text().replace('cat', 'lion'))  # the data changed
    p = subprocess.Popen([sys.executable, Path(__file__).parent/'tokenize_killed.py', str(tmp_path/'txt')])
    while p.poll() is None and sum(1 for f in out.rglob('*.txt') if 'lion' in f.read_text()) < 5: time.sleep(0.02)
    p.kill(); p.wait()
    assert p.returncode == -9, "the tokenization ended before it could be killed"
    tokenize_folder(tmp_path/'txt', n_workers=0)  # what `TextDataLoaders.from_folder` calls next time
    count = load_pickle(out/'counter.pkl')
    assert 'lion' in count and 'cat' not in count  # the vocabulary of the texts as they are, tokenized again

@pytest.mark.skipif(importlib.util.find_spec('tensorboard') is None, reason="tensorboard is installed in the 'latest' environment")
def test_tensorboard_logs_once(run, tmp_path):
    "fastai's `TensorBoardCallback` writes on `rank_distrib() == 0`, which is every process under `mp.spawn` without this library"
    assert run(w.tensorboard_logs, str(tmp_path)) == [1, 1]  # one event file: rank 0's
