#!/usr/bin/env bash
# Captures the request traces of the forecast evaluation (docs/forecast.md, "Evaluation"): six
# small but real PyTorch programs run on the CPU under tools/capture_trace.py, one per model
# family the forecaster must handle. Deterministic (fixed seeds); a trace already present is
# kept, so `make eval` captures once. Usage: capture_workloads.sh [OUT_DIR] [--force]
# Needs Debian's python3-torch (tools/install-deps.sh --with-torch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/workloads}
force=${2:-}
capture="/usr/bin/python3 $here/../../tools/capture_trace.py --seed 0"
decoder="--d-model 128 --n-layer 4 --n-head 4 --vocab-size 2048 --batch-size 8"
mkdir -p "$out"

workload() {  # NAME ARGS...
  local name=$1
  shift
  local path="$out/$name.jsonl.gz"
  if [[ -s "$path" && "$force" != "--force" ]]; then
    echo "capture_workloads: $name: present ($path)"
    return
  fi
  echo "capture_workloads: $name: capturing…"
  local start=$SECONDS
  # shellcheck disable=SC2086  # the argument strings are word lists on purpose
  if ! $capture --model-name "$name" --run "eval-$name" "$@" -o "$path" \
      2>"$out/$name.log"; then
    tail -n 20 "$out/$name.log"
    echo "capture_workloads: $name: FAILED (log: $out/$name.log)"
    rm -f "$path"
    return 1
  fi
  echo "capture_workloads: $name: done in $((SECONDS - start)) s, $(stat -c %s "$path") bytes"
}

# shellcheck disable=SC2086
{
  workload decoder_varlen --workload gpt $decoder --min-seq-len 16 --max-seq-len 256 --steps 400
  workload decoder_fixed --workload gpt $decoder --min-seq-len 192 --max-seq-len 192 --steps 400
  workload cnn_fixed_batch --workload cnn --min-batch 32 --max-batch 32 --steps 400
  workload cnn_var_batch --workload cnn --min-batch 8 --max-batch 64 --steps 400
  workload moe_routing --workload moe --d-model 128 --n-layer 2 --n-head 4 --vocab-size 2048 \
    --n-experts 8 --batch-size 8 --min-seq-len 128 --max-seq-len 128 --steps 400
  workload kv_cache_server --workload kv-server --d-model 128 --n-layer 2 --n-head 4 \
    --vocab-size 2048 --min-seq-len 8 --max-seq-len 192 --arrival-rate 0.3 --steps 600
}
