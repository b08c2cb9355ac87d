#!/usr/bin/env bash
# One test of each feature, for a contributor between changes (the whole suite, which CI runs, is tools/test.sh): each
# guarded save and load path, fastai's writers, each callback, a resume, a resume on another world size, the stop on a
# signal, the memory tier, object storage (OpenStack Swift, started here), SLURM (a one-node cluster, started here), the
# CLI, a storage of the user's and the package's layers. In the "latest" environment, three pytest workers; the servers are stopped whatever the
# outcome. Extra arguments go to pytest (`tools/quick.sh -x`).
set -euo pipefail
cd "$(dirname "$0")/.."; root=$PWD
tools/env.sh latest
slurm_dir=$(mktemp -d /tmp/ddp_safe_slurm.XXXXXX); swift_dir=$(mktemp -d /tmp/ddp_safe_swift.XXXXXX); log=$(mktemp /tmp/ddp_safe_quick.XXXXXX)
trap '"$root"/tools/slurm.sh stop "$slurm_dir"; "$root"/tools/swift.sh stop "$swift_dir"' EXIT  # from wherever the script is then
echo "== SLURM and Swift, on 127.0.0.1 (installed first if they are missing)"
tools/slurm.sh start "$slurm_dir" > "$log" 2>&1 & slurm=$!
tools/swift.sh start "$swift_dir" >> "$log" 2>&1 || { cat "$log"; echo "FAILED: Swift"; exit 1; }
wait $slurm || { cat "$log"; echo "FAILED: SLURM"; exit 1; }
export SLURM_CONF=$slurm_dir/slurm.conf DDP_SAFE_SWIFT_DIR=$swift_dir
tests=(
  # the guarded saves and loads: one writer, every rank told; a fresh read; export and DataLoaders; the encoder
  'test_persist.py::test_only_main_writes[torchrun]' 'test_persist.py::test_lagging_writer[torchrun]'
  'test_persist.py::test_write_failure_on_rank0[torchrun]' 'test_persist_async.py::test_async_save_then_load_is_fresh[torchrun]'
  'test_learner.py::test_export_load_learner[torchrun]' 'test_learner.py::test_dataloaders[torchrun]' 'test_text.py::test_encoder[torchrun]'
  # fastai's writers
  'test_writers.py::test_lr_find[torchrun]' 'test_writers.py::test_csv_logger[torchrun]' 'test_writers.py::test_get_preds_save_preds[torchrun]'
  # the callbacks; a resume, bit for bit; another world size; the stop on a signal; node memory
  'test_callback.py::test_safe_save_model_callback_end_to_end[torchrun]' 'test_checkpoint_policies.py::test_keep_best_survives_rotation'
  'test_checkpoint_resume.py::test_killed_within_an_epoch_resumes_at_its_next_batch[epoch_0001_iter_000006]'
  'test_checkpoint_dir.py::test_format1_resumes_on_three_ranks' 'test_checkpoint_preemption.py::test_stop_after_an_epochs_last_batch'
  'test_memory_tier.py::test_killed_rank_costs_at_most_n_plus_1_batches[0-58-False]'
  # object storage, SLURM, the CLI, the layers
  'test_object_store.py::test_export_and_best_model_to_a_bucket' 'test_checkpoint_slurm.py::test_srun_is_a_launcher' 'test_storage.py::test_a_storage_of_your_own'
  'test_check.py::test_dir_that_does_not_exist' 'test_layers.py::test_the_package_keeps_its_layers'
)
echo "== latest: one test of each feature (${#tests[@]} tests)"
.venv-latest/bin/python -m compileall -q ddp_safe_fastai tests  # as tools/test.sh does
cd tests && CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 ../.venv-latest/bin/python -m pytest -q -p no:cacheprovider --timeout 900 -n 3 --dist loadgroup "${tests[@]}" "$@"
