#!/usr/bin/env bash
# The checks that need a GPU, in one run (under 8 minutes on one H100 or H200): tests/test_cuda.py, then the cost of the
# two callbacks on a ResNet-50 fit, and with the memory tier every batch and every 10 (benchmarks/gpu_fit.py: 4 arms of
# 2 epochs of about 45 seconds). On a machine whose python has torch with CUDA and no
# network: fastai and its pure-Python needs come as wheels in .whl/ (`pip download` them where there is a network).
# Results go to $OUT (or ./gpu_check/), with the card's name.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check}; mkdir -p "$out"
py=${PYTHON:-python3}
if [ -d .whl ]; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ddp_safe_site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/ddp_safe_site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/card.txt"
$py -c 'import torch, fastai, fastcore, accelerate; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "fastai", fastai.__version__, "fastcore", fastcore.__version__, "accelerate", accelerate.__version__)' | tee -a "$out/card.txt"
(cd tests && timeout 300 $py -m pytest -q -p no:cacheprovider --timeout 240 -rA test_cuda.py) 2>&1 | tee "$out/test_cuda.log"; tests=${PIPESTATUS[0]}
timeout ${GPU_FIT_TIMEOUT:-420} $py benchmarks/gpu_fit.py --epoch-seconds "${EPOCH_SECONDS:-45}" --epochs "${EPOCHS:-2}" \
  --arms "${ARMS:-plain,both,memory:1,memory:10}" --out "$out/gpu_fit.json" 2>&1 | tail -5; bench=${PIPESTATUS[0]}
echo "test_cuda.py: exit $tests; gpu_fit.py: exit $bench"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
