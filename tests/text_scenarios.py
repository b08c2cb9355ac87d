"""What each rank does in the tests of `text` (test_text.py, test_core_multinode.py): `save_encoder`/`load_encoder`,
tokenizer caches made once (a folder, a CSV, SentencePiece), a node's own copy of the texts"""
from pathlib import Path
import torch
from fastcore.xtras import modified_env
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_text_learner
from writers_scenarios import digest, files_under, counting

def encoder_roundtrip(root):
    "save_encoder on every rank with different weights, then load_encoder: rank 0's weights everywhere"
    learn = synth_text_learner(root)
    enc = learn.model[0]
    with torch.no_grad(): enc.encoder.weight.fill_(10. + rank_distrib())
    learn.save_encoder('enc')
    with torch.no_grad(): enc.encoder.weight.fill_(-1.)
    learn.load_encoder('enc')
    return enc.encoder.weight.flatten()[0].item()

def make_texts(path, n=40, reverse=False):
    "A small folder of labelled texts in fastai's IMDB layout (train/test, pos/neg), with many tied token counts"
    words = 'the cat dog sat ran on in a park mat sun hot cold day night big small red blue green'.split()
    for i in (reversed(range(n)) if reverse else range(n)):  # another order on disk: another order of tokenizing
        split,label = ('train' if i < 3*n//4 else 'test'),('pos' if i % 2 else 'neg')
        (Path(path)/split/label).mkdir(parents=True, exist_ok=True)
        (Path(path)/split/label/f'{i}.txt').write_text(' '.join(words[(i*j) % len(words)] for j in range(1, 9)))

def text_from_folder(path, how='every rank'):
    "`TextDataLoaders.from_folder(path, valid='test')` on every rank, or through `rank0_first`: the vocabulary each rank built"
    import fastai.text.core
    from fastai.text.all import TextDataLoaders
    calls = []; counting(fastai.text.core, 'parallel_tokenize', calls)
    make = lambda: TextDataLoaders.from_folder(path, valid='test', bs=4)
    # rank 0 tokenizes while the others wait: over a minute on a busy machine (fastai starts its tokenizing processes)
    with modified_env(DDP_SAFE_TIMEOUT='280'): dls = make() if how == 'every rank' else rank0_first(make)
    return dict(vocab=digest(dls.vocab), size=len(dls.vocab[0]), tokenized=len(calls))

def csv_tokenized(root):
    "fastai's `tokenize_csv` on every rank: the file and counter each rank reads back, and how often this rank tokenized"
    import fastai.text.core as tc
    from fastai.text.all import load_tokenized_csv
    calls = []; counting(tc, 'tokenize_df', calls)
    tokenize_csv(Path(root)/'texts.csv', ['text'], n_workers=0, chunksize=10)
    df,count = load_tokenized_csv(Path(root)/'texts_tok.csv')
    return dict(rows=len(df), text=digest(list(df['text'])), counter=digest(list(count.items())), tokenized=len(calls))

def sentencepiece_from_df(root):
    "`TextDataLoaders.from_df` with a `SentencePieceTokenizer` on every rank: the vocabulary each rank gets"
    import pandas as pd, sentencepiece
    from fastai.text.all import TextDataLoaders, SentencePieceTokenizer
    calls = []; counting(sentencepiece.SentencePieceTrainer, 'Train', calls)
    df = pd.read_csv(Path(root)/'texts.csv')
    tok = SentencePieceTokenizer(cache_dir=Path(root)/'spm', vocab_sz=60)
    dls = TextDataLoaders.from_df(df, text_col='text', label_col='label', tok_tfm=tok, bs=4, seed=0)
    return dict(vocab=digest(dls.vocab), trained=len(calls), files=files_under(Path(root)/'spm'))

def node_text_from_folder(root):
    "`text_from_folder` of ROOT/txt, this node's own copy of the texts; with the node's index"
    return dict(node=node_rank_distrib(), **text_from_folder(Path(root)/'txt'))
