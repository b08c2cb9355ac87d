"Tokenize a folder again (`skip_if_exists=False`) slowly, so that the test can kill this process half-way"
import sys, time, importlib
from pathlib import Path
from fastai.text.all import tokenize_folder, defaults
importlib.import_module('ddp_safe_fastai.all')  # the library in force, as a user's script imports it

def slowly(t): time.sleep(0.05); return t

if __name__ == '__main__':
    tokenize_folder(Path(sys.argv[1]), n_workers=0, skip_if_exists=False, rules=[*defaults.text_proc_rules, slowly])
