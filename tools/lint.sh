#!/usr/bin/env bash
# pyflakes over the package, tests, benchmarks, examples and tools; a star import (nbdev's style) hides undefined
# names from pyflakes, so each name it cannot place is looked up in its module after import
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv-dev/bin/python}
out=$("$py" -m pyflakes ddp_safe_fastai tests benchmarks examples tools 2>&1 || true)
# the star imports themselves, and `all`'s re-exports, are the design
bad=$(grep -v -e "import \*' used; unable to detect undefined names" -e "may be undefined, or defined from star imports" \
           -e "^ddp_safe_fastai/_modidx.py" -e "^ddp_safe_fastai/all.py:.*imported but unused" <<<"$out" || true)
undefined=$(grep "may be undefined, or defined from star imports" <<<"$out" | grep "^ddp_safe_fastai/" \
  | sed -E "s/^ddp_safe_fastai\/([a-z_]+)\.py:.*'([A-Za-z_0-9]+)' may be undefined.*/\1 \2/" | sort -u \
  | "$py" -c "
import sys, importlib
for line in sys.stdin:
    mod,name = line.split()
    if not hasattr(importlib.import_module('ddp_safe_fastai.'+mod), name): print(f'ddp_safe_fastai/{mod}.py: undefined name {name!r}')
")
if [ -n "$bad$undefined" ]; then printf '%s\n' "$bad" "$undefined" | grep -v '^$'; echo "FAILED: pyflakes"; exit 1; fi
echo "pyflakes: clean"
