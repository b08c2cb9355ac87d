#!/usr/bin/env bash
# The benchmarks: ratios measured side by side in one run, printed, and plotted to nbs/images/benchmarks.png
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh latest
# This VM's host takes back memory the guest frees, and a process that frees a 1 GB tensor and allocates another
# waits 0.5 s to 1.5 s for the host to give it back, at random: the load of a 1 GB checkpoint, raw or guarded,
# took 0.6 s to 1.2 s, and 0.13 s when the process kept its freed memory. So that the ratios compare the code and not
# the host, the benchmark process keeps it (glibc: no mmap for large blocks, no trimming), on both sides alike.
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
cd benchmarks && exec ../.venv-latest/bin/python bench.py
