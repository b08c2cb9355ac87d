"""`storage` and `locations` (nbs/31_storage.ipynb, nbs/05a_locations.ipynb), a storage a user makes: one class and one
registration, handed to both callbacks and `Learner.export` (`storage=`) or named by its URL, on 2 ranks under
torchrun: a run killed after its second epoch, its disk wiped, resumes from that storage; the export holds no storage
and finds it again where it loads. The class here keeps files as an object store does, in a local folder"""
import os, shutil, pytest
from pathlib import Path
import torch
from ddp_safe_fastai.all import *
from ddp_safe_fastai.storage import CheckpointStorage
from ddp_safe_fastai.locations import register_storage
from ddp_safe_fastai.testing import synth_learner
from conftest import values, ranks
from test_object_store import KillAfter  # once epoch `epoch` is checkpointed and sent, and the best model too

class FolderStore(CheckpointStorage):
    "A local folder that behaves like an object store (`folder:///path`): each object written whole, nothing renamed but the object itself"
    def __init__(self, url): self.where,self.root = url,Path(url[len('folder://'):])
    def list_objects(self, prefix):
        d = self.root/prefix
        return sorted(p.name for p in d.iterdir() if not p.name.endswith('.part')) if d.is_dir() else []
    def get_object(self, name): return open(self.root/name, 'rb')
    def put_object(self, name, src):
        dst = self.root/name
        dst.parent.mkdir(parents=True, exist_ok=True)
        part = dst.with_name(dst.name + '.part')
        if isinstance(src, bytes): part.write_bytes(src)
        else: shutil.copyfile(src, part)
        os.replace(part, dst)  # whole, or not at all
    def delete_object(self, name):
        if (self.root/name).is_dir(): shutil.rmtree(self.root/name)
        else: (self.root/name).unlink(missing_ok=True)
    def object_size(self, name): return (self.root/name).stat().st_size if (self.root/name).is_file() else None

register_storage('folder', FolderStore)  # in every process that imports this module: the ranks and the test

def fit_into(root, url, kill_after=None, handed=True):
    """4 epochs with both callbacks of the Learner keeping their files in the folder store at `url` (the storage handed
    in, or its URL named), killed after epoch `kill_after` if given; then the Learner exported there: the weights, where
    the fit resumed from"""
    cbs = ([CheckpointCallback(storage=FolderStore(url)), SafeSaveModelCallback(fname='best', storage=FolderStore(url))] if handed else
           [CheckpointCallback(url), SafeSaveModelCallback(fname=f"{url}/best")])
    learn = synth_learner(n=128, path=Path(root), seed=5, cbs=cbs)
    kill = [KillAfter(kill_after, Path(root)/'killed')] if kill_after is not None else []
    with learn.distrib_ctx(): learn.fit(4, 0.02, cbs=kill)
    learn.export('export.pkl', storage=FolderStore(url))
    return dict(weights=[p.detach().clone() for p in learn.model.parameters()], resumed=(cbs[0].resumed_from, cbs[0].resumed_tier))

def test_a_storage_of_your_own(tmp_path):
    """A storage class of the user's, handed in: checkpoints, the best model and the export are kept there; a run killed
    after its second epoch, its local disk wiped, resumes from there (named by its URL this time) to the weights of the
    run never killed; the export holds no storage object, and its callbacks find the storage again by its location"""
    url = f"folder://{tmp_path/'store'/'run1'}"
    whole = values(ranks(fit_into, str(tmp_path/'whole'), f"folder://{tmp_path/'whole_store'}", init=False, timeout=240))
    assert ranks(fit_into, str(tmp_path/'a'), url, 1, init=False, timeout=240, kill_when=(tmp_path/'a'/'killed').exists) is None
    store = tmp_path/'store'/'run1'
    assert sorted(p.name for p in store.iterdir()) == ['best.pth', 'epoch_0001', 'epoch_0002', 'latest'], sorted(store.iterdir())
    assert (store/'latest').read_text() == 'epoch_0002'
    shutil.rmtree(tmp_path/'a')  # the machine is gone; a new one has an empty disk
    r0,r1 = values(ranks(fit_into, str(tmp_path/'a'), url, None, False, init=False, timeout=240))
    assert r0['resumed'] == r1['resumed'] == ('epoch_0002', 'bucket'), (r0['resumed'], r1['resumed'])
    for w,v in zip(r0['weights'], whole[0]['weights']): assert torch.equal(w, v)  # bit for bit the run never killed
    assert (store/'latest').read_text() == 'epoch_0004' and (store/'export.pkl').is_file()
    exported = tmp_path/'whole_store'/'export.pkl'  # the run whose callbacks were handed the storage
    assert b'test_storage' not in exported.read_bytes()  # no object of this module, the storage among them, is in the export
    with pytest.raises(UnsafeExportError, match=r"places=\['folder://"): load_learner(exported)  # a place outside its folder: named by the loading call, or refused
    learn = load_learner(exported, places=[f"folder://{tmp_path/'whole_store'}"])
    assert (learn.checkpoint.where, learn.checkpoint.not_saved) == (f"folder://{tmp_path/'whole_store'}", 'storage (FolderStore) is')
    assert type(learn.checkpoint.storage) is FolderStore and learn.safe_save_model.storage.where == learn.checkpoint.where  # made again from there
