"""`persist` (nbs/14_persist.ipynb), the protocol: any order of saves and loads is correct: a fixed, seeded set of
random programs on 2 and 3 real ranks"""
import sys, random, pytest
import protocol_model as pm
from ddp_safe_fastai.launch import torchrun_ranks, free_port, RanksStalled

@pytest.mark.parametrize('nproc,n,seed', [(2, 40, 12), (3, 20, 13)])
def test_random_programs(tmp_path, nproc, n, seed):
    "Seeded random programs of saves and loads on 2 and 3 ranks all end as the reference model says; a failing one is shrunk and shown"
    rng = random.Random(seed)
    programs = [pm.generate(rng, nproc) for _ in range(n)]
    failed = [(ops, m) for ops,m in zip(programs, pm.check(programs, nproc, tmp_path)) if m]
    if failed:
        ops = pm.shrink(failed[0][0], nproc, tmp_path/'shrink')
        pytest.fail(f"{len(failed)} of {n} programs failed; the first, made minimal:\n{pm.show(ops)}\n"
                    + '\n'.join(pm.check_one(ops, nproc, tmp_path/'min')))

def test_killed_writer(tmp_path):
    "Rank 0 killed inside a save, half-way through the file or once it is in place, after a random program; torchrun restarts the run"
    rng = random.Random(14)
    programs = [pm.generate_killed(rng, 2, pm.KILLS[i]) for i in (0, 3, 5, 6)]  # each way to die, each caller, both files
    failed = [(ops, m) for ops,m in zip(programs, pm.check_killed(programs, 2, tmp_path)) if m]
    if failed:
        ops = pm.shrink(failed[0][0], 2, tmp_path/'shrink')
        pytest.fail(f"{len(failed)} of {len(programs)} programs failed; the first, made minimal:\n{pm.show(ops)}\n"
                    + '\n'.join(pm.check_one(ops, 2, tmp_path/'min')))

@pytest.mark.parametrize('kill', ['kill_writing', 'kill_placed'])
def test_killed_writer_holding_the_store(tmp_path, kill):
    "Ranks started one by one (as a scheduler does): the store lives in rank 0's process, and dies with it inside a save"
    ranks = 'for r in 0 1 2; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d "$0" "$@" & done; wait'
    with pytest.raises(RanksStalled, match=r"rank\(s\) \[0\] exited without a result"):
        torchrun_ranks(pm.save_while_writer_dies, str(tmp_path), kill, nproc=3, timeout=240,
                       launcher=['bash', '-c', ranks % free_port(), sys.executable], env={'DDP_SAFE_TIMEOUT': '30'})
    for r in (1, 2):
        secs, got = (tmp_path/f"rank{r}.txt").read_text().split('\n', 1)
        assert got.startswith(f"StoreUnreachableError: save {tmp_path}/models/a.pth: the process group's store, in rank 0's process, "
                              f"cannot be reached"), got
        assert got.endswith(f"that process ended or was killed; raised on rank {r}"), got
        assert float(secs) < 10, f"rank {r} learnt of the store's death within 10 s of its save: {secs} s"

def test_issue_cases(tmp_path):
    "Programs written by hand: a save inside local_io, then by every rank; a save by rank 0 alone, then by every rank to a full disk"
    progs = [[('save', 'a', 'local', (0, 0)), ('save', 'a', 'all', (0, 0))],
             [('save', 'a', 'main', (0, 0)), ('save_full', 'a', 'all', (0, 0))],
             [('save', 'a', 'main', (0, .1)), ('save_full', 'a', 'all', (0, 0)), ('load', 'a', 'all', (0, 0))],
             [('save', 'a', 'all', (0, 0)), ('other_run', 'a', 'main', (0, 0)), ('reload', 'a', 'all', (0, 0))],
             # found by the stress run: the second other run's file took the inode number our first file had
             [('save', 'a', 'main', (0, 0)), ('other_run', 'a', 'main', (0, 0)), ('other_run', 'a', 'main', (0, 0)),
              ('reload', 'a', 'all', (0, 0))]]
    assert pm.check(progs, 2, tmp_path) == [[]]*len(progs)
