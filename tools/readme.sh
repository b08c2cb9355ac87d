#!/usr/bin/env bash
# README.md from nbs/index.ipynb (quarto, which nbdev_readme needs, cannot be installed here: nbconvert renders it)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp README.md.XXXXXX)
trap 'rm -f "$tmp"' EXIT
.venv-dev/bin/jupyter nbconvert --to markdown --log-level WARN --stdout nbs/index.ipynb > "$tmp"
[ -s "$tmp" ] || { echo "README rendering produced nothing"; exit 1; }
mv "$tmp" README.md
