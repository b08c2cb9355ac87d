"""Collaborative filtering under DDP: `CollabDataLoaders.from_df`, `collab_learner`, `fit_one_cycle`, on every rank.

    torchrun --nproc_per_node 2 examples/collab.py [PATH]
    accelerate launch --multi_gpu --num_processes 2 examples/collab.py [PATH]

The ratings are made up: 100 users and 50 films with hidden tastes, 2,000 ratings from 1 to 5."""
import sys, tempfile
from pathlib import Path
import numpy as np, pandas as pd
from fastai.collab import *
from fastai.tabular.all import *
from ddp_safe_fastai.all import *
from report import report

def ratings(n_users=100, n_items=50, n=2000, seed=0):
    "Ratings from hidden user and item factors: the same table on every rank"
    rng = np.random.default_rng(seed)
    u,i = rng.normal(size=(n_users, 3)),rng.normal(size=(n_items, 3))
    users,items = rng.integers(0, n_users, n),rng.integers(0, n_items, n)
    score = (u[users]*i[items]).sum(1) + rng.normal(scale=0.5, size=n)
    return pd.DataFrame(dict(user=users, film=[f'film {k}' for k in items], rating=np.clip(np.round(3 + score), 1, 5)))

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir())/'ddp_safe_collab')
df = ratings()
set_seed(42)
dls = CollabDataLoaders.from_df(df, user_name='user', item_name='film', rating_name='rating', bs=64, path=path)
learn = collab_learner(dls, n_factors=8, y_range=(0.5, 5.5), path=path)
with learn.distrib_ctx():
    learn.fit_one_cycle(4, 5e-3, wd=0.1, cbs=[SafeSaveModelCallback(), CheckpointCallback()])

learn.export()
inf = load_learner(path/'export.pkl')
preds,_ = inf.get_preds(dl=inf.dls.test_dl(df.iloc[:2]))  # collab learners predict through a test DataLoader (of one row, fastai squeezes its output away)
pred = round(preds[0].item(), 4)                   # the first user's rating of their first film
dls.save()
dls2 = load_dataloaders(path)
report(learn, path, 'collab', pred, dict(dls_items=len(dls2.valid_ds)))
