"""What each rank does in the tests of `callback` (test_callback.py): `SafeSaveModelCallback` in a DDP fit where rank 0
is slower and the last epoch is not the best"""
import time
from pathlib import Path
import torch
from fastai.basics import Callback
from ddp_safe_fastai.all import *
from persist_scenarios import _learner

class SlowRank0(Callback):
    "Rank 0 is `delay` s slower at the end of every epoch (before the save)"
    order = SafeSaveModelCallback.order - 1
    def __init__(self, delay): self.delay = delay
    def after_epoch(self):
        if rank_distrib() == 0: time.sleep(self.delay)

class WorseLastEpoch(Callback):
    "Before the last validation, every rank moves the weights away (the same way): the best epoch is an earlier one"
    def before_validate(self):
        if self.epoch == self.n_epoch-1:
            with torch.no_grad():
                for p in self.learn.model.parameters(): p.add_(1.)

def ddp_fit_best(root, delay=0.7, epochs=3):
    "3 epochs in `distrib_ctx` with `SafeSaveModelCallback(with_opt=True)`, rank 0 `delay` s slower each epoch"
    learn = _learner(root)
    cbs = [SafeSaveModelCallback(with_opt=True), SlowRank0(delay), WorseLastEpoch()]
    with learn.distrib_ctx(): learn.fit(epochs, 0.1, cbs=cbs)
    saved = torch.load(Path(root)/'models/model.pth', weights_only=False)['model']
    return dict(weights=learn.model.weight.flatten().tolist(), saved=saved['weight'].flatten().tolist(),
                best_epoch=int(torch.tensor([v[1] for v in learn.recorder.values]).argmin()), epochs=epochs)
