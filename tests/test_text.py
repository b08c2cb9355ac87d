"""`text` (nbs/43_text.ipynb): `save_encoder`/`load_encoder` under DDP; fastai's tokenizer caches (a folder, a CSV,
SentencePiece) made once per disk and read by every rank, and never taken for whole after a killed tokenization"""
import sys, time, importlib, subprocess
from pathlib import Path
import pytest
import text_scenarios as t
from conftest import values, needs_mounts, own_disks, ranks, pool
from ddp_safe_fastai.launch import torchrun_ranks

def test_encoder(launch, tmp_path):
    "`save_encoder` on every rank with different weights, then `load_encoder`: rank 0's encoder everywhere"
    assert values(launch(t.encoder_roundtrip, str(tmp_path), timeout=180)) == [10., 10.]

@pytest.mark.parametrize('how,launcher', [('every rank', 'torchrun'), ('rank0_first', 'torchrun'), ('rank0_first', 'spawn')])
def test_tokenizer_cache(how, launcher, tmp_path):
    "`TextDataLoaders.from_folder` on every rank at once or through `rank0_first`: tokenized once, read from the cache the second time, one vocabulary on every rank"
    t.make_texts(tmp_path/'txt')
    for trial in range(2):  # made once, then read from the cache
        args = (t.text_from_folder, str(tmp_path/'txt'), how)
        r0,r1 = values(pool(launcher, 2).run(*args, init=False, timeout=300))  # ranks the launcher started, from the session's pool
        assert r0['vocab'] == r1['vocab'] and r0['size'] > 8
        assert r0['tokenized'] + r1['tokenized'] == (1 if trial == 0 else 0), (r0, r1)
    assert sorted(p.name for p in (tmp_path/'txt_tok').iterdir()) == ['counter.pkl', 'lengths.pkl', 'test', 'train']

def texts_csv(path):
    "A CSV of labelled texts with many tied token counts"
    import pandas as pd
    words = 'the cat dog sat ran on in a park mat sun hot cold day night big small red blue green'.split()
    texts = [' '.join(words[(i*j) % len(words)] for j in range(1, 9)) for i in range(40)]
    pd.DataFrame({'text': texts, 'label': [i % 2 for i in range(40)]}).to_csv(path, index=False)

def test_tokenize_csv(tmp_path):
    "fastai's `tokenize_csv` on every rank: one rank tokenizes, every rank reads the same file and counter"
    texts_csv(tmp_path/'texts.csv')
    r0,r1 = values(ranks(t.csv_tokenized, str(tmp_path), timeout=180))
    assert r0['rows'] == r1['rows'] == 40 and r0['text'] == r1['text'] and r0['counter'] == r1['counter']
    assert r0['tokenized'] + r1['tokenized'] == 4  # one rank tokenized the 4 chunks of 10 rows

@pytest.mark.skipif(importlib.util.find_spec('sentencepiece') is None, reason="sentencepiece is installed in the 'latest' environment")
def test_sentencepiece(tmp_path):
    "`SentencePieceTokenizer` on every rank: trained once, one vocabulary, its temporary texts removed"
    texts_csv(tmp_path/'texts.csv')
    r0,r1 = values(ranks(t.sentencepiece_from_df, str(tmp_path), timeout=180))
    assert r0['vocab'] == r1['vocab'] and r0['trained'] + r1['trained'] == 1
    assert r0['files'] == ['spm.model', 'spm.vocab']  # texts.out removed once, after the one training

@needs_mounts
def test_tokenizer_cache_per_node(tmp_path):
    "Two nodes with disks of their own: each tokenizes its copy of the texts once, and both get one vocabulary"
    mnt,disks,prefix = own_disks(tmp_path)
    for i,d in enumerate(disks): t.make_texts(d/'txt', reverse=bool(i))
    r0,r1 = values(torchrun_ranks(t.text_from_folder, str(mnt/'txt'), 'every rank', init=False, nproc=1, nnodes=2,
                                  node_prefix=prefix, timeout=180))
    assert r0['vocab'] == r1['vocab'] and r0['tokenized'] == r1['tokenized'] == 1
    for d in disks: assert (d/'txt_tok'/'counter.pkl').exists()

def test_killed_tokenizer_leaves_no_whole_cache(tmp_path):
    "A run killed while it tokenizes changed texts again: the next run takes the old cache for whole neither way"
    from fastai.text.all import tokenize_folder, load_pickle
    t.make_texts(tmp_path/'txt')
    out = tokenize_folder(tmp_path/'txt', n_workers=0)
    for f in (tmp_path/'txt').rglob('*.txt'): f.write_text(f.read_text().replace('cat', 'lion'))  # the data changed
    p = subprocess.Popen([sys.executable, Path(__file__).parent/'tokenize_killed.py', str(tmp_path/'txt')])
    while p.poll() is None and sum(1 for f in out.rglob('*.txt') if 'lion' in f.read_text()) < 5: time.sleep(0.02)
    p.kill(); p.wait()
    assert p.returncode == -9, "the tokenization ended before it could be killed"
    tokenize_folder(tmp_path/'txt', n_workers=0)  # what `TextDataLoaders.from_folder` calls next time
    count = load_pickle(out/'counter.pkl')
    assert 'lion' in count and 'cat' not in count  # the vocabulary of the texts as they are, tokenized again
