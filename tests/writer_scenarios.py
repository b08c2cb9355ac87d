"What each rank does in the tests of fastai's other writers (issue 21): lr_find, CSVLogger, get_preds' files, tokenizer caches"
import hashlib, importlib
from pathlib import Path
import torch
from torch import nn
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

def csv_logger_two_fits(root):
    "`fit(3)` with a `CSVLogger`, then `fit(2)` appending to it, in `distrib_ctx`; the log as every rank reads it"
    from fastai.callback.progress import CSVLogger
    learn = mlp_learner(root, cbs=CSVLogger())
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
    with learn.distrib_ctx():
        preds,targs = learn.get_preds(save_preds=Path(root)/'preds', save_targs=Path(root)/'targs')
    def read(d): return torch.cat([torch.load(Path(root)/d/str(i)) for i in range(len(list((Path(root)/d).iterdir())))])
    return dict(n=len(preds), preds_match=torch.equal(read('preds')[:len(preds)], preds),
                targs_match=torch.equal(read('targs')[:len(targs)], targs), files=files_under(Path(root)/'preds'))

def make_texts(path, n=40):
    "A small folder of labelled texts in fastai's IMDB layout (train/test, pos/neg), with many tied token counts"
    words = 'the cat dog sat ran on in a park mat sun hot cold day night big small red blue green'.split()
    for i in range(n):
        split,label = ('train' if i < 3*n//4 else 'test'),('pos' if i % 2 else 'neg')
        (Path(path)/split/label).mkdir(parents=True, exist_ok=True)
        (Path(path)/split/label/f'{i}.txt').write_text(' '.join(words[(i*j) % len(words)] for j in range(1, 9)))

def text_from_folder(path, how='every rank'):
    "`TextDataLoaders.from_folder(path, valid='test')` on every rank, or through `rank0_first`: the vocabulary each rank built"
    import fastai.text.core
    from fastai.text.all import TextDataLoaders
    calls,tokenize = [],fastai.text.core.parallel_tokenize
    def counted(*args, **kwargs): calls.append(1); return tokenize(*args, **kwargs)
    fastai.text.core.parallel_tokenize = counted
    make = lambda: TextDataLoaders.from_folder(path, valid='test', bs=4)
    dls = make() if how == 'every rank' else rank0_first(make)
    return dict(vocab=digest(dls.vocab), size=len(dls.vocab[0]), tokenized=len(calls))
