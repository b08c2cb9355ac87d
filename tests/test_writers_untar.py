"""`writers` (nbs/44_writers.ipynb), `untar_data`: fastai's `untar_data` called by every rank at once (fastdownload
holds a file lock on `<archive>.lock` around "extracted? else download and extract"): one download, one whole tree,
the same path on every rank"""
import random, tarfile, importlib, pytest
from pathlib import Path
import fastai.data
import writers_untar_scenarios as s
from conftest import values, ranks
from ddp_safe_fastai.launch import torchrun_ranks, spawn_ranks

@pytest.fixture(scope='module')
def archive(tmp_path_factory):
    "A local `files.tgz` (200 small files and one of 5 MB) served by a `file://` URL, and the tree it holds"
    root = tmp_path_factory.mktemp('src')
    src, rnd = root/'files', random.Random(0)
    (src/'small').mkdir(parents=True)
    for i in range(200): (src/'small'/f'{i:03d}.txt').write_text(f"file {i} " * rnd.randint(1, 50))
    (src/'big.bin').write_bytes(rnd.randbytes(5_000_000))
    with tarfile.open(root/'files.tgz', 'w:gz') as t: t.add(src, arcname='files')
    return (root/'files.tgz').as_uri(), s.tree_digest(src)

@pytest.fixture(autouse=True)
def checks_file_untouched():
    "fastdownload only reads fastai's `download_checks.py` (in site-packages) for a URL it has no entry for"
    f = Path(fastai.data.__file__).parent/'download_checks.py'
    before = f.stat().st_mtime_ns, f.read_bytes()
    yield
    assert (f.stat().st_mtime_ns, f.read_bytes()) == before

def check(res, archive, tmp_path, root):
    "Every rank got `root/data/files` holding the archive's tree, one rank downloaded, and no partial file is left"
    assert {r['path'] for r in res} == {str(root/'data'/'files')}
    assert all(r['digest'] == archive[1] for r in res)
    assert sum(r['downloads'] for r in res) == 1
    assert sorted(p.name for p in (root/'archive').iterdir()) == ['files.tgz', 'files.tgz.lock']
    assert [p for p in (tmp_path/'tmp').iterdir() if not p.name.startswith('torchelastic_')] == []  # torchrun's logs

def _dirs(tmp_path): return [str(tmp_path/d) for d in ('base', 'archive', 'data')]

def _env(tmp_path):
    "A FASTAI_HOME that does not exist yet, and a temporary folder inside `tmp_path` for the extraction"
    (tmp_path/'tmp').mkdir()
    return {'FASTAI_HOME': str(tmp_path/'fastai_home'), 'TMPDIR': str(tmp_path/'tmp')}

def test_torchrun(archive, tmp_path):
    "`untar_data` on 2 ranks under torchrun"
    res = values(ranks(s.untar_on_every_rank, archive[0], *_dirs(tmp_path), nproc=2, timeout=180, env=_env(tmp_path)))
    check(res, archive, tmp_path, tmp_path)

def test_two_nodes_sharing_a_disk(archive, tmp_path):
    "`untar_data` on two torchrun agents (nodes) sharing a disk"
    res = values(torchrun_ranks(s.untar_on_every_rank, archive[0], *_dirs(tmp_path), nproc=1, nnodes=2, timeout=180,
                                env=_env(tmp_path)))
    check(res, archive, tmp_path, tmp_path)

def test_spawn(archive, tmp_path):
    "`untar_data` on 2 ranks under `mp.spawn`"
    res = values(spawn_ranks(s.untar_on_every_rank, archive[0], *_dirs(tmp_path), nproc=2, timeout=180, env=_env(tmp_path)))
    check(res, archive, tmp_path, tmp_path)

def test_fastai_home_made_by_every_rank(archive, tmp_path):
    "No `base`, `archive` or `data`: every rank makes fastai's FASTAI_HOME and its `config.ini` at once"
    home = tmp_path/'fastai_home'
    res = values(ranks(s.untar_on_every_rank, archive[0], nproc=2, timeout=180, env=_env(tmp_path)))
    check(res, archive, tmp_path, home)
    assert (home/'config.ini').read_text() == "[DEFAULT]\ndata = data\narchive = archive\nstorage = tmp\nmodel = models\n\n"

def test_forced_download_on_every_rank(archive, tmp_path):
    "`force_download=True` on every rank: rank 0 downloads again, the others take its copy (no tree removed under them)"
    env = _env(tmp_path)
    values(ranks(s.untar_on_every_rank, archive[0], *_dirs(tmp_path), nproc=2, timeout=180, env=env))
    res = values(ranks(s.untar_on_every_rank, archive[0], *_dirs(tmp_path), True, nproc=2, timeout=180, env=env))
    check(res, archive, tmp_path, tmp_path)

def _read_config(home, barrier, q):
    "In a fresh process: wait for the others, then read fastai's config (made by whoever comes first)"
    import os
    os.environ['FASTAI_HOME'] = home
    from fastai.data.external import fastai_cfg
    barrier.wait()
    q.put(fastai_cfg().path('archive') is not None)

def test_config_made_by_many_processes_at_once(tmp_path):
    "8 processes read fastai's config on a new FASTAI_HOME at once, 25 times: none finds it half-written"
    import multiprocessing as mp
    importlib.import_module('ddp_safe_fastai.all')
    ctx, seen = mp.get_context('fork'), []
    for trial in range(25):
        barrier, q = ctx.Barrier(8), ctx.Queue()
        ps = [ctx.Process(target=_read_config, args=(str(tmp_path/str(trial)), barrier, q)) for _ in range(8)]
        for p in ps: p.start()
        seen += [q.get(timeout=60) for _ in ps]
        for p in ps: p.join(60)
    assert all(seen), f"{seen.count(False)} of {len(seen)} reads found a config without paths"
