"""What each rank does in the tests of `writers`, fastai's other writers (test_writers.py): lr_find, CSVLogger,
get_preds' files, image folders, TensorBoard. `digest`, `files_under` and `counting` serve text_scenarios.py too"""
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

def counting(module, name, calls):
    "Make `module.name` count its calls in `calls`"
    f = getattr(module, name)
    def counted(*args, **kwargs): calls.append(1); return f(*args, **kwargs)
    setattr(module, name, counted)

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
