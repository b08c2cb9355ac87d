#!/usr/bin/env bash
# "dev" (nbdev 2.4.14, fastcore 1.14, fastai 2.8.7): notebooks, lint, packaging, the documentation site, and the tests
# that pin fastai 2.8.7 (drop-in behaviour, the table of changes, the census of writers, its exports loaded safely); "latest" (fastai 2.8.12, what
# `pip install fastai` gives a user): the whole behavioural suite, once, in three pytest workers (pytest-xdist: many tests
# wait, for a scheduler, a store, a kill; those that share a server or addresses run on one worker, see conftest.py)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh dev > /tmp/ddp_safe_env_dev.log 2>&1 & dev_env=$!  # two downloads at once
tools/env.sh latest || { wait $dev_env || true; exit 1; }
wait $dev_env || { cat /tmp/ddp_safe_env_dev.log; exit 1; }
pytest_args=(-q -p no:cacheprovider --timeout 900 -rA --durations 25)

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
echo "== the package's layers: no cycle, no import inside a function, none from a layer above, none through a re-export"
.venv-dev/bin/python tools/imports.py
echo "== every public definition followed by an example on its page"
.venv-dev/bin/python tools/examples.py
echo "== packaging (in the background; its output follows the tests): sdist and wheel built, twine-checked, installed outside the repository, README example run"
package_log=$(mktemp /tmp/ddp_safe_package.XXXXXX)
setsid tools/package.sh > "$package_log" 2>&1 & package=$!
slurm_dir=; swift_dir=; azurite_dir=
cleanup() { [ -z "$slurm_dir" ] || tools/slurm.sh stop "$slurm_dir"; [ -z "$swift_dir" ] || tools/swift.sh stop "$swift_dir"
            [ -z "$azurite_dir" ] || tools/azurite.sh stop "$azurite_dir"; kill -- -$package 2>/dev/null || true; }
trap cleanup EXIT
echo "== services, installed and started in the background while the site is built (stopped and removed whatever the outcome):"
echo "   Chromium for the site's check; SLURM, a one-node cluster for the tests of srun and requeue; OpenStack Swift with its S3 API"
echo "   and Azure's emulator azurite, on 127.0.0.1, for the tests of checkpoints in a bucket"
slurm_dir=$(mktemp -d /tmp/ddp_safe_slurm.XXXXXX); swift_dir=$(mktemp -d /tmp/ddp_safe_swift.XXXXXX); azurite_dir=$(mktemp -d /tmp/ddp_safe_azurite.XXXXXX)
services_log=$(mktemp /tmp/ddp_safe_services.XXXXXX); azurite_log=$(mktemp /tmp/ddp_safe_azurite_start.XXXXXX)
# one after the other: Chromium's, SLURM's and Swift's packages come from apt, which installs one thing at a time
( set -e; command -v "${CHROMIUM:-chromium}" || { apt-get update -qq && apt-get install -y -qq chromium; }  # CHROMIUM: another build (GitHub: google-chrome)
  tools/slurm.sh start "$slurm_dir"; tools/swift.sh start "$swift_dir" ) > "$services_log" 2>&1 & services=$!
tools/azurite.sh start "$azurite_dir" > "$azurite_log" 2>&1 & azurite_start=$!
echo "== dev: notebooks run and rendered with their outputs (the documentation site, _docs/)"
tools/docs.sh
echo "== services: started"
if wait $services; then cat "$services_log"; else cat "$services_log"; echo "FAILED: Chromium, SLURM or Swift"; exit 1; fi
if wait $azurite_start; then cat "$azurite_log"; else cat "$azurite_log"; echo "FAILED: azurite"; exit 1; fi
export SLURM_CONF=$slurm_dir/slurm.conf DDP_SAFE_SWIFT_DIR=$swift_dir DDP_SAFE_AZURITE_DIR=$azurite_dir
echo "== dev: the site in headless Chromium: links, anchors and images resolve, search lands on an entry, 375 px layout"
.venv-dev/bin/python tools/browser_check.py
echo "== dev: fastai 2.8.7 pinned: drop-in behaviour, the table of changes, the census of writers, exports of its stack loaded safely"
(cd tests && ../.venv-dev/bin/python -m pytest "${pytest_args[@]}" test_learner_dropin.py test_changes.py test_safe_load.py)
echo "== latest: behavioural tests, their ranks on the CPU (a GPU is hidden from them: two ranks of one GPU would get an nccl group, which NCCL refuses)"
# every process of the suite (hundreds: ranks, launchers) imports the package: compiled once here (where PYTHONDONTWRITEBYTECODE is set, as
# on these machines, each would compile it again); one thread a process for torch's own work, as torchrun sets it for its workers
.venv-latest/bin/python -m compileall -q ddp_safe_fastai tests
(cd tests && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 ../.venv-latest/bin/python -m pytest "${pytest_args[@]}" -n 3 --dist loadgroup --ignore=test_cuda.py)
echo "== latest: the nccl and CUDA paths (skipped without a GPU)"
(cd tests && ../.venv-latest/bin/python -m pytest "${pytest_args[@]}" test_cuda.py)
echo "== packaging: its output"
if wait $package; then cat "$package_log"; else cat "$package_log"; echo "FAILED: tools/package.sh"; exit 1; fi
