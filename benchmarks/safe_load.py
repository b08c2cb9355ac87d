"""The cost of `load_learner`'s safe default: a vision export of about 90 MB (`tools/export_corpus.py`'s
`vision_folders`: resnet34, the augmentations of fastai's defaults) and one of about 1 MB (`testing.synth_learner`'s with
a model of two linear layers), each
loaded by default (read as data, checked kind by kind, built by `safe_unpickle`) and with fastai's own `load_learner` (`pickle`), each once untimed, then in pairs, one of each back to back (their
order alternating), and the median of the pairs' ratios: a machine that slows down for a while slows both loads of a
pair. Not part of the tests; run `../.venv-latest/bin/python safe_load.py` from here."""
import gc, sys, time, ctypes, ctypes.util, pickle, warnings, tempfile, statistics, subprocess
from functools import partial
from pathlib import Path
from ddp_safe_fastai.all import load_learner
from ddp_safe_fastai.learner import _fastai_load_learner

def settle(trim=getattr(ctypes.CDLL(ctypes.util.find_library('c')), 'malloc_trim', None)):
    "Each load starts from the same memory: no garbage of the last, and the pages it freed handed back (glibc's `malloc_trim`). Else a load that reuses the 88 MB the other freed runs in half the time, and the ratio measures the allocator"
    gc.collect()
    if trim is not None: trim(0)

def pair(f, safe_first):
    "The times of one load of `f` by default and one by fastai's `load_learner`, back to back"
    times = {}
    for name,load in sorted({'safe': load_learner, 'fastai': partial(_fastai_load_learner, pickle_module=pickle)}.items(), reverse=safe_first):
        settle()
        t = time.perf_counter(); learn = load(f); times[name] = time.perf_counter() - t
        del learn  # freed once its time is taken
    return times['safe'],times['fastai']

def main(pairs=61):
    warnings.filterwarnings('ignore')
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, Path(__file__).parent.parent/'tools'/'export_corpus.py', d, '--first'], check=True, capture_output=True, cwd=d)
        print(f"| export | MB | safe load, median | fastai's load_learner, median | ratio, median of {pairs} pairs (quartiles) |\n|---|---|---|---|---|")
        import torch
        from ddp_safe_fastai.testing import synth_learner
        small = synth_learner(path=d); small.model = torch.nn.Sequential(torch.nn.Linear(4, 512), torch.nn.Linear(512, 512)); small.export(Path(d)/'small.pkl')
        for name,what in [('vision_folders', 'resnet34'), ('small', 'two linear layers')]:
            f = Path(d)/f'{name}.pkl'
            load_learner(f); _fastai_load_learner(f, pickle_module=pickle)  # each once, untimed: the first load of a process imports and warms up
            measured = [pair(f, i % 2 == 0) for i in range(pairs)]
            ratios = statistics.quantiles([s/p for s,p in measured], n=4)
            print(f"| {name} ({what}) | {f.stat().st_size/1e6:.1f} | {statistics.median(s for s,_ in measured)*1000:.1f} ms "
                  f"| {statistics.median(p for _,p in measured)*1000:.1f} ms | {ratios[1]:.2f}x ({ratios[0]:.2f}x to {ratios[2]:.2f}x) |")

if __name__ == '__main__': main()
