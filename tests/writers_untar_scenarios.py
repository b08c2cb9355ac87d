"""What each rank does in the tests of `writers`' `untar_data` (test_writers_untar.py): every rank calls fastai's
`untar_data` at the same moment"""
import hashlib
from pathlib import Path
import torch.distributed as dist
import fastdownload.core
from fastai.data.external import untar_data
from ddp_safe_fastai.all import *

def tree_digest(path):
    "Sorted relative paths of the files under `path`, each with the sha256 of its bytes"
    files = sorted(p for p in Path(path).rglob('*') if p.is_file())
    return [(str(p.relative_to(path)), hashlib.sha256(p.read_bytes()).hexdigest()) for p in files]

def untar_on_every_rank(url, base=None, archive=None, data=None, force=False):
    "All ranks meet, then call `untar_data` at once; returns the rank, the path, its `tree_digest` and the downloads"
    calls, download_url = [], fastdownload.core.download_url
    def counted(*args, **kwargs):
        calls.append(args[0])
        return download_url(*args, **kwargs)
    fastdownload.core.download_url = counted  # what `download_and_check` calls: one call is one download
    dist.barrier()
    path = untar_data(url, archive=archive, data=data, base=base, force_download=force)
    return dict(rank=rank_distrib(), path=str(path), digest=tree_digest(path), downloads=len(calls))
