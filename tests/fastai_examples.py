"""fastai's own distributed examples, as written but on small data made here (no downloads): the six cells of its
`distributed_app_examples` notebook (`notebook_launcher` with `distrib_ctx(in_notebook=True)`), `distrib.py` and
`train_imagenette.py` with `--fp16` and `train_imdbclassifier.py` (under torchrun). Each is followed by what a user does next with the trained model, on every
rank: save and load it, export it and `load_learner` the export.

    python fastai_examples.py APP ROOT PORT SEED   # one notebook cell: APP in `APPS`"""
import sys, json, time
from pathlib import Path
import numpy as np, pandas as pd
from PIL import Image
from fastai.vision.all import *
from fastai.text.all import *
from fastai.tabular.all import *
from fastai.collab import *
from fastai.distributed import *
from ddp_safe_fastai.all import *
from core_group_lifetime_scenarios import digest, own_weights

def after_training(learn, tag='final'):
    "What a user does next with the trained model, on every rank; a rank's own weights first made unlike the others'"
    mine = own_weights(learn)
    if rank_distrib() == 0: time.sleep(0.5)  # rank 0 late, as a rank that logs or evaluates first is
    learn.save(tag); learn.load(tag)
    loaded = digest(learn.model)
    learn.export(f'{tag}.pkl')
    exported = digest(load_learner(learn.path/f'{tag}.pkl').model)
    return dict(rank=rank_distrib(), world=num_distrib(), mine=mine, loaded=loaded, exported=exported)

def report(root, res):
    Path(root, f"rank{res['rank']}.json").write_text(json.dumps(res))

# the data, made by the test in the notebook's process, as `untar_data` would have given it

def _png(f, shape, seed, mode='RGB', levels=256):
    "Make the image `f` unless it is there: as `untar_data`, made once (a rank that rewrote it could be read half-written)"
    if f.exists(): return
    f.parent.mkdir(parents=True, exist_ok=True)
    a = np.random.default_rng(seed).integers(0, levels, shape, dtype=np.uint8)
    Image.fromarray(a, mode=None if mode == 'RGB' else mode).save(f)

def _text(f, text):
    "Make the text file `f` unless it is there, as `_png` makes images"
    if f.exists(): return
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)

def pets(path, n=20):
    "Image files named by breed, cats' breeds capitalised, as in the Oxford-IIIT Pets archive"
    for i in range(n): _png(path/'images'/f"{'Abyssinian' if i % 2 else 'beagle'}_{i}.png", (24, 24, 3), i)
    return path/'images'

def camvid_tiny(path, n=12):
    "Images, masks named `{stem}_P.png` with values below 4, and `codes.txt`, as in CamVid tiny"
    for i in range(n):
        _png(path/'images'/f"f{i}.png", (32, 32, 3), i)
        _png(path/'labels'/f"f{i}_P.png", (32, 32), 100+i, mode='L', levels=4)
    _text(path/'codes.txt', 'Sky\nRoad\nCar\nVoid\n')
    return path

_words = 'the film was good bad great awful plot actor scene long short fun dull story end'.split()

def imdb_sample(path, n=48):
    "A `texts.csv` of labelled reviews with an `is_valid` column, as in IMDB_SAMPLE"
    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    texts = [' '.join(rng.choice(_words, 12)) for _ in range(n)]
    pd.DataFrame(dict(label=['positive' if 'good' in t else 'negative' for t in texts], text=texts,
                      is_valid=[i % 4 == 0 for i in range(n)])).to_csv(path/'texts.csv', index=False)
    return path

def adult_sample(path, n=200):
    "An `adult.csv` with the columns the notebook names, as in ADULT_SAMPLE"
    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    cats = dict(workclass=['Private', 'State-gov'], education=['HS-grad', 'Masters'], **{'marital-status': ['Married', 'Single']},
                occupation=['Sales', 'Tech', None], relationship=['Husband', 'Wife'], race=['White', 'Black'])
    df = pd.DataFrame({k: rng.choice(np.array(v, dtype=object), n) for k,v in cats.items()})
    df['age'],df['fnlwgt'],df['education-num'] = rng.integers(18, 80, n),rng.integers(10**4, 10**6, n),rng.integers(1, 16, n)
    df['salary'] = np.where(df['age'] > 40, '>=50k', '<50k')
    df.to_csv(path/'adult.csv', index=False)
    return path

def ml_sample(path, n=300):
    "A `ratings.csv` of users, movies and ratings, as in ML_SAMPLE"
    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(dict(userId=rng.integers(0, 30, n), movieId=rng.integers(0, 20, n), rating=rng.integers(1, 6, n).astype(float),
                      timestamp=rng.integers(10**9, 2*10**9, n))).to_csv(path/'ratings.csv', index=False)
    return path

def biwi(path, n=12):
    "Frames `NN/frame_XXXXX_rgb.jpg` with their `..._pose.txt`, and `01/rgb.cal`, as in BIWI head pose"
    rng = np.random.default_rng(0)
    for i in range(n):
        d = path/('13' if i % 4 == 0 else '01')
        _png(d/f"frame_{i:05d}_rgb.jpg", (24, 32, 3), i)
        _text(d/f"frame_{i:05d}_pose.txt", '1 0 0\n0 1 0\n0 0 1\n\n' + ' '.join(map(str, rng.uniform(-50, 50, 2))) + ' 1000\n')
    _text(path/'01'/'rgb.cal', '500 0 16\n0 500 12\n0 0 1\n\n0 0 0\n\n1 0 0\n0 1 0\n0 0 1\n\n0 0 0\n\n32 24\n')
    return path

# the notebook's cells: its `train` functions, on that data, with ImageNet weights left out (no download) and small
# images; fp16 off (CPU)

def is_cat(x): return x[0].isupper()  # the notebook's lambda, named: `export` pickles the label function

def image_classification(path, root):
    dls = ImageDataLoaders.from_name_func(path, get_image_files(path), valid_pct=0.2, label_func=is_cat,
                                          item_tfms=Resize(24), bs=4, num_workers=0)
    learn = vision_learner(dls, resnet34, metrics=error_rate, pretrained=False, path=root)
    with learn.distrib_ctx(in_notebook=True, sync_bn=False):
        learn.fine_tune(1)
    return learn

def segmentation(path, root):
    dls = SegmentationDataLoaders.from_label_func(path, bs=4, fnames=get_image_files(path/"images"),
                                                  label_func=lambda o: path/'labels'/f'{o.stem}_P{o.suffix}',
                                                  codes=np.loadtxt(path/'codes.txt', dtype=str), num_workers=0)
    learn = unet_learner(dls, resnet34, pretrained=False, path=root)
    with learn.distrib_ctx(in_notebook=True, sync_bn=False):
        learn.fine_tune(1)
    learn.dls = learn.dls.new_empty()  # the label function is a lambda, as in the notebook: `export` cannot pickle it
    return learn

def text_classification(path, root):
    df = pd.read_csv(path/'texts.csv')
    imdb_clas = DataBlock(blocks=(TextBlock.from_df('text', seq_len=72), CategoryBlock),
                          get_x=ColReader('text'), get_y=ColReader('label'), splitter=ColSplitter())
    dls = imdb_clas.dataloaders(df, bs=8, num_workers=0)
    learn = rank0_first(lambda: text_classifier_learner(dls, AWD_LSTM, drop_mult=0.5, metrics=accuracy, pretrained=False, path=root))
    with learn.distrib_ctx(in_notebook=True):
        learn.fine_tune(1, 1e-2)
    return learn

def tabular(path, root):
    dls = TabularDataLoaders.from_csv(path/'adult.csv', path=root, y_names="salary",
            cat_names=['workclass', 'education', 'marital-status', 'occupation', 'relationship', 'race'],
            cont_names=['age', 'fnlwgt', 'education-num'], procs=[Categorify, FillMissing, Normalize], bs=32, num_workers=0)
    learn = tabular_learner(dls, metrics=accuracy)
    with learn.distrib_ctx(in_notebook=True):
        learn.fit_one_cycle(2)
    return learn

def collab(path, root):
    df = pd.read_csv(path/'ratings.csv')
    dls = CollabDataLoaders.from_df(df, bs=32, path=root, num_workers=0)
    learn = collab_learner(dls, y_range=(0.5,5.5))
    with learn.distrib_ctx(in_notebook=True):
        learn.fine_tune(2)
    return learn

def keypoints(path, root):
    cal = np.genfromtxt(path/'01'/'rgb.cal', skip_footer=6)
    def get_ctr(f):
        ctr = np.genfromtxt(Path(f'{str(f)[:-7]}pose.txt'), skip_header=3)
        return tensor([ctr[0] * cal[0][0]/ctr[2] + cal[0][2], ctr[1] * cal[1][1]/ctr[2] + cal[1][2]])
    biwi_block = DataBlock(blocks=(ImageBlock, PointBlock), get_items=get_image_files, get_y=get_ctr,
                           splitter=FuncSplitter(lambda o: o.parent.name=='13'),
                           batch_tfms=[*aug_transforms(size=(24,32)), Normalize.from_stats(*imagenet_stats)])
    dls = biwi_block.dataloaders(path, bs=4, num_workers=0)
    learn = vision_learner(dls, resnet18, y_range=(-1,1), pretrained=False, path=root)
    with learn.distrib_ctx(in_notebook=True, sync_bn=False):
        learn.fine_tune(1)
    learn.dls = learn.dls.new_empty()  # `get_ctr` is a closure, as in the notebook: `export` cannot pickle it
    return learn

# fastai's scripts for torchrun, `nbs/examples/distrib.py`, `train_imagenette.py` and `train_imdbclassifier.py`: `untar_data` makes the data here

def imagewoof(path, n=12):
    "Image folders `train/CLASS` and `val/CLASS`, as in Imagewoof"
    for i in range(n): _png(path/('val' if i % 4 == 0 else 'train')/f"n0{i % 2}"/f"{i}.png", (24, 24, 3), i)
    return path

def imdb(path, n=24):
    "Review files `train/pos`, `train/neg`, `test/pos`, `test/neg`, as in IMDB"
    rng = np.random.default_rng(0)
    for i in range(n):
        f = path/('test' if i % 4 == 0 else 'train')/('pos' if i % 2 else 'neg')/f"{i}.txt"
        _text(f, ' '.join(rng.choice(_words, 12)))
    return path

def distrib_py(root):
    "`distrib.py`: Imagewoof, `xresnet50`, MixUp, `fit_flat_cos` (fp16 off: CPU); then what a user does next"
    path = rank0_first(imagewoof, Path(root)/'imagewoof')
    dls = DataBlock(blocks=(ImageBlock, CategoryBlock), splitter=GrandparentSplitter(valid_name='val'),
                    get_items=get_image_files, get_y=parent_label, item_tfms=[RandomResizedCrop(16), FlipItem(0.5)],
                    batch_tfms=Normalize.from_stats(*imagenet_stats)).dataloaders(path, path=path, bs=4, num_workers=0)
    learn = Learner(dls, xresnet50(n_out=10), metrics=[accuracy,top_k_accuracy])
    with learn.distrib_ctx(): learn.fit_flat_cos(1, 1e-3, cbs=MixUp(0.1))
    return after_training(learn)

def train_imagenette_py(root):
    "`train_imagenette.py` with `--fp16`: Imagenette folders, `xresnet50` with `act_cls=nn.Mish`, `ranger`, label smoothing, `to_fp16()`, `fit_flat_cos` (on CPU, autocast does nothing); then the same"
    path = rank0_first(imagewoof, Path(root)/'imagenette')
    dls = DataBlock(blocks=(ImageBlock, CategoryBlock), splitter=GrandparentSplitter(valid_name='val'),
                    get_items=get_image_files, get_y=parent_label, item_tfms=[RandomResizedCrop(32, min_scale=0.35), FlipItem(0.5)],
                    batch_tfms=Normalize.from_stats(*imagenet_stats)).dataloaders(path, path=path, bs=4, num_workers=0)
    learn = Learner(dls, xresnet50(n_out=10, act_cls=nn.Mish, sa=False, sym=False, pool=MaxPool), opt_func=ranger,
                    metrics=[accuracy, top_k_accuracy], loss_func=LabelSmoothingCrossEntropy()).to_fp16()
    with learn.distrib_ctx(): learn.fit_flat_cos(1, 1e-3, wd=1e-2)
    return after_training(learn)

def train_imdbclassifier(root):
    "`train_imdbclassifier.py`: IMDB folders, AWD_LSTM (no pretrained weights: no download), `fine_tune`; then the same"
    path = rank0_first(lambda: imdb(Path(root)/'imdb'))
    dls = TextDataLoaders.from_folder(path, bs=4, valid='test', num_workers=0)
    learn = rank0_first(lambda: text_classifier_learner(dls, AWD_LSTM, drop_mult=0.5, metrics=accuracy, pretrained=False))
    with learn.distrib_ctx(): learn.fine_tune(1, 1e-2)
    return after_training(learn)

APPS = {'image_classification': (image_classification, pets), 'segmentation': (segmentation, camvid_tiny),
        'text_classification': (text_classification, imdb_sample), 'tabular': (tabular, adult_sample),
        'collab': (collab, ml_sample), 'keypoints': (keypoints, biwi)}

def train(app, path, root, seed):
    "One cell's `train`, then what a user does next, on every rank"
    set_seed(seed)
    learn = APPS[app][0](path, Path(root))
    report(root, after_training(learn))

if __name__ == '__main__':
    from accelerate import notebook_launcher
    app,root,port,seed = sys.argv[1:]
    path = APPS[app][1](Path(root)/'data')  # the notebook's `untar_data`
    notebook_launcher(train, (app, path, root, int(seed)), num_processes=2, use_port=port)
