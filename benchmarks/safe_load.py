"""The cost of `load_learner`'s safe default: a vision export of about 90 MB (`tools/export_corpus.py`'s
`vision_folders`: resnet34, the augmentations of fastai's defaults), loaded with `safe_unpickle`'s `ExportUnpickler`
and with fastai's own `load_learner` (`pickle`), each once untimed, then interleaved, 5 of each, their medians' ratio;
five times, and the median of the five ratios. Not part of the tests; run `../.venv-latest/bin/python safe_load.py` from here."""
import gc, sys, time, ctypes, ctypes.util, pickle, warnings, tempfile, statistics, subprocess
from functools import partial
from pathlib import Path
from ddp_safe_fastai.all import load_learner
from ddp_safe_fastai.learner import _fastai_load_learner

def settle(trim=getattr(ctypes.CDLL(ctypes.util.find_library('c')), 'malloc_trim', None)):
    "Each load starts from the same memory: no garbage of the last, and the pages it freed handed back (glibc's `malloc_trim`). Else a load that reuses the 88 MB the other freed runs in half the time, and the ratio measures the allocator"
    gc.collect()
    if trim is not None: trim(0)

def ratio(f, runs):
    "The medians of `runs` interleaved loads of `f`, by default and by fastai's `load_learner`"
    safe,fastai_load = [],[]
    for _ in range(runs):  # interleaved: a machine that slows down slows both
        for times,load in ((safe, load_learner), (fastai_load, partial(_fastai_load_learner, pickle_module=pickle))):
            settle()
            t = time.perf_counter(); learn = load(f); times.append(time.perf_counter() - t)
            del learn  # freed once its time is taken
    return statistics.median(safe),statistics.median(fastai_load)

def main(runs=5, repeats=5):
    warnings.filterwarnings('ignore')
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, Path(__file__).parent.parent/'tools'/'export_corpus.py', d, '--first'], check=True, capture_output=True, cwd=d)
        f = Path(d)/'vision_folders.pkl'
        load_learner(f); _fastai_load_learner(f, pickle_module=pickle)  # each once, untimed: the first load of a process imports and warms up
        measured = [ratio(f, runs) for _ in range(repeats)]
        ratios = sorted(s/p for s,p in measured)
        print(f"| export | MB | safe load | fastai's load_learner | ratio, median of {repeats} (each of {runs} interleaved loads) |\n|---|---|---|---|---|\n"
              f"| vision_folders (resnet34) | {f.stat().st_size/1e6:.0f} | {min(s for s,_ in measured)*1000:.0f} to {max(s for s,_ in measured)*1000:.0f} ms "
              f"| {min(p for _,p in measured)*1000:.0f} to {max(p for _,p in measured)*1000:.0f} ms | {statistics.median(ratios):.2f}x ({ratios[0]:.2f}x to {ratios[-1]:.2f}x) |")

if __name__ == '__main__': main()
