"fastai's notebook flow, as its `distributed_app_examples` notebook runs it: `notebook_launcher` and `distrib_ctx(in_notebook=True)`"
import sys, json
from pathlib import Path
from fastai.basics import *
from fastai.distributed import *
from ddp_safe_fastai.all import *
from ddp_safe_fastai.testing import synth_learner
from accelerate import notebook_launcher

def train(root):
    learn = synth_learner(path=Path(root))
    with learn.distrib_ctx(in_notebook=True):
        learn.fit(2, 0.1)
        learn.save('model')  # every rank saves; rank 0 writes
        backend = torch.distributed.get_backend()  # fastai ends the process group with the context
    res = dict(world=num_distrib(), backend=backend, weights=learn.model.weight.flatten().tolist(),
               files=sorted(p.name for p in (Path(root)/'models').iterdir()))
    Path(root, f"rank{rank_distrib()}.json").write_text(json.dumps(res))

if __name__ == '__main__':
    root,port = sys.argv[1:]
    notebook_launcher(train, (root,), num_processes=2, use_port=port)
