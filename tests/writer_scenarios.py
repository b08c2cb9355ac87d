"What each rank does in the tests of fastai's other writers (issue 21): lr_find, CSVLogger, get_preds' files, tokenizer caches"
import time, hashlib, importlib
from pathlib import Path
import torch
from torch import nn
from fastai.basics import Callback, Recorder
from ddp_safe_fastai.all import *
from ddp_safe_fastai.learner import model_state
from ddp_safe_fastai.testing import synth_learner

def digest(o):
    "A hash of `o` (tensors, numbers, strings, in dicts, lists and tuples) that is the same on every rank for equal values"
    h = hashlib.sha256()
    def walk(o):
        if isinstance(o, torch.Tensor): h.update(f"{o.dtype}{tuple(o.shape)}".encode()); h.update(o.detach().cpu().numpy().tobytes())
        elif isinstance(o, dict): [walk(k) or walk(v) for k,v in o.items()]
        elif hasattr(o, '__iter__') and not isinstance(o, (str, bytes)): [walk(v) for v in o]
        else: h.update(repr(o).encode())
    walk(o)
    return h.hexdigest()[:16]

def mlp_learner(root, seed=1, **kwargs):
    "The synthetic regression with a hidden layer and dropout: the same weights on every rank, random masks per rank"
    importlib.import_module('fastai.callback.schedule')  # lr_find, fit_one_cycle
    learn = synth_learner(n=128, path=Path(root), seed=seed, **kwargs)
    torch.manual_seed(seed)
    learn.model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    return learn

def files_under(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob('*'))

def trained_state(learn):
    "The model's weights and the optimizer's per-parameter state (its hyper-parameters are set again by every fit)"
    state = model_state(learn.model, learn.opt, True)
    return digest([state['model'], state['opt']['state']])

def lr_find_then_fit(root):
    "One epoch, `lr_find`, then `fit_one_cycle(2)` at its suggestion, in `distrib_ctx`: what each rank holds"
    learn = mlp_learner(root)
    with learn.distrib_ctx():
        learn.fit(1, 1e-2)  # an optimizer state (momentum) for lr_find to give back
        before = trained_state(learn)
        sugg = learn.lr_find(show_plot=False)
        after = trained_state(learn)
        recorder = digest([learn.recorder.lrs, learn.recorder.losses])
        learn.fit_one_cycle(2, sugg.valley)
    return dict(before=before, after=after, suggestion=sugg.valley, recorder=recorder, n_losses=len(learn.recorder.losses),
                weights=digest(learn.model.state_dict()), files=files_under(root))

class SlowRank0Logger(Callback):
    "Rank 0 logs its last epoch 1 s after the other ranks finished it"
    order = Recorder.order - 1
    def after_epoch(self):
        if rank_distrib() == 0 and self.epoch == self.n_epoch - 1: time.sleep(1)

def csv_logger_two_fits(root):
    "`fit(3)` with a `CSVLogger`, then `fit(2)` appending to it, in `distrib_ctx`; the log as every rank reads it"
    from fastai.callback.progress import CSVLogger
    learn = mlp_learner(root, cbs=[CSVLogger(), SlowRank0Logger()])
    values = []
    with learn.distrib_ctx():
        learn.fit(3, 1e-2); values += learn.recorder.values
        learn.csv_logger.append = True
        learn.fit(2, 1e-2); values += learn.recorder.values
    log = learn.csv_logger.read_log()
    return dict(lines=(Path(root)/'history.csv').read_text().splitlines(), rows=len(log),
                valid_loss=[float(v) for v in log['valid_loss'] if v != 'valid_loss'], values=[float(v[1]) for v in values])

def saved_preds(root):
    "`get_preds(save_preds=, save_targs=)` in `distrib_ctx`: what every rank reads back from the files"
    learn = mlp_learner(root)
    for d in ('preds', 'targs'): (Path(root)/d).mkdir(exist_ok=True)
    writes,save = [],torch.save
    def counted(obj, f, *args, **kwargs):
        writes.append(str(f))
        time.sleep(0.5)  # a slow disk: rank 0 is still writing when the other ranks leave the last batch
        return save(obj, f, *args, **kwargs)
    torch.save = counted
    with learn.distrib_ctx():
        preds,targs = learn.get_preds(save_preds=Path(root)/'preds', save_targs=Path(root)/'targs')
    torch.save = save
    def read(d): return torch.cat([torch.load(Path(root)/d/str(i)) for i in range(len(list((Path(root)/d).iterdir())))])
    return dict(n=len(preds), preds_match=torch.equal(read('preds')[:len(preds)], preds),
                targs_match=torch.equal(read('targs')[:len(targs)], targs), files=files_under(Path(root)/'preds'), writes=len(writes))

def make_texts(path, n=40, reverse=False):
    "A small folder of labelled texts in fastai's IMDB layout (train/test, pos/neg), with many tied token counts"
    words = 'the cat dog sat ran on in a park mat sun hot cold day night big small red blue green'.split()
    for i in (reversed(range(n)) if reverse else range(n)):  # another order on disk: another order of tokenizing
        split,label = ('train' if i < 3*n//4 else 'test'),('pos' if i % 2 else 'neg')
        (Path(path)/split/label).mkdir(parents=True, exist_ok=True)
        (Path(path)/split/label/f'{i}.txt').write_text(' '.join(words[(i*j) % len(words)] for j in range(1, 9)))

def counting(module, name, calls):
    "Make `module.name` count its calls in `calls`"
    f = getattr(module, name)
    def counted(*args, **kwargs): calls.append(1); return f(*args, **kwargs)
    setattr(module, name, counted)

def text_from_folder(path, how='every rank'):
    "`TextDataLoaders.from_folder(path, valid='test')` on every rank, or through `rank0_first`: the vocabulary each rank built"
    import fastai.text.core
    from fastai.text.all import TextDataLoaders
    calls = []; counting(fastai.text.core, 'parallel_tokenize', calls)
    make = lambda: TextDataLoaders.from_folder(path, valid='test', bs=4)
    dls = make() if how == 'every rank' else rank0_first(make)
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

def image_folders(root, urls):
    "`download_images` and `resize_images` on every rank, as a script that prepares its data does"
    import fastai.vision.utils as vu
    from fastai.vision.all import download_images, resize_images, get_image_files, verify_images
    calls = []; counting(vu, 'download_url', calls)
    download_images(Path(root)/'downloaded', urls=urls)
    resize_images(Path(root)/'downloaded', max_size=8, dest=Path(root)/'small', max_workers=0)
    return dict(downloaded=len(get_image_files(Path(root)/'downloaded')), small=len(get_image_files(Path(root)/'small')),
                broken=len(verify_images(get_image_files(Path(root)/'small'))), downloads=len(calls))

def tensorboard_logs(root):
    "A fit in `distrib_ctx` with fastai's `TensorBoardCallback`: how many event files its log folder holds"
    from fastai.callback.tensorboard import TensorBoardCallback
    learn = mlp_learner(root)
    with learn.distrib_ctx(): learn.fit(2, 1e-2, cbs=TensorBoardCallback(Path(root)/'tb', trace_model=False, log_preds=False))
    return len(list((Path(root)/'tb').glob('events.out.tfevents.*')))

def node_text_from_folder(root):
    "`text_from_folder` of ROOT/txt, this node's own copy of the texts; with the node's index"
    return dict(node=node_rank_distrib(), **text_from_folder(Path(root)/'txt'))
