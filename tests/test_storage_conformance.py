"""The commit protocol (nbs/31_storage.ipynb, nbs/32_checkpoint_dir.ipynb) on every backend: the same tests against a
local directory, fsspec's memory file system, OpenStack Swift's S3 API (s3fs), Azure's emulator (adlfs), and the toy
`FolderStore` a user would write (tests/test_storage.py). A new backend passes it by adding one line to `BACKENDS`"""
import json, secrets
import pytest
from ddp_safe_fastai.errors import CheckpointError
from ddp_safe_fastai.checksums import checksum
from ddp_safe_fastai.manifest import FORMAT
from ddp_safe_fastai.storage import LocalStorage, FsspecStorage, S3Storage, AzureStorage, parse_checkpoint_name
from ddp_safe_fastai.checkpoint_dir import Commit, StoredCheckpoints
from conftest import Outage
from test_storage import FolderStore

BACKENDS = {  # name -> the storage of a new, empty place under `tmp_path` (`server`: the fixture of its server, if any)
    'local': lambda tmp_path, server: LocalStorage(tmp_path/'place', durable=False),
    'memory': lambda tmp_path, server: FsspecStorage(f"memory://conformance/{secrets.token_hex(4)}"),
    'folder': lambda tmp_path, server: FolderStore(f"folder://{tmp_path/'place'}"),
    'swift': lambda tmp_path, server: S3Storage(f"s3://{server.bucket()}/run", dict(endpoint_url=server.endpoint, key='test:tester', secret='testing'), retry_for=5),
    'azurite': lambda tmp_path, server: AzureStorage(f"az://{server.bucket()}/run", dict(connection_string=server.connection), retry_for=5),
}

@pytest.fixture(params=list(BACKENDS))
def storage(request, tmp_path):
    "A new, empty place of each backend"
    server = request.getfixturevalue(request.param) if request.param in ('swift', 'azurite') else None
    return BACKENDS[request.param](tmp_path, server)

def files_of(tmp_path, name, run='a', n=3, size=1000):
    "`n` local files of `size` bytes whose bytes say which run and checkpoint they are of"
    d = tmp_path/'files'/run/name
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n): (d/f"part{i}.pth").write_bytes(f"{run}|{name}:{i}:".encode().ljust(size, b'.'))
    return {f"part{i}.pth": d/f"part{i}.pth" for i in range(n)}

def commit(storage, tmp_path, name, run='a', keep=2, keep_best=0, also=(), **info):
    "Commit checkpoint `name` of 3 files of `run` into `storage`, with the manifest (bytes) its local commit would have written"
    files = files_of(tmp_path, name, run)
    m = dict(format=FORMAT, epoch=parse_checkpoint_name(name)[0], **info, files={f: dict(size=p.stat().st_size, crc32=checksum(p)) for f,p in files.items()})
    Commit(storage, keep, keep_best)(name, files, json.dumps(m).encode(), also)

def whole(storage):
    "Every checkpoint with a manifest is whole, and `latest()` names one that is: what the protocol promises at every moment"
    stored = StoredCheckpoints(storage)
    for n,m in stored.checkpoints():
        if m is not None: assert storage.why_incomplete(n, m) is None, (n, storage.why_incomplete(n, m))
    name,m = stored.latest()
    assert name is None or storage.why_incomplete(name, m) is None
    return name

class Cut(Exception): "The process dies here"

def test_a_commit_cut_at_every_write(storage, tmp_path, monkeypatch):
    """A commit cut short before each of its writes in turn (the process killed there): what is kept is always whole,
    the checkpoint before it stays the latest, and the next commit of the same name completes"""
    commit(storage, tmp_path, 'epoch_0001')
    writes,put = 0,storage.put_object
    def cut_short(name, src):
        nonlocal writes
        if writes == cut: raise Cut(name)
        put(name, src); writes += 1
    monkeypatch.setattr(storage, 'put_object', cut_short)
    for cut in range(5):  # before each of: 3 files, the manifest, `latest`
        writes = 0
        with pytest.raises(Cut): commit(storage, tmp_path, 'epoch_0002')
        assert whole(storage) == 'epoch_0001', cut
    monkeypatch.setattr(storage, 'put_object', put)
    commit(storage, tmp_path, 'epoch_0002')
    assert whole(storage) == 'epoch_0002' and storage.names() == ['epoch_0001', 'epoch_0002']

def test_half_written_damaged_and_bare(storage, tmp_path):
    """A checkpoint without a manifest (its write cut short), one with a file of another size, one whose manifest lists
    a file that is not there, one with a byte changed: none is taken; the newest whole one is, even when `latest` names
    another; a read checks the bytes as they come"""
    for n in ('epoch_0001', 'epoch_0002', 'epoch_0003', 'epoch_0004'): commit(storage, tmp_path, n, keep=10)
    stored = StoredCheckpoints(storage)
    storage.delete_object('epoch_0004/manifest.json')  # its write cut short, but `latest` names it
    storage.put_object('epoch_0003/part1.pth', b'short')
    storage.delete_object('epoch_0002/part2.pth')
    assert storage.why_incomplete('epoch_0004', stored.manifest('epoch_0004')) == "no manifest: its write did not finish"
    assert storage.why_incomplete('epoch_0003', stored.manifest('epoch_0003')) == "part1.pth has 5 bytes, the manifest says 1000"
    assert storage.why_incomplete('epoch_0002', stored.manifest('epoch_0002')) == "part2.pth is missing"
    assert stored.named_latest() == 'epoch_0004' and stored.latest()[0] == 'epoch_0001'
    m = stored.manifest('epoch_0001')
    storage.put_object('epoch_0001/part0.pth', b'X' + storage.read('epoch_0001', 'part0.pth')[1:])  # its size kept
    with pytest.raises(CheckpointError, match='part0.pth does not match its checksum'): storage.get(tmp_path/'copy', m['files']['part0.pth'], 'epoch_0001', 'part0.pth')
    if storage.checks_bytes: assert stored.latest() == (None, None)

def test_rotation_keeps_the_newest_and_the_best(storage, tmp_path):
    "Commits keep the newest `keep` and the best by its monitored metric; a checkpoint the run resumed from stays; a stray name is never touched"
    storage.put_object('epoch_x/notes.txt', b'not a checkpoint')
    for e,v in {1: 0.5, 2: 0.1, 3: 0.4, 4: 0.3, 5: 0.6}.items():
        commit(storage, tmp_path, f"epoch_{e:04d}", keep=2, keep_best=1, also={'epoch_0001'}, monitor=dict(name='valid_loss', value=v, mode='min'))
    assert storage.names() == ['epoch_0001', 'epoch_0002', 'epoch_0004', 'epoch_0005']
    assert StoredCheckpoints(storage).best() == ['epoch_0002'] and 'epoch_x' in storage.list_objects('')
    assert whole(storage) == 'epoch_0005'

def test_a_removal_takes_its_own_files_only(storage, tmp_path):
    "Removing a checkpoint leaves one whose name begins with its name (`epoch_0001_iter_000005` beside `epoch_0001`) whole"
    commit(storage, tmp_path, 'epoch_0001', keep=10); commit(storage, tmp_path, 'epoch_0001_iter_000005', keep=10)
    storage.remove('epoch_0001')
    assert storage.names() == ['epoch_0001_iter_000005'] and whole(storage) == 'epoch_0001_iter_000005'

def test_two_runs_in_one_place(storage, tmp_path):
    "Two runs commit to one place in turns (a job started twice): each checkpoint kept is one run's whole, never files of both; `latest` names a whole one"
    commit(storage, tmp_path, 'epoch_0001', 'a'); commit(storage, tmp_path, 'epoch_0002', 'a')
    commit(storage, tmp_path, 'epoch_0001', 'b')  # the second run, started afresh
    for n in storage.names():
        assert len({storage.read(n, f).split(b'|')[0] for f in ('part0.pth', 'part1.pth', 'part2.pth')}) == 1, n
    assert whole(storage) == 'epoch_0001' and storage.read('epoch_0001', 'part0.pth').startswith(b'b|')

def test_single_files_and_the_place(storage, tmp_path):
    "A single file (an export, the best model) written whole and read back; a file that is not there named in the error; the place seen to exist once written"
    (tmp_path/'export.pkl').write_bytes(b'learner')
    storage.put_file(tmp_path/'export.pkl', 'export.pkl')
    storage.get_file('export.pkl', tmp_path/'copy.pkl')
    assert (tmp_path/'copy.pkl').read_bytes() == b'learner' and storage.exists()
    with pytest.raises(CheckpointError, match='none.pkl'): storage.get_file('none.pkl', tmp_path/'none.pkl')
    assert not (tmp_path/'none.pkl').exists()

def test_an_outage_during_a_commit(swift, tmp_path):
    "The store refuses connections in the middle of a commit: the commit fails within its budget of retries, naming the URL; what was kept before is whole and the latest; once the store is back, the next commit completes"
    with Outage(swift.endpoint) as relay:
        storage = S3Storage(f"s3://{swift.bucket()}/run", dict(endpoint_url=relay.endpoint, key='test:tester', secret='testing'), retry_for=3)
        commit(storage, tmp_path, 'epoch_0001')
        put = storage.put_object
        def refused_after_the_first(name, src):
            put(name, src)
            relay.set('refuse')
        storage.put_object = refused_after_the_first
        with pytest.raises(CheckpointError, match=f"{storage.url}/epoch_0002/"): commit(storage, tmp_path, 'epoch_0002')
        storage.put_object = put
        relay.set('up')
        assert whole(storage) == 'epoch_0001'
        commit(storage, tmp_path, 'epoch_0002')
        assert whole(storage) == 'epoch_0002'
