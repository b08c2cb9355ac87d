#!/usr/bin/env bash
# "dev" (nbdev 2.4.14, fastcore 1.14, fastai 2.8.7): notebooks, lint, packaging, the documentation site, and the tests
# that pin fastai 2.8.7 (drop-in behaviour, the table of changes, the census of writers); "latest" (fastai 2.8.12, what
# `pip install fastai` gives a user): the whole behavioural suite, once
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh dev
tools/env.sh latest
pytest_args=(-q -p no:cacheprovider --timeout 900 -rA --durations 5)

echo "== dev: notebooks clean, package and README in sync with them"
.venv-dev/bin/nbdev_clean
.venv-dev/bin/nbdev_export
tools/readme.sh
if [ -n "$(git status --porcelain -uno)" ]; then
  git status --short -uno; git diff --stat
  echo "FAILED: run nbdev_clean, nbdev_export and tools/readme.sh, and commit what they change"; exit 1
fi
echo "== dev: pyflakes"
tools/lint.sh
echo "== packaging: sdist and wheel built, twine-checked, installed outside the repository, README example run"
tools/package.sh
echo "== dev: notebooks run and rendered with their outputs (the documentation site, _docs/)"
tools/docs.sh
echo "== dev: the site in headless Chromium: links, anchors and images resolve, search lands on an entry, 375 px layout"
command -v "${CHROMIUM:-chromium}" || { apt-get update -qq && apt-get install -y -qq chromium; }  # CHROMIUM: another build (GitHub: google-chrome)
.venv-dev/bin/python tools/browser_check.py
echo "== dev: fastai 2.8.7 pinned: drop-in behaviour, the table of changes, the census of writers"
(cd tests && ../.venv-dev/bin/python -m pytest "${pytest_args[@]}" test_dropin.py test_fastai_changes.py)
echo "== SLURM: a one-node cluster for the tests of srun and requeue (stopped and removed whatever the outcome)"
slurm_dir=$(mktemp -d /tmp/ddp_safe_slurm.XXXXXX)
trap 'tools/slurm.sh stop "$slurm_dir"' EXIT
tools/slurm.sh start "$slurm_dir"
export SLURM_CONF=$slurm_dir/slurm.conf
echo "== latest: behavioural tests"
(cd tests && ../.venv-latest/bin/python -m pytest "${pytest_args[@]}")
