"""The cost of `load_learner`'s safe default: a vision export of about 90 MB (`tools/export_corpus.py`'s
`vision_folders`: resnet34, the augmentations of fastai's defaults), loaded with `safe_unpickle`'s `ExportUnpickler`
and with fastai's own `load_learner` (`pickle`), each once untimed, then interleaved, 5 of each; their medians and their
ratio. Not part of the tests; run `../.venv-latest/bin/python safe_load.py` from here."""
import gc, sys, time, ctypes, ctypes.util, pickle, warnings, tempfile, statistics, subprocess
from functools import partial
from pathlib import Path
from ddp_safe_fastai.all import load_learner
from ddp_safe_fastai.learner import _fastai_load_learner

def settle(trim=getattr(ctypes.CDLL(ctypes.util.find_library('c')), 'malloc_trim', None)):
    "Each load starts from the same memory: no garbage of the last, and the pages it freed handed back (glibc's `malloc_trim`). Else a load that reuses the 88 MB the other freed runs in half the time, and the ratio measures the allocator"
    gc.collect()
    if trim is not None: trim(0)

def main(runs=5):
    warnings.filterwarnings('ignore')
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, Path(__file__).parent.parent/'tools'/'export_corpus.py', d], check=True, capture_output=True, cwd=d)
        f = Path(d)/'vision_folders.pkl'
        safe,fastai_load = [],[]
        load_learner(f); _fastai_load_learner(f, pickle_module=pickle)  # each once, untimed: the first load of a process imports and warms up
        for _ in range(runs):  # interleaved: a machine that slows down slows both
            for times,load in ((safe, load_learner), (fastai_load, partial(_fastai_load_learner, pickle_module=pickle))):
                settle()
                t = time.perf_counter(); learn = load(f); times.append(time.perf_counter() - t)
                del learn  # freed once its time is taken
        s,p = statistics.median(safe),statistics.median(fastai_load)
        print(f"| export | MB | safe load (median of {runs}) | fastai's load_learner | ratio |\n|---|---|---|---|---|\n"
              f"| vision_folders (resnet34) | {f.stat().st_size/1e6:.0f} | {s*1000:.0f} ms | {p*1000:.0f} ms | {s/p:.2f}x |")

if __name__ == '__main__': main()
