#!/usr/bin/env bash
# The benchmarks: ratios measured side by side in one run, printed, and plotted to nbs/images/benchmarks.png
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh latest
cd benchmarks && exec ../.venv-latest/bin/python bench.py
