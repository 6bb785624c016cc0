#!/usr/bin/env bash
# Captures the request traces of the forecast evaluation (docs/forecast.md, "Evaluation"): the
# workloads listed in bench/forecast_eval/manifest.txt (tuning and test sets, issue 31), each a
# small but real PyTorch program run on the CPU under tools/capture_trace.py. Deterministic
# (fixed seeds, one intra-op thread); a trace already present is kept, so `make eval` captures
# once. Runs niced: the machine is shared.
# Usage: capture_workloads.sh [OUT_DIR] [--force] [--set tuning|test]
# Needs Debian's python3-torch (tools/install-deps.sh --with-torch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/workloads
force=""
only=""
while (($#)); do
  case $1 in
    --force) force=--force ;;
    --set) only=$2; shift ;;
    *) out=$1 ;;
  esac
  shift
done
root=$(cd "$here/../.." && pwd)
capture="nice -n 10 /usr/bin/python3 $root/tools/capture_trace.py"
# A manifest line whose arguments start with --virtual-gpu runs the program live on the virtual
# GPU under the user environment's PyTorch (tools/run_on_virtual_gpu.py --trace) instead: it needs
# that environment (tools/setup_user_env.sh) and the native core (fragscope_core, any preset).
user_python=${FRAGSCOPE_USER_PYTHON:-/root/.cache/fragscope/user-env-py311/bin/python}
virtual="env PYTHONPATH=$root/python nice -n 10 $user_python $root/tools/run_on_virtual_gpu.py"
virtual+=" --capacity 1TiB --no-record-function"
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
  local ok=1
  if [[ "${1:-}" == --virtual-gpu ]]; then
    shift
    if [[ ! -x "$user_python" ]]; then
      echo "capture_workloads: $name: skipped (no $user_python: tools/setup_user_env.sh)"
      return
    fi
    # shellcheck disable=SC2086
    $virtual --seed 0 --trace "$path" "$@" >"$out/$name.log" 2>&1 || ok=0
  else
    # --seed 0 first: a manifest line's own --seed comes later and wins.
    # shellcheck disable=SC2086  # the argument strings are word lists on purpose
    $capture --seed 0 --model-name "$name" --run "eval-$name" "$@" -o "$path" \
      2>"$out/$name.log" || ok=0
  fi
  if ((!ok)); then
    tail -n 20 "$out/$name.log"
    echo "capture_workloads: $name: FAILED (log: $out/$name.log)"
    rm -f "$path"
    return 1
  fi
  echo "capture_workloads: $name: done in $((SECONDS - start)) s, $(stat -c %s "$path") bytes"
}

while read -r set name args; do
  [[ -z "$set" || "$set" == \#* ]] && continue
  [[ -n "$only" && "$set" != "$only" ]] && continue
  # shellcheck disable=SC2086
  workload "$name" $args
done <"$here/manifest.txt"
