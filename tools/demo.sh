#!/usr/bin/env bash
# The demo: the vision example (resnet18 on scikit-learn's digits, fine_tune) on 2 CPU ranks under torchrun, killed
# with SIGKILL once its second checkpoint is complete, then the same command again: it resumes, finishes, exports,
# predicts on every rank, and prints what each rank holds. DEMO_DIR keeps its files (default: a new temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/env.sh latest
dir=${DEMO_DIR:-$(mktemp -d)}/vision
rm -rf "$dir/models" "$dir/export.pkl" "$dir/report.json"
port=$(.venv-latest/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cmd=(.venv-latest/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" examples/vision.py "$dir")
# what the ranks print, without progress bars and library warnings
filter() { sed -u 's/\r/\n/g' | grep --line-buffered -v -e Warning -e 'warn' -e '^W[0-9]' -e '^ *\^' -e '^ *$' -e '|' -e '█' -e 'Epoch' -e 'Learner.load'; }

echo "== 1. $ ${cmd[*]}"
setsid "${cmd[@]}" > >(filter) 2>&1 &
run=$!
for _ in $(seq 600); do
  [ "$(cat "$dir/models/ckpt/latest" 2>/dev/null)" = epoch_0002 ] && break
  sleep 0.2
done
sleep 1
echo "== killing every process of the run (SIGKILL) after the checkpoint $(cat "$dir/models/ckpt/latest")"
.venv-latest/bin/python -c "from ddp_safe_fastai.launch import kill_tree; kill_tree($run)"
wait "$run" 2>/dev/null || true
echo "== 2. the same command again"
"${cmd[@]}" 2>&1 | filter
