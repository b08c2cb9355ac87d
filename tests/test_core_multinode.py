"""`core` on several nodes (nbs/04_core.ipynb; the nodes simulated by nbs/55_launch.ipynb): two torchrun agents on this
machine, one rank each, each "node" with its own disk mounted at the same path in its own mount namespace; either on
one address (a c10d rendezvous on 127.0.0.1), or as hosts that share neither a disk nor an address (each agent in a
network namespace of its own, with its own address and host name)"""
import shutil, pytest
import core_multinode_scenarios as s, text_scenarios as t
from conftest import values, own_disks, needs_mounts, needs_netns
from ddp_safe_fastai.launch import torchrun_ranks

pytestmark = needs_mounts

@pytest.fixture(params=['one address', pytest.param('hosts apart', marks=[needs_netns, pytest.mark.xdist_group('network namespaces')])])
def nodes(request, tmp_path):
    "Run a scenario on the 2 nodes, with the checkpoint path as first argument; also gives each node's disk"
    if request.param == 'one address': (mnt, disks, prefix),host,gloo = own_disks(tmp_path),'127.0.0.1',{}
    else: mnt, disks, prefix, host, gloo = request.getfixturevalue('hosts_apart')
    def run(f, *args, init=True, env=None, path=mnt):
        res = values(torchrun_ranks(f, str(path), *args, nproc=1, nnodes=2, node_prefix=prefix, init=init, host=host,
                                    timeout=240, env={**gloo, **(env or {})}))
        return {r['node']: r for r in res}
    run.shared = mnt.parent/'shared'  # the same directory on both nodes: not under either node's mount
    run.path,run.launch = mnt,dict(node_prefix=prefix, host=host, timeout=240, env=gloo)
    return run, disks

def _listing(disk, sub): return sorted(p.name for p in (disk/sub).iterdir()) if (disk/sub).exists() else []

def test_one_copy_in_all_or_one_per_node(nodes):
    "`scope='global'`: one copy, on rank 0's node, that node 1 loads through the process group; `scope='node'`: one copy per node, each node reading its own"
    run, disks = nodes
    res = run(s.node_save_load)
    assert res[0]['files'] == ['g.pth', 'n.pth']    # scope='global': one copy, on rank 0's node
    assert res[1]['files'] == ['n.pth']             # scope='node': one copy on every node
    assert sorted(_listing(disks[0], 'models') + _listing(disks[1], 'models')) == ['g.pth', 'n.pth', 'n.pth']
    assert res[0]['g'] == res[1]['g'] == 10.        # node 1 got rank 0's bytes through the process group
    assert {res[0]['n'], res[1]['n']} == {10., 11.}  # each node read its own copy

one_address = pytest.mark.parametrize('nodes', ['one address'], indirect=True)  # the same code on hosts apart: once is enough

@one_address
def test_without_sending_every_rank_names_the_node(nodes):
    "With `DDP_SAFE_BROADCAST_FILES=0`, a global load that node 1 cannot read fails on every rank, naming the rank and node without the file"
    run, _ = nodes
    res = run(s.node_save_load, env={'DDP_SAFE_BROADCAST_FILES': '0'})
    for r in res.values():
        assert 'rank(s) [1] on node(s) [1] do not have the file' in r['g'] and 'g.pth' in r['g']

def test_node_scope_on_a_shared_disk(tmp_path):
    "Both nodes write one file at once, 30 times: no save fails, and one whole file is left"
    res = values(torchrun_ranks(s.node_saves_on_shared_disk, str(tmp_path), nproc=1, nnodes=2, timeout=240))
    assert [r['failures'] for r in res] == [[], []]
    assert [r['files'] for r in res] == [['n.pth'], ['n.pth']]
    assert res[0]['value'] == res[1]['value'] in (0., 1.)

@one_address
@pytest.mark.parametrize('scope', ['global', 'node'])
def test_resume_on_both_nodes(nodes, scope):
    "Stopped after 2 epochs and run again: both nodes resume from epoch 2 with the same weights; checkpoints on rank 0's node alone (`global`) or on each (`node`)"
    run, disks = nodes
    assert all(r['resumed_from'] is None for r in run(s.node_resume, scope, 2, init=False).values())
    res = run(s.node_resume, scope, init=False)
    assert res[0]['resumed_from'] == res[1]['resumed_from'] == 'epoch_0002'
    assert res[0]['weights'] == res[1]['weights']
    full = ['epoch_0002', 'epoch_0003', 'epoch_0004', 'latest']
    assert sorted([_listing(disks[0], 'models/ckpt'), _listing(disks[1], 'models/ckpt')]) == \
           ([[], full] if scope == 'global' else [full, full])

hosts_apart = pytest.mark.parametrize('nodes', [pytest.param('hosts apart', marks=[needs_netns, pytest.mark.xdist_group('network namespaces')])], indirect=True)

@hosts_apart
def test_tokenizer_cache_once_per_node(nodes):
    "Each node's own copy of the texts is tokenized once, on its own disk; both nodes build one vocabulary"
    run, disks = nodes
    for i,d in enumerate(disks): t.make_texts(d/'txt', reverse=bool(i))  # another order on each disk
    for trial in range(2):  # made once per node, then read from each node's cache
        res = run(t.node_text_from_folder)
        assert res[0]['vocab'] == res[1]['vocab']
        assert [res[0]['tokenized'], res[1]['tokenized']] == ([1, 1] if trial == 0 else [0, 0]), res
    assert all((d/'txt_tok'/'counter.pkl').exists() for d in disks)

@hosts_apart
def test_check_dir_sees_the_disks(nodes):
    "`ddp-safe-check dir`: each node's own disk is not shared; a directory both nodes see is"
    run, _ = nodes
    run.shared.mkdir()
    assert run(s.check_here)[0]['shared'] is False
    assert run(s.check_here, path=run.shared)[0]['shared'] is True

@hosts_apart
def test_memory_of_another_node(nodes):
    """Memory checkpoints on hosts that share neither a disk nor memory: each node holds its own copy. Both ranks killed
    mid-epoch, node 0's memory lost (a new machine): the run resumes from node 1's copy, sent to node 0 through the
    process group, and ends with the uninterrupted run's weights"""
    run, disks = nodes
    full = run(s.node_memory, init=False)
    assert full[0]['weights'] == full[1]['weights'] and full[0]['tier'] is None
    for d in disks: shutil.rmtree(d/'models', ignore_errors=True); shutil.rmtree(d/'shm', ignore_errors=True)
    assert torchrun_ranks(s.node_memory, str(run.path), 6, nproc=1, nnodes=2, init=False, **run.launch,
                          kill_when=lambda: all((d/'at0').exists() or (d/'at1').exists() for d in disks)) is None
    mem = [sorted(p.name for p in (d/'shm').rglob('epoch_*')) for d in disks]
    assert mem == [['epoch_0000_iter_000004']]*2, mem  # one copy on each node
    shutil.rmtree(disks[0]/'shm')  # node 0's memory is lost
    res = run(s.node_memory, init=False)
    assert [res[n]['tier'] for n in (0, 1)] == ['memory']*2 and res[0]['resumed_from'] == 'epoch_0000_iter_000004'
    assert res[0]['weights'] == res[1]['weights'] == full[0]['weights']
