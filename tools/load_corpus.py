"""A user's loading script for the exports `export_corpus.py` made: `load_learner` and `load_dataloaders` with their
defaults, a prediction from each Learner, and (`define`) a `fine_tune(1)` on the DataLoaders loaded.

    python load_corpus.py CORPUS define|none   # CORPUS/loaded-{define,none}.json

`define`: this script defines the exporter's functions in `__main__` first (fastai's instruction: define `label_func`
before `load_learner`); `none`: it defines none of them."""
import sys, json, warnings
from pathlib import Path
import pandas as pd
from fastai.tabular.all import *
try: from fastai.vision.all import *  # as a script that loads a vision export imports it (the dev stack has no torchvision)
except Exception: pass
from ddp_safe_fastai.all import *
from ddp_safe_fastai.safe_unpickle import export_report

warnings.filterwarnings('ignore')
corpus, mode = Path(sys.argv[1]), sys.argv[2]
if mode == 'define':
    def label_func(name): return name.split('_')[0]
    def centre_of(f): return tensor([[16., 16.]])
    def mask_of(f): return f.parent.parent.parent/'masks'/f.name if f.parent.parent.name in ('train', 'valid') else f
    def multi_label(f): return [f.parent.name, 'even' if int(f.parent.name) % 2 == 0 else 'odd']
    def digit_value(f): return float(f.parent.name)
    def box_of(f): return [[2., 2., 20., 20.]]
    def box_label(f): return ['digit']
    class MainTabular(nn.Module):  # the class the exporter's `__main__` defined, as the user's notebook defines it again
        def __init__(self, n_cont, n_out): super().__init__(); self.lin = nn.Linear(n_cont, n_out)
        def forward(self, x_cat, x_cont): return self.lin(x_cont)
    sys.path.insert(0, str(corpus.absolute()))
    import corpus_models  # the user's module: its class admitted by naming it

def predict(name, learn, sample):
    "What the exporting process recorded of `sample`, predicted by this one"
    with learn.no_bar():
        if name.startswith('collab') or name == 'block_bbox':
            test = learn.dls.test_dl(pd.DataFrame(sample)) if name.startswith('collab') else learn.dls.test_dl([Path(sample)], before_batch=noop)  # no boxes to pad
            return dict(pred='None', probs=[round(float(p), 4) for p in learn.get_preds(dl=test)[0].flatten()[:8]])
        if name.startswith('tabular'): sample = pd.Series(sample)
        if name == 'text_lm': set_seed(0); return dict(pred=str(learn.predict(sample, n_words=3)), probs=[0.0])
        res = learn.predict(sample)
    if name.startswith('segmentation'): return dict(pred=int(res[0].sum()), probs=[round(float(p), 4) for p in res[2].flatten()[:8]])
    if name == 'keypoints': return dict(pred=res[0].flatten().tolist(), probs=[round(float(p), 4) for p in res[2].flatten()[:8]])
    return dict(pred=str(res[1] if name.startswith('tabular') else res[0]), probs=[round(float(p), 4) for p in res[2].flatten()[:8]])

UNTRAINED = {'block_bbox': "the boxes' model is no detector", 'vision_lambda': 'a lambda is never run',
             'keypoints': "fastai keeps `TensorPoint.create` as a Transform: the classmethod the file carries stays a stand-in"}

def trains(learn, dls):
    "Given the DataLoaders saved beside the export (loaded by default too), the Learner fine-tunes: its optimizer, loss, metrics and callbacks are themselves"
    learn.dls = dls
    with learn.no_bar(), learn.no_logging(): learn.fine_tune(1)
    return True

def label_of(learn):
    "The label a vision export's y pipeline gives `3_1.png`, or the error it raises (the exporter's function, or its stand-in)"
    try: return learn.dls.valid_ds.tls[1].tfms.fs[0](Path('digits/valid/3/3_1.png'))
    except UnsafeExportError as e: return f"UnsafeExportError: {e}"

made = json.loads((corpus/'corpus.json').read_text())
out = {}
for name, sample in made['samples'].items():
    try:
        learn = load_learner(corpus/f'{name}.pkl', allow=[corpus_models.TinyTabular] if mode == 'define' else [])
        dls = load_dataloaders(corpus, f'{name}_dls.pkl', device='cpu')
        out[name] = dict(predicted=predict(name, learn, sample), dls=type(dls).__name__,
                         label=label_of(learn) if name.startswith('vision_') else None)
        if mode == 'define' and name not in UNTRAINED: out[name]['trained'] = trains(learn, dls)
        if mode == 'none':  # `ddp-safe-check inspect`'s decision, in a program that defines no function of its own, as this one
            out[name]['inspected'] = [export_report(corpus/f)[1] for f in (f'{name}.pkl', f'{name}_dls.pkl')]
    except Exception as e: out[name] = dict(error=f"{type(e).__name__}: {e}")
(corpus/f'loaded-{mode}.json').write_text(json.dumps(out, indent=1, default=str))
