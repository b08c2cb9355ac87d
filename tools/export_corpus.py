"""A corpus of real fastai exports, made by this process as a user makes them: the five applications in seven variants,
with metrics and callbacks, functions and lambdas defined in `__main__` (cloudpickle carries those by value); fastai's other
metrics, losses, callbacks, blocks, optimizers and architectures, and torch's layers (`ordinary_vision`, `ordinary_tabular`);
a user's model class of a module (`corpus_models.py`, written beside the exports) and of `__main__`; a tabular regression and
collab models of layers and with metrics.

    python export_corpus.py OUT [--first]  # OUT/{variant}.pkl, and OUT/corpus.json: each variant's sample input and prediction

Data is made here (scikit-learn's bundled digits, tables and texts; masks drawn from the digits): nothing is downloaded.
Where torchvision does not import beside this environment's torch (the dev environment's CPU wheel), the vision
variants are left out and `corpus.json` says so."""
import sys, json, warnings
from pathlib import Path
import numpy as np, pandas as pd
from PIL import Image
from fastai.tabular.all import *
from fastai.collab import *
from fastai.text.all import *
from ddp_safe_fastai.all import *

warnings.filterwarnings('ignore')

def torchvision_imports():
    import importlib
    try: importlib.import_module('torchvision.models')
    except Exception: return False
    return True

def digit_files(path, n=40):
    "`n` of scikit-learn's digits as `path/{train,valid}/LABEL/LABEL_N.png`, and each one's mask (`path/masks`)"
    from sklearn.datasets import load_digits
    d = load_digits()
    files = []
    for i,(img,y) in enumerate(zip(d.images[:n], d.target[:n])):
        f = path/('valid' if i % 5 == 0 else 'train')/str(y)/f'{y}_{i}.png'
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img*255/16).astype(np.uint8)).resize((32, 32)).save(f)
        m = path/'masks'/f.name
        m.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img > 8).astype(np.uint8)).resize((32, 32), Image.NEAREST).save(m)
        files.append(f)
    return files

def label_func(name): return name.split('_')[0]   # a named function of `__main__`: carried by value
def centre_of(f): return tensor([[16., 16.]])  # a point on each image
def mask_of(f): return f.parent.parent.parent/'masks'/f.name if f.parent.parent.name in ('train', 'valid') else f

def multi_label(f): return [f.parent.name, 'even' if int(f.parent.name) % 2 == 0 else 'odd']
def digit_value(f): return float(f.parent.name)
def box_of(f): return [[2., 2., 20., 20.]]
def box_label(f): return ['digit']

def fit_and_export(learn, out, name, sample, predict=lambda l, x: l.predict(x)):
    "One short fit, then the export; what the exporting process predicts for `sample`"
    with learn.no_bar(): learn.fit(1, 1e-3)
    learn.export(Path(out).absolute()/f'{name}.pkl')
    learn.dls.save(Path(out).absolute()/f'{name}_dls.pkl')
    with learn.no_bar(): pred = predict(learn, sample)
    return dict(pred=pred[0] if isinstance(pred[0], list) else str(pred[0]), probs=[round(float(p), 4) for p in pred[2].flatten()[:8]])

def vision(out, path):
    from fastai.vision.all import (ImageDataLoaders, SegmentationDataLoaders, Resize, vision_learner, unet_learner, resnet18,
                                   resnet34, aug_transforms, imagenet_stats, RandomResizedCrop, FlipItem, DataBlock, ImageBlock,
                                   PointBlock, RandomSplitter, xresnet18, MixUp, top_k_accuracy)
    files = digit_files(path/'digits')
    sample = str(files[0])
    made = {}
    set_seed(1)
    dls = ImageDataLoaders.from_name_func(path, files, label_func, item_tfms=Resize(32), bs=8, num_workers=0)
    made['vision_name_func'] = fit_and_export(vision_learner(dls, resnet18, pretrained=False, metrics=accuracy,
                                                             cbs=[SafeSaveModelCallback(monitor='accuracy')]), out, 'vision_name_func', sample)
    set_seed(1)
    dls = ImageDataLoaders.from_name_func(path, files, lambda name: name.split('_')[0], item_tfms=Resize(32), bs=8, num_workers=0)
    learn = vision_learner(dls, resnet18, pretrained=False, metrics=[accuracy, error_rate],
                           cbs=[SaveModelCallback(), EarlyStoppingCallback(patience=3)])
    made['vision_lambda'] = fit_and_export(learn, out, 'vision_lambda', sample)
    set_seed(1)
    augment = [*aug_transforms(size=32), *aug_transforms(do_flip=False, max_rotate=10), *aug_transforms(max_lighting=0.3, p_lighting=1.),
               Normalize.from_stats(*imagenet_stats)]  # fastai's defaults, the examples' rotation, lighting
    dls = ImageDataLoaders.from_folder(path/'digits', train='train', valid='valid', bs=8, num_workers=0, batch_tfms=augment,
                                       item_tfms=[RandomResizedCrop(32, min_scale=0.5), FlipItem(0.5)])
    made['vision_folders'] = fit_and_export(vision_learner(dls, resnet34, pretrained=False, metrics=accuracy), out, 'vision_folders', sample)
    set_seed(1)  # fastai's examples/distrib.py: a whole xresnet, MixUp, two metrics
    learn = Learner(dls, xresnet18(n_out=10), metrics=[accuracy, top_k_accuracy], cbs=MixUp(0.1))
    made['vision_xresnet'] = fit_and_export(learn, out, 'vision_xresnet', sample)
    set_seed(1)
    dls = SegmentationDataLoaders.from_label_func(path, files, mask_of, codes=['background', 'ink'], bs=4, num_workers=0)
    learn = unet_learner(dls, resnet18, pretrained=False, n_out=2)
    seg = lambda l, x: (l.predict(x)[0], None, l.predict(x)[2])
    made['segmentation'] = fit_and_export(learn, out, 'segmentation', sample, seg)
    made['segmentation']['pred'] = int(learn.predict(sample)[0].sum())
    set_seed(1)
    points = DataBlock(blocks=(ImageBlock, PointBlock), get_y=centre_of, splitter=RandomSplitter(seed=1),
                       item_tfms=Resize(32), batch_tfms=aug_transforms(size=32))
    dls = points.dataloaders(files, bs=8, num_workers=0)
    made['keypoints'] = fit_and_export(vision_learner(dls, resnet18, pretrained=False, y_range=(-1, 1)), out, 'keypoints', sample,
                                       lambda l, x: (l.predict(x)[0].flatten().tolist(), None, l.predict(x)[2]))
    return made, sample

def ordinary_vision(out, path, files):
    "Exports of fastai's other metrics, losses, callbacks, blocks, optimizers and architectures, and of torch's layers, as users make them"
    from fastai.vision.all import (ImageDataLoaders, Resize, vision_learner, resnet18, densenet121, xresnet18, DataBlock, ImageBlock,
                                   MultiCategoryBlock, RegressionBlock, BBoxBlock, BBoxLblBlock, F1Score, Precision, LabelSmoothingCrossEntropyFlat,
                                   FocalLossFlat, GradientAccumulation, SGD, ranger, QHAdam, accuracy_multi, MSELossFlat, DiceLoss, default_split,
                                   ConvLayer, SimpleSelfAttention, SegmentationDataLoaders, unet_learner)
    folder = lambda: ImageDataLoaders.from_folder(path/'digits', train='train', valid='valid', bs=8, num_workers=0, item_tfms=Resize(32))
    block = lambda y, get_y: DataBlock(blocks=(ImageBlock, y), get_y=get_y, item_tfms=Resize(32)).dataloaders(files, bs=8, num_workers=0)
    learners = {
        'metric_f1_precision': lambda: vision_learner(folder(), resnet18, pretrained=False, metrics=[F1Score(average='macro'), Precision(average='macro')]),
        'loss_label_smoothing': lambda: vision_learner(folder(), resnet18, pretrained=False, loss_func=LabelSmoothingCrossEntropyFlat()),
        'loss_focal': lambda: vision_learner(folder(), resnet18, pretrained=False, loss_func=FocalLossFlat()),
        'callback_mixed_precision': lambda: vision_learner(folder(), resnet18, pretrained=False, metrics=accuracy).to_fp16(),
        'callback_gradient_accumulation': lambda: vision_learner(folder(), resnet18, pretrained=False, cbs=GradientAccumulation(16)),
        'arch_densenet': lambda: vision_learner(folder(), densenet121, pretrained=False),
        'arch_xresnet_mish': lambda: Learner(folder(), xresnet18(n_out=10, act_cls=nn.Mish), metrics=accuracy),  # fastai's train_imagenette.py
        'torch_sequential': lambda: Learner(folder(), nn.Sequential(nn.Flatten(), nn.Linear(3*32*32, 10)), metrics=accuracy),
        'opt_sgd': lambda: vision_learner(folder(), resnet18, pretrained=False, opt_func=SGD),
        'opt_ranger': lambda: vision_learner(folder(), resnet18, pretrained=False, opt_func=ranger),
        'opt_qhadam': lambda: vision_learner(folder(), resnet18, pretrained=False, opt_func=QHAdam),
        'block_name_re': lambda: vision_learner(ImageDataLoaders.from_name_re(path, files, r'(\d+)_\d+\.png$', item_tfms=Resize(32), bs=8, num_workers=0),
                                                resnet18, pretrained=False),
        'block_multi_category': lambda: vision_learner(block(MultiCategoryBlock, multi_label), resnet18, pretrained=False,
                                                       metrics=partial(accuracy_multi, thresh=0.5)),
        'block_regression': lambda: vision_learner(block(RegressionBlock, digit_value), resnet18, pretrained=False),
        # torch's weight and spectral normalisation, fastai's self-attention (spectral normalisation's hooks), Dice loss, a splitter, channels-last
        'layer_weight_norm': lambda: Learner(folder(), nn.Sequential(nn.Flatten(), nn.utils.weight_norm(nn.Linear(3*32*32, 10))), metrics=accuracy),
        'layer_spectral_norm': lambda: Learner(folder(), nn.Sequential(nn.Flatten(), nn.utils.spectral_norm(nn.Linear(3*32*32, 10))), metrics=accuracy),
        'layer_simple_self_attention': lambda: Learner(folder(), nn.Sequential(ConvLayer(3, 8), SimpleSelfAttention(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))),
        'arch_xresnet_self_attention': lambda: Learner(folder(), xresnet18(n_out=10, sa=True), metrics=accuracy),
        'loss_dice': lambda: Learner(folder(), nn.Sequential(nn.Flatten(), nn.Linear(3*32*32, 10)), loss_func=DiceLoss()),
        'split_default': lambda: vision_learner(folder(), resnet18, pretrained=False, splitter=default_split),
        'callback_channels_last': lambda: Learner(folder(), nn.Sequential(ConvLayer(3, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))).to_channelslast(),
        'segmentation_self_attention': lambda: unet_learner(SegmentationDataLoaders.from_label_func(path, files, mask_of, codes=['background', 'ink'], bs=4, num_workers=0),
                                                            resnet18, pretrained=False, n_out=2, self_attention=True)}
    seg = lambda l, x: (int(l.predict(x)[0].sum()), None, l.predict(x)[2])
    made = {}
    for name,make in learners.items():
        set_seed(1)
        made[name] = fit_and_export(make(), out, name, str(files[0]), seg if name.startswith('segmentation') else lambda l, x: l.predict(x))
        if name.startswith('segmentation'): made[name]['pred'] = int(made[name]['pred'])
    set_seed(1)  # boxes: no fit (a model of its own for them), the predictions of a test DataLoader
    boxes = DataBlock(blocks=(ImageBlock, BBoxBlock, BBoxLblBlock), get_y=[box_of, box_label], item_tfms=Resize(32), n_inp=1)
    learn = Learner(boxes.dataloaders(files, bs=8, num_workers=0), nn.Sequential(nn.Flatten(), nn.Linear(3*32*32, 4)), loss_func=MSELossFlat())
    learn.export(Path(out).absolute()/'block_bbox.pkl'); learn.dls.save(Path(out).absolute()/'block_bbox_dls.pkl')
    made['block_bbox'] = dict(pred='None', probs=[round(float(p), 4) for p in learn.get_preds(dl=learn.dls.test_dl([files[0]], before_batch=noop))[0].flatten()[:8]])
    return made

def tabular(out, path):
    from sklearn.datasets import load_breast_cancer
    df = load_breast_cancer(as_frame=True).frame
    df['diagnosis'] = df.pop('target').map({0: 'malignant', 1: 'benign'})
    df['size'] = pd.qcut(df['mean radius'], 4, labels=['small', 'medium', 'large', 'very large']).astype(str)
    cont = [c for c in df.columns if c not in ('diagnosis', 'size')][:8]
    set_seed(1)
    dls = TabularDataLoaders.from_df(df, path, procs=[Categorify, FillMissing, Normalize], cat_names=['size'],
                                     cont_names=cont, y_names='diagnosis', valid_idx=list(range(0, len(df), 5)), bs=32)
    learn = tabular_learner(dls, layers=[16, 8], metrics=accuracy, cbs=[CheckpointCallback()])
    made = {'tabular': fit_and_export(learn, out, 'tabular', df.iloc[0], lambda l, x: (l.predict(x)[1], None, l.predict(x)[2]))}
    set_seed(1)  # a regression on the same table
    dls = TabularDataLoaders.from_df(df, path, procs=[Categorify, Normalize], cat_names=['size'], cont_names=cont[1:], y_names=cont[0],
                                     y_block=RegressionBlock(), valid_idx=list(range(0, len(df), 5)), bs=32)
    row = df.iloc[0].drop(cont[0])  # what a user predicts for: the features, not the target
    made['tabular_regression'] = fit_and_export(tabular_learner(dls, layers=[8], metrics=rmse), out, 'tabular_regression', row,
                                                lambda l, x: (l.predict(x)[1], None, l.predict(x)[2]))
    return made, {'tabular': df.iloc[0].to_dict(), 'tabular_regression': row.to_dict()}

USER_MODEL = """import torch
class TinyTabular(torch.nn.Module):
    "A user's model of a table: a linear layer on its continuous columns"
    def __init__(self, n_cont, n_out): super().__init__(); self.lin = torch.nn.Linear(n_cont, n_out)
    def forward(self, x_cat, x_cont): return self.lin(x_cont)
"""

class MainTabular(nn.Module):  # a user's model defined in `__main__` (a notebook's): cloudpickle carries the class by value
    def __init__(self, n_cont, n_out): super().__init__(); self.lin = nn.Linear(n_cont, n_out)
    def forward(self, x_cat, x_cont): return self.lin(x_cont)

def ordinary_tabular(out, path):
    "Exports of a table's classifier and regression with fastai's other metrics, losses, callbacks and optimizers, and with a user's model class of a module and of `__main__`"
    from sklearn.datasets import load_breast_cancer
    df = load_breast_cancer(as_frame=True).frame
    df['diagnosis'] = df.pop('target').map({0: 'malignant', 1: 'benign'})
    cont = [c for c in df.columns if c != 'diagnosis'][:8]
    (Path(out)/'corpus_models.py').write_text(USER_MODEL)  # the user's module, beside the exports: the loader imports it to admit its class
    sys.path.insert(0, str(Path(out).absolute()))
    import corpus_models
    classify = lambda: TabularDataLoaders.from_df(df, path, procs=[Normalize], cont_names=cont, y_names='diagnosis', valid_idx=list(range(0, len(df), 5)), bs=32)
    regress = lambda: TabularDataLoaders.from_df(df, path, procs=[Normalize], cont_names=cont[1:], y_names=cont[0], y_block=RegressionBlock(),
                                                 valid_idx=list(range(0, len(df), 5)), bs=32)
    learners = {
        'tabular_roc_auc': lambda: tabular_learner(classify(), layers=[8], metrics=[RocAucBinary(), F1Score(), Recall()]),
        'tabular_matthews': lambda: tabular_learner(classify(), layers=[8], metrics=[MatthewsCorrCoef(), error_rate, BalancedAccuracy(), CohenKappa()]),
        'tabular_loss_weighted': lambda: tabular_learner(classify(), layers=[8], loss_func=CrossEntropyLossFlat(weight=tensor([1., 2.]))),
        'tabular_loss_focal': lambda: tabular_learner(classify(), layers=[8], loss_func=FocalLossFlat(gamma=1.5)),
        'tabular_callbacks': lambda: tabular_learner(classify(), layers=[8], metrics=accuracy, cbs=[ReduceLROnPlateau(), EarlyStoppingCallback(patience=3),
                                                                                                  SaveModelCallback(), GradientClip()]),
        'tabular_opt_rmsprop': lambda: tabular_learner(classify(), layers=[8], opt_func=RMSProp),
        'tabular_opt_lamb': lambda: tabular_learner(classify(), layers=[8], opt_func=Lamb),
        'tabular_opt_radam': lambda: tabular_learner(classify(), layers=[8], opt_func=RAdam),
        'tabular_opt_adam_wd': lambda: tabular_learner(classify(), layers=[8], opt_func=partial(Adam, wd=0.1)),
        'tabular_opt_sgd_momentum': lambda: tabular_learner(classify(), layers=[8], opt_func=partial(SGD, mom=0.9)),
        'tabular_regression_metrics': lambda: tabular_learner(regress(), layers=[8], loss_func=L1LossFlat(), metrics=[mae, R2Score(), ExplainedVariance()]),
        'tabular_user_module': lambda: TabularLearner(classify(), corpus_models.TinyTabular(len(cont), 2), metrics=accuracy),
        'tabular_user_main': lambda: TabularLearner(classify(), MainTabular(len(cont), 2), metrics=accuracy)}
    made,samples = {},{}
    for name,make in learners.items():
        set_seed(1)
        row = df.iloc[0].drop(cont[0]) if 'regression' in name else df.iloc[0]
        made[name] = fit_and_export(make(), out, name, row, lambda l, x: (l.predict(x)[1], None, l.predict(x)[2]))
        samples[name] = row.to_dict()
    return made,samples

def collab(out, path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(dict(user=rng.integers(0, 20, 400), film=rng.choice([f'film{i}' for i in range(15)], 400),
                           rating=rng.integers(1, 6, 400).astype(float)))
    set_seed(1)
    dls = CollabDataLoaders.from_df(df, user_name='user', item_name='film', rating_name='rating', bs=64, path=path)
    learn = collab_learner(dls, n_factors=8, y_range=(0.5, 5.5))
    sample = df.iloc[:3]
    def predict(l, x):
        p = l.get_preds(dl=l.dls.test_dl(x))[0]
        return (None, None, p)
    made = {'collab': fit_and_export(learn, out, 'collab', sample, predict)}
    set_seed(1)
    made['collab_nn'] = fit_and_export(collab_learner(dls, use_nn=True, layers=[8], y_range=(0.5, 5.5)), out, 'collab_nn', sample, predict)
    set_seed(1)
    made['collab_metrics'] = fit_and_export(collab_learner(dls, n_factors=8, y_range=(0.5, 5.5), metrics=[mae, rmse]), out, 'collab_metrics', sample, predict)
    return made, {k: sample.to_dict('list') for k in made}

def text(out, path):
    from pydoc_data.topics import topics
    rows = [(' '.join(p.split()), 'python docs' if i % 2 else 'other') for i,p in enumerate(
            p for t in list(topics.values())[:40] for p in t.split('\n\n') if 100 <= len(p) <= 400)][:80]
    df = pd.DataFrame(rows, columns=['text', 'label'])
    set_seed(1)
    dls = TextDataLoaders.from_df(df, path, text_col='text', label_col='label', valid_pct=0.2, seed=1, bs=8, num_workers=0)
    learn = text_classifier_learner(dls, AWD_LSTM, config={**awd_lstm_clas_config, 'emb_sz': 16, 'n_hid': 16, 'n_layers': 1},
                                    pretrained=False, metrics=accuracy)
    sample = "The import statement finds a module and binds a name."
    made = {'text': fit_and_export(learn, out, 'text', sample)}
    set_seed(1)  # a language model (fastai's `LMLearner`, its DataLoaders' `ReindexCollection` and `Chunks`)
    lm = TextDataLoaders.from_df(df, path, text_col='text', is_lm=True, valid_pct=0.2, seed=1, bs=8, seq_len=16, num_workers=0)
    learn = language_model_learner(lm, AWD_LSTM, config={**awd_lstm_lm_config, 'emb_sz': 16, 'n_hid': 16, 'n_layers': 1}, pretrained=False, metrics=accuracy)
    made['text_lm'] = fit_and_export(learn, out, 'text_lm', "The import statement", lambda l, x: (set_seed(0), l.predict(x, n_words=3))[1:] + (None, torch.zeros(1)))  # a seeded sample: the loader's is the same
    return made, sample

if __name__ == '__main__':
    out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
    work = out/'data'
    made, samples = {}, {}
    first = sys.argv[2:] == ['--first']  # the first vision variants alone: what `benchmarks/safe_load.py` loads
    if torchvision_imports():
        images,sample = vision(out, work)
        if not first: images.update(ordinary_vision(out, work, digit_files(work/'digits')))
        made.update(images); samples.update({k: sample for k in images})
    for application in () if first else (tabular, ordinary_tabular, collab):
        res,sample = application(out, work)
        made.update(res); samples.update(sample)
    if not first:
        res,sample = text(out, work)
        made.update(res); samples.update({k: sample if k == 'text' else "The import statement" for k in res})
    import fastai, fastcore
    (out/'corpus.json').write_text(json.dumps(dict(fastai=fastai.__version__, fastcore=fastcore.__version__, torch=torch.__version__,
        vision=torchvision_imports(), made=made, samples=samples), indent=1, default=str))
    print(json.dumps({k: v['pred'] for k,v in made.items()}))
