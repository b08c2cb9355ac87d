"""Vision under DDP: `ImageDataLoaders.from_folder`, `vision_learner(resnet18)`, `fine_tune`, on every rank.

    torchrun --nproc_per_node 2 examples/vision.py [PATH]
    accelerate launch --multi_gpu --num_processes 2 examples/vision.py [PATH]

The images are scikit-learn's bundled handwritten digits, written once as PNG files into an image folder.
Killed and started again with the same command, the run resumes from its latest checkpoint."""
import sys, tempfile
from pathlib import Path
import numpy as np
from PIL import Image
from fastai.vision.all import *
from ddp_safe_fastai.all import *
from report import report

def digits_folder(path):
    "scikit-learn's 8x8 digits as `path/{train,valid}/LABEL/N.png` (one in five for validation)"
    from sklearn.datasets import load_digits
    d = load_digits()
    for i,(img,y) in enumerate(zip(d.images, d.target)):
        f = path/('valid' if i % 5 == 0 else 'train')/str(y)/f'{i}.png'
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img*255/16).astype(np.uint8)).save(f)
    return path

def digits_learner(path):
    "The digits as an image folder under `path` (written once, by rank 0), and a resnet18 `Learner` on them"
    with main_process_first():  # rank 0 writes the images once; the others wait, then read them
        if rank_distrib() == 0 and not (path/'digits').exists(): digits_folder(path/'digits')
    set_seed(42)  # the same initial weights on every rank (DDP also sends rank 0's)
    dls = ImageDataLoaders.from_folder(path/'digits', train='train', valid='valid', item_tfms=Resize(32),
                                       batch_tfms=aug_transforms(size=32, do_flip=False, max_rotate=10), bs=64, num_workers=0)
    return vision_learner(dls, resnet18, pretrained=False, metrics=accuracy, path=path)

if __name__ == '__main__':
    path = Path(sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.gettempdir())/'ddp_safe_vision')
    learn = digits_learner(path)
    with learn.distrib_ctx():
        learn.fine_tune(4, 1e-2, cbs=[SafeSaveModelCallback(monitor='accuracy'), CheckpointCallback()])

    learn.export()                                    # rank 0 writes export.pkl; every rank waits for it
    inf = load_learner(path/'export.pkl')             # every rank reads the whole file
    pred = inf.predict(get_image_files(path/'digits/valid/3')[0])[0]  # a 3 the model has not trained on
    learn.dls.save()                                  # dls.path/'dls.pkl', after training as before it
    dls2 = load_dataloaders(learn.dls.path)
    report(learn, path, 'vision', pred, dict(dls_items=len(dls2.valid_ds)), skip=('.png',))
