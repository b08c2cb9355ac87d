#!/usr/bin/env bash
# The documentation site: every notebook run and rendered with its outputs into _docs/ (what GitHub Pages serves)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh dev
exec .venv-dev/bin/python tools/docs.py "$@"
