"""The end of every example: what each rank holds, compared across ranks, printed by rank 0 and kept in `report.json`"""
import json, hashlib
from pathlib import Path
import torch
from ddp_safe_fastai.all import exchange, rank_distrib, num_distrib, load_state

def digest(state):
    "sha256 of a state dict's tensors, in key order"
    h = hashlib.sha256()
    for k,v in state.items():
        h.update(k.encode()); h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]

def files_under(path, skip=()):
    "Every file under `path`, relative, but those whose suffix is in `skip` (the data)"
    return sorted(str(p.relative_to(path)) for p in Path(path).rglob('*') if p.is_file() and p.suffix not in skip)

def report(learn, path, app, prediction, extra=None, skip=()):
    "Compare the ranks' weights, the best file and the predictions; rank 0 prints and writes `path/report.json`"
    path = Path(path)
    best = digest(load_state(path/'models/model.pth', 'cpu'))
    mine = dict(weights=digest(learn.model.state_dict()), prediction=str(prediction), **(extra or {}))
    ranks = exchange(mine, f'{app} report')
    files = files_under(path, skip)
    res = dict(app=app, world=num_distrib(), ranks=ranks, best=best, files=files,
               identical_weights=all(r['weights'] == ranks[0]['weights'] for r in ranks),
               weights_are_best=all(r['weights'] == best for r in ranks),
               same_prediction=all(r['prediction'] == ranks[0]['prediction'] for r in ranks),
               temporaries=[f for f in files if f.endswith('.tmp')])
    for r,o in enumerate(ranks): print(f"[rank {r}] weights {o['weights']} prediction {o['prediction']}", flush=True) if rank_distrib() == 0 else None
    if rank_distrib() == 0:
        print(json.dumps({k:v for k,v in res.items() if k != 'ranks'}, indent=1), flush=True)
        (path/'report.json').write_text(json.dumps(res, indent=1))
    return res
