"""Text under DDP, the ULMFiT flow: `language_model_learner` -> `save_encoder` -> `text_classifier_learner` ->
`load_encoder`, on every rank.

    torchrun --nproc_per_node 2 examples/text.py [PATH]
    accelerate launch --multi_gpu --num_processes 2 examples/text.py [PATH]

The corpus ships with Python and scikit-learn: paragraphs of Python's own reference topics (`pydoc_data`) and of
scikit-learn's dataset descriptions. The language model learns from both; the classifier tells them apart."""
import sys, tempfile
from pathlib import Path
import pandas as pd, sklearn.datasets
from pydoc_data.topics import topics
from fastai.text.all import *
from ddp_safe_fastai.all import *
from report import report

def paragraphs(texts, label, n):
    "The first `n` paragraphs of 100 to 600 characters in `texts`, with `label`"
    ps = [' '.join(p.split()) for t in texts for p in t.split('\n\n')]
    return [(p, label) for p in ps if 100 <= len(p) <= 600][:n]

def corpus():
    descr = [f.read_text() for f in sorted((Path(sklearn.datasets.__file__).parent/'descr').glob('*.rst'))]
    rows = paragraphs(topics.values(), 'python docs', 150) + paragraphs(descr, 'dataset card', 150)
    return pd.DataFrame(rows, columns=['text', 'label'])

path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir())/'ddp_safe_text')
df = corpus()
small = dict(emb_sz=64, n_hid=128, n_layers=2)  # a small AWD_LSTM: the flow, not the accuracy, is the point here

# both DataLoaders first, and batches made in this process (num_workers=0): forking worker processes once DDP has
# started its threads hung a validation here (see nbs/51_applications.ipynb)
set_seed(42)
dls_lm = TextDataLoaders.from_df(df, path, text_col='text', is_lm=True, valid_pct=0.2, seed=42, bs=16, seq_len=40,
                                 num_workers=0)
dls = TextDataLoaders.from_df(df, path, text_col='text', label_col='label', valid_pct=0.2, seed=42, bs=16,
                              text_vocab=dls_lm.vocab, num_workers=0)

set_seed(42)
lm = language_model_learner(dls_lm, AWD_LSTM, config={**awd_lstm_lm_config, **small}, pretrained=False, path=path)
with lm.distrib_ctx():
    lm.fit_one_cycle(2, 1e-2, cbs=[SafeSaveModelCallback(fname='lm'), CheckpointCallback(fname='lm_ckpt')])
lm.save_encoder('encoder')                        # rank 0 writes; the others wait for the outcome

learn = text_classifier_learner(dls, AWD_LSTM, config={**awd_lstm_clas_config, **small}, pretrained=False,
                                metrics=accuracy, path=path)
learn.load_encoder('encoder')                     # every rank reads the finished file
with learn.distrib_ctx():
    learn.fit_one_cycle(3, 1e-2, cbs=[SafeSaveModelCallback(), CheckpointCallback()])

learn.export()
inf = load_learner(path/'export.pkl')
pred = inf.predict("The dataset has 150 samples with four numeric attributes and a class.")[0]
dls.save()
dls2 = load_dataloaders(path)
report(learn, path, 'text', pred, dict(dls_items=len(dls2.valid_ds)))
