#!/usr/bin/env bash
# The demo: a two-process DDP training on CPU (torchrun, gloo) that saves and reloads through ddp_safe_fastai
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh latest
exec .venv-latest/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "${MASTER_PORT:-29517}" examples/demo.py
