"""Model check of the save/load protocol: random programs (saves by every rank, by rank 0 alone, inside `local_io`;
loads by every rank and inside `local_io`; barriers and collectives; a full disk; another run writing the same
file; delays on any rank) on 2 to 4 real gloo ranks under torchrun, every call's outcome on every rank compared with
the reference model in `tests/protocol_model.py`. A failing program is shrunk and printed, ready for `--replay`.
Then `--killed` programs that end with rank 0 killed inside a save, each under `torchrun --max-restarts 1`: the
restarted run must find every file as the model says, and no temporary left once it saves again."""
import sys, time, random, argparse, tempfile, ast
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent.parent/'tests'))
import protocol_model as pm

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--programs', type=int, default=500, help='programs in all, shared among the world sizes')
    p.add_argument('--nproc', type=int, nargs='+', default=[2, 3, 4])
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--batch', type=int, default=50, help='programs per torchrun launch')
    p.add_argument('--killed', type=int, default=40, help='programs ending with a killed writer, shared among the world sizes')
    p.add_argument('--replay', help='a file holding one program, as printed by a failing run')
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        if a.replay:
            ops = ast.literal_eval(Path(a.replay).read_text())
            for n in a.nproc: print(f"{n} ranks:", pm.check_one(ops, n, Path(root)/str(n)) or 'as the model says')
            sys.exit()
        rng, t0, counts, failed = random.Random(a.seed), time.time(), {}, []
        per = a.programs // len(a.nproc)
        for n in a.nproc:
            for b in range(0, per, a.batch):
                progs = [pm.generate(rng, n) for _ in range(min(a.batch, per - b))]
                res = pm.check(progs, n, Path(root)/f"{n}_{b}")
                counts[n] = counts.get(n, 0) + len(progs)
                failed += [(n, ops) for ops,m in zip(progs, res) if m]
                print(f"{n} ranks: {counts[n]} programs, {sum(len(o) for o in progs)} calls in the last batch, "
                      f"{len(failed)} failing so far ({time.time()-t0:.0f}s)", flush=True)
        ops_run = sum(counts.values())
        print(f"\n{ops_run} programs on {a.nproc} ranks (seed {a.seed}): {len(failed)} disagree with the model, "
              f"{time.time()-t0:.0f}s", flush=True)
        t1, killed_failed = time.time(), []
        for n in a.nproc:
            progs = [pm.generate_killed(rng, n) for _ in range(a.killed // len(a.nproc))]
            killed_failed += [(n, ops) for ops,m in zip(progs, pm.check_killed(progs, n, Path(root)/f"killed{n}")) if m]
        print(f"{a.killed // len(a.nproc) * len(a.nproc)} programs ending with a killed writer ({len(pm.KILLS)} ways): "
              f"{len(killed_failed)} disagree with the model, {time.time()-t1:.0f}s")
        for n,ops in (failed + killed_failed)[:1]:
            small = pm.shrink(ops, n, Path(root)/'shrink')
            print(f"smallest failing program ({n} ranks):\n{pm.show(small)}\n" + '\n'.join(pm.check_one(small, n, Path(root)/'min')))
            sys.exit(1)
