"Issue 12: any order of saves and loads is correct: a fixed, seeded set of random programs on 2 and 3 real ranks"
import random, pytest
import protocol_model as pm

@pytest.mark.parametrize('nproc,n,seed', [(2, 40, 12), (3, 20, 13)])
def test_random_programs(tmp_path, nproc, n, seed):
    rng = random.Random(seed)
    programs = [pm.generate(rng, nproc) for _ in range(n)]
    failed = [(ops, m) for ops,m in zip(programs, pm.check(programs, nproc, tmp_path)) if m]
    if failed:
        ops = pm.shrink(failed[0][0], nproc, tmp_path/'shrink')
        pytest.fail(f"{len(failed)} of {n} programs failed; the first, made minimal:\n{pm.show(ops)}\n"
                    + '\n'.join(pm.check([ops], nproc, tmp_path/'min')[0]))

def test_issue_cases(tmp_path):
    "The cases of the issue: a save inside local_io, then by every rank; a save by rank 0 alone, then by every rank to a full disk"
    progs = [[('save', 'a', 'local', (0, 0)), ('save', 'a', 'all', (0, 0))],
             [('save', 'a', 'main', (0, 0)), ('save_full', 'a', 'all', (0, 0))],
             [('save', 'a', 'main', (0, .1)), ('save_full', 'a', 'all', (0, 0)), ('load', 'a', 'all', (0, 0))],
             [('save', 'a', 'all', (0, 0)), ('other_run', 'a', 'main', (0, 0)), ('reload', 'a', 'all', (0, 0))],
             # found by the stress run: the second other run's file took the inode number our first file had
             [('save', 'a', 'main', (0, 0)), ('other_run', 'a', 'main', (0, 0)), ('other_run', 'a', 'main', (0, 0)),
              ('reload', 'a', 'all', (0, 0))]]
    assert pm.check(progs, 2, tmp_path) == [[]]*len(progs)
