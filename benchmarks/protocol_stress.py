"""Model check of the save/load protocol: random programs (saves by every rank, by rank 0 alone, inside `local_io`;
loads by every rank and inside `local_io`; barriers and collectives; a full disk; another run writing the same
file; delays on any rank) on 2 to 4 real gloo ranks under torchrun, every call's outcome on every rank compared with
the reference model in `tests/protocol_model.py`. A failing program is shrunk and printed, ready for `--replay`."""
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
    p.add_argument('--replay', help='a file holding one program, as printed by a failing run')
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as root:
        if a.replay:
            ops = ast.literal_eval(Path(a.replay).read_text())
            for n in a.nproc: print(f"{n} ranks:", pm.check([ops], n, Path(root)/str(n))[0] or 'as the model says')
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
              f"{time.time()-t0:.0f}s")
        if failed:
            n, ops = failed[0]
            small = pm.shrink(ops, n, Path(root)/'shrink')
            print(f"smallest failing program ({n} ranks):\n{pm.show(small)}\n" + '\n'.join(pm.check([small], n, Path(root)/'min')[0]))
            sys.exit(1)
