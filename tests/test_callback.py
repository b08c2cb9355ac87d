"""`callback` (nbs/47_callback.ipynb): `SafeSaveModelCallback` in a DDP fit where rank 0 is slower and the last epoch is
not the best: every rank ends with the best model saved"""
import callback_scenarios as s
from conftest import values

def test_safe_save_model_callback_end_to_end(launch, tmp_path):
    "3 epochs in `distrib_ctx`, rank 0 0.7 s slower each epoch, the last epoch worse: every rank ends with the saved best"
    res = values(launch(s.ddp_fit_best, str(tmp_path), init=False, timeout=240))
    assert res[0]['best_epoch'] < res[0]['epochs'] - 1  # the reload at the end of the fit changes the weights
    assert res[0]['weights'] == res[1]['weights'] == res[0]['saved'] == res[1]['saved']
