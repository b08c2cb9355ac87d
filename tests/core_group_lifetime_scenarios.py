"""What each rank does in the tests of `core` (test_core_group_lifetime.py): saves and loads made where there is no
process group: before one exists (a launcher started the ranks, nobody made a group yet), and after fastai or the
user ended it"""
import time, hashlib
from pathlib import Path
import torch, torch.distributed as dist
from fastai.basics import load_learner
from fastai.callback.progress import CSVLogger
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner, synth_text_learner
from ddp_safe_fastai.learner import load_dataloaders
from ddp_safe_fastai.ranks import run_group

def digest(model):
    "A short hash of `model`'s weights"
    return hashlib.sha1(b''.join(v.detach().cpu().numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:16]

def own_weights(learn):
    "Make this rank's weights unlike every other rank's (rank 0's stay as they are); their digest"
    with torch.no_grad():
        for p in learn.model.parameters(): p.add_(rank_distrib())
    return digest(learn.model)

def save_and_load(learn, tag):
    "Every guarded path a user takes with a trained model, on every rank: the digest each one ends with"
    mine = own_weights(learn)
    if rank_distrib() == 0: time.sleep(0.5)  # rank 0 late, as a rank that logs or evaluates first is
    learn.save(tag); learn.load(tag)
    res = dict(mine=mine, loaded=digest(learn.model))
    learn.export(f'{tag}.pkl')
    res['exported'] = digest(load_learner(learn.path/f'{tag}.pkl').model)
    learn.dls.save(f'{tag}_dls.pkl')
    res['dls'] = len(load_dataloaders(learn.path, f'{tag}_dls.pkl').train.items)
    own_weights(learn)
    learn.add_cb(CSVLogger(fname=f'{tag}_history.csv'))
    learn.fit(1, 0.1, cbs=[SafeSaveModelCallback(fname=f'{tag}_best', monitor='valid_loss', comp=lambda a,b: True),
                           CheckpointCallback(fname=f'{tag}_ckpt')])
    res['best'] = digest(learn.model)  # a fit of each rank's own: the best is rank 0's, reloaded on every rank
    res['log'] = learn.csv_logger.read_log()['valid_loss'].tolist()  # rank 0's log, read on every rank
    learn.remove_cb(learn.csv_logger)
    return res

def text_encoder(root, tag):
    "`save_encoder`/`load_encoder` of a language model, on every rank"
    learn = synth_text_learner(Path(root))
    mine = own_weights(learn)
    learn.save_encoder(f'{tag}_enc'); learn.load_encoder(f'{tag}_enc')
    return dict(mine_encoder=mine, encoder=digest(learn.model[0]))

def before_and_after(root, seed):
    "Saves before any process group (the launcher started the ranks), a DDP fit, and saves after it"
    torch.manual_seed(seed)
    learn = synth_learner(path=Path(root), seed=seed)
    before = dict(group=dist.is_initialized(), **save_and_load(learn, 'before'), **text_encoder(root, 'before'))
    with learn.distrib_ctx(): learn.fit(1, 0.1)
    return dict(rank=rank_distrib(), before=before, after=save_and_load(learn, 'after'))

def after_destroy(root, seed):
    "Under `mp.spawn`: a DDP fit, the user ends the process group, then saves and loads"
    torch.manual_seed(seed)
    learn = synth_learner(path=Path(root), seed=seed)
    with learn.distrib_ctx(): learn.fit(1, 0.1)
    dist.destroy_process_group()
    return dict(rank=rank_distrib(), after=save_and_load(learn, 'after'))

def groups_one_after_another(root, seed, n=30):
    "Under `mp.spawn`: a save and a load, then the user ends the process group, `n` times (each save forms one again)"
    learn = synth_learner(path=Path(root), seed=seed)
    loaded = []
    for _ in range(n):
        with torch.no_grad():
            for p in learn.model.parameters(): p.add_(1)  # rank 0's weights of this round, unlike its last
        own_weights(learn)
        learn.save('again'); learn.load('again')
        loaded.append(digest(learn.model))
        dist.destroy_process_group()  # Python often gives the next group this one's `id`
    return dict(rank=rank_distrib(), loaded=loaded, groups=run_group.seen)
