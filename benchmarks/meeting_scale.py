"""Cost of one meeting from 8 to 1024 simulated ranks: threads, each with its own client of one real `TCPStore`.
`meet` (rank 0 gathers, every rank reads one value) against the all-to-all it replaced (every rank read every key),
and against the least any barrier does (one `add` and one `wait` a rank). `meet` is measured with the store outside
the ranks' processes (torchrun's agent: two messages a rank) and as if it were in rank 0's (each rank also says it
has read).

`--memory`: what a memory checkpoint costs at each scale instead (`memory_tier.RngHandoff`, 8 simulated ranks a node):
on every rank, the training's path (`hand`: its random states taken, handed to a thread of its own; no request to the
store), its CPU and wall time, median and max over the ranks; in the background, one node's writer reading every
rank's states (`gather`), its seconds and the bytes it reads, which is each node's traffic per memory checkpoint."""
import time, pickle, threading, argparse
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from torch.distributed import TCPStore
from ddp_safe_fastai.store_gather import meet, key_cleanup
from ddp_safe_fastai.memory_tier import RngHandoff
import statistics

def all_to_all(store, meeting, r, n, data, timeout=120):
    "The previous meeting: every rank waits for and reads every rank's key, then says it has read"
    keys = [f"{meeting}/{j}" for j in range(n)]
    store.set(f"ddp_safe/at/{r}", 'bench'); store.set(keys[r], data)
    store.wait(keys, timedelta(seconds=timeout))
    res = store.multi_get(keys)
    if store.add(f"{meeting}/read", 1) == n: store.set(f"{meeting}/all_read", '')
    if r == 0: store.wait([f"{meeting}/all_read"], timedelta(seconds=timeout))
    return res

def bare_barrier(store, meeting, r, n, data, timeout=120):
    "The floor of any meeting through the store: one `add`, then a `wait` for the last rank's key"
    if store.add(f"{meeting}/count", 1) == n: store.set(f"{meeting}/done", '')
    store.wait([f"{meeting}/done"], timedelta(seconds=timeout))
    return [data]*n

def per_meeting(protocol, n, reps):
    "Fastest of `reps` meetings of `n` simulated ranks, in seconds"
    server = TCPStore('127.0.0.1', 0, n, True, timedelta(seconds=120), wait_for_workers=False)
    with ThreadPoolExecutor(128) as ex: # connecting takes 0.2 s a client here, each waiting alone: connect many at once
        clients = list(ex.map(lambda _: TCPStore('127.0.0.1', server.port, n, False, timedelta(seconds=120)), range(n)))
    data = pickle.dumps(('host', None))
    times = []
    for rep in range(reps):
        start, done = threading.Barrier(n+1), []
        def rank(r):
            start.wait()
            done.append(len(protocol(clients[r], f"bench/{rep}", r, n, data, timeout=120)))
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in ts: t.start()
        start.wait(); t0 = time.perf_counter()
        for t in ts: t.join()
        times.append(time.perf_counter() - t0)
        assert done == [n]*n
    key_cleanup.join() # rank 0's removals, done in the background while the next meetings ran, before the store goes
    return min(times)

def memory_handoff(n, reps):
    "[(training path CPU median, max, wall median, max, the writer's gather seconds, bytes)] of `reps` memory checkpoints with `n` simulated ranks"
    server = TCPStore('127.0.0.1', 0, n, True, timedelta(seconds=120), wait_for_workers=False)
    with ThreadPoolExecutor(128) as ex:
        clients = list(ex.map(lambda _: TCPStore('127.0.0.1', server.port, n, False, timedelta(seconds=120)), range(n)))
    ranks = [RngHandoff(clients[r], r, n, timeout=120) for r in range(n)]
    rows = []
    for rep in range(reps):
        name,cpu,wall = f"epoch_0000_iter_{rep+1:06d}",[0.]*n,[0.]*n
        start = threading.Barrier(n+1)
        def rank(r):
            start.wait()
            c,w = time.thread_time(),time.perf_counter()
            ranks[r].hand(name)  # what the training does at a memory checkpoint
            cpu[r],wall[r] = time.thread_time() - c,time.perf_counter() - w
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in ts: t.start()
        start.wait()
        for t in ts: t.join()
        t0 = time.perf_counter()
        got = ranks[0].gather(name)  # node 0's writer, in its background thread
        rows.append((statistics.median(cpu), max(cpu), statistics.median(wall), max(wall), time.perf_counter() - t0, sum(map(len, got))))
    for h in ranks: h.close()
    return rows

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--ranks', type=int, nargs='+', default=[8, 64, 256, 512, 1024])
    p.add_argument('--reps', type=int, default=10)
    p.add_argument('--plot', default=str(Path(__file__).parent.parent/'nbs/images/meeting_scale.png'))
    p.add_argument('--memory', action='store_true', help="a memory checkpoint's hand-off instead of a meeting")
    a = p.parse_args()
    if a.memory:
        print("| ranks | training's path CPU ms, median | max | wall ms, median | max | a node's writer reads, s | bytes a node reads |\n|---|---|---|---|---|---|---|")
        for n in a.ranks:
            rows = memory_handoff(n, a.reps)[1:] or memory_handoff(n, 2)  # the first one makes each rank's thread
            med = lambda i: statistics.median(r[i] for r in rows)
            print(f"| {n} | {1000*med(0):.3f} | {1000*max(r[1] for r in rows):.3f} | {1000*med(2):.3f} | {1000*max(r[3] for r in rows):.3f} | {med(4):.3f} | {med(5):,.0f} |", flush=True)
        raise SystemExit(0)
    cols = {'all-to-all (before)': all_to_all, 'meet, store in rank 0': meet,
            'meet, store outside the ranks (torchrun)': partial(meet, outlives_ranks=True), 'bare barrier (floor)': bare_barrier}
    rows = []
    print("| ranks | " + " | ".join(f"{c} s" for c in cols) + " |\n|---|" + "---|"*len(cols))
    for n in a.ranks:
        rows.append((n, *[per_meeting(f, n, a.reps) for f in cols.values()]))
        print(f"| {n} | " + " | ".join(f"{t:.3f}" for t in rows[-1][1:]) + " |", flush=True)
    if a.plot:
        import matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for i,lbl in enumerate(cols, 1): ax.plot([r[0] for r in rows], [r[i] for r in rows], 'o-', label=lbl)
        ax.set_xlabel('simulated ranks'); ax.set_ylabel('seconds per meeting'); ax.legend(); fig.tight_layout()
        fig.savefig(a.plot, dpi=110); print('plot:', a.plot)
