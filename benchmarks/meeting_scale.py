"""Cost of one meeting from 8 to 1024 simulated ranks: threads, each with its own client of one real `TCPStore`.
`meet` (rank 0 gathers, every rank reads one value) against the all-to-all it replaced (every rank read every key),
and against the least any barrier does (one `add` and one `wait` a rank). `meet` is measured with the store outside
the ranks' processes (torchrun's agent: two messages a rank) and as if it were in rank 0's (each rank also says it
has read)."""
import time, pickle, threading, argparse
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from torch.distributed import TCPStore
from ddp_safe_fastai.store_gather import meet, key_cleanup

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

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument('--ranks', type=int, nargs='+', default=[8, 64, 256, 512, 1024])
    p.add_argument('--reps', type=int, default=10)
    p.add_argument('--plot', default=str(Path(__file__).parent.parent/'nbs/images/meeting_scale.png'))
    a = p.parse_args()
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
