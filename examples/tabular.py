"""Tabular under DDP: `TabularDataLoaders.from_df`, `tabular_learner`, `fit_one_cycle`, on every rank.

    torchrun --nproc_per_node 2 examples/tabular.py [PATH]
    accelerate launch --multi_gpu --num_processes 2 examples/tabular.py [PATH]

The table is scikit-learn's bundled breast cancer data (569 tumours, 30 measurements), with the tumour's size
class as a categorical column."""
import sys, tempfile
from pathlib import Path
import pandas as pd
from sklearn.datasets import load_breast_cancer
from fastai.tabular.all import *
from ddp_safe_fastai.all import *
from report import report

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir())/'ddp_safe_tabular')
df = load_breast_cancer(as_frame=True).frame
df['diagnosis'] = df.pop('target').map({0: 'malignant', 1: 'benign'})
df['size'] = pd.qcut(df['mean radius'], 4, labels=['small', 'medium', 'large', 'very large']).astype(str)
cont = [c for c in df.columns if c not in ('diagnosis', 'size')]

set_seed(42)
dls = TabularDataLoaders.from_df(df, path, procs=[Categorify, FillMissing, Normalize], cat_names=['size'],
                                 cont_names=cont, y_names='diagnosis', valid_idx=list(range(0, len(df), 5)), bs=32)
learn = tabular_learner(dls, layers=[64, 32], metrics=accuracy)  # BatchNorm on the inputs and in every layer
with learn.distrib_ctx():
    learn.fit_one_cycle(4, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback()])

learn.export()
inf = load_learner(path/'export.pkl')
pred = inf.predict(df.iloc[0])[1].item()          # the class index of the first tumour
dls.save()
dls2 = load_dataloaders(path)
report(learn, path, 'tabular', pred, dict(dls_items=len(dls2.valid_ds)))
