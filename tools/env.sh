#!/usr/bin/env bash
# Create (or reuse) the virtual environment .venv-NAME from tools/requirements-NAME.txt, with this package installed
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; venv=.venv-$name; req=tools/requirements-$name.txt
stamp="$venv/.installed-$(cat "$req" setup.py settings.ini | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -U pip
  "$venv/bin/pip" install -q -r "$req"              # each file pins torch: an unpinned one pulls the newest build
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
  touch "$stamp"
fi
