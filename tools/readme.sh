#!/usr/bin/env bash
# README.md from nbs/index.ipynb (quarto, which nbdev_readme needs, cannot be installed here: nbconvert renders it)
set -euo pipefail
cd "$(dirname "$0")/.."
.venv-dev/bin/jupyter nbconvert --to markdown --log-level WARN --stdout nbs/index.ipynb > README.md
