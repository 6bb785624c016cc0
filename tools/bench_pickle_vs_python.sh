#!/usr/bin/env bash
# Loads one big snapshot with Python's pickle.load and with fragscope's ReadDocumentFile, each
# in a fresh process under /usr/bin/time -v, and prints the wall time and peak RSS of both.
# The file is made with tools/make_snapshot_fixtures.py --big when it does not exist.
#
#   tools/bench_pickle_vs_python.sh [FILE] [ENTRIES]     # defaults: /tmp/fragscope_big.pickle 2000000
#
# Needs the bench preset's pickle_bench (cmake --preset bench && cmake --build --preset bench
# --target pickle_bench). Results for docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
file="${1:-/tmp/fragscope_big.pickle}"
entries="${2:-2000000}"
bench=build/bench/bench/pickle_bench

if [[ ! -x "$bench" ]]; then
  cmake --preset bench >/dev/null
  cmake --build --preset bench --target pickle_bench
fi
if [[ ! -f "$file" ]]; then
  /usr/bin/python3 tools/make_snapshot_fixtures.py --big "$file" --entries "$entries"
fi
echo "file: $file ($(stat -c %s "$file") bytes)"

measure() {  # label, command...
  local label=$1
  shift
  local log
  log=$(mktemp)
  /usr/bin/time -v "$@" 2>"$log" | sed "s/^/  /"
  local wall rss
  wall=$(grep -F 'Elapsed (wall clock) time' "$log" | awk '{print $NF}')
  rss=$(grep -F 'Maximum resident set size' "$log" | awk '{print $NF}')
  printf '%-28s wall %-10s peak RSS %8.1f MiB\n' "$label" "$wall" "$(echo "$rss / 1024" | bc -l)"
  rm -f "$log"
}

measure "python3 pickle.load" /usr/bin/python3 -c '
import pickle, sys, time
t = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
print("pickle.load: %.3f s, %d trace entries" % (time.perf_counter() - t,
      sum(len(d) for d in snap["device_traces"])))' "$file"
measure "fragscope ReadDocumentFile" "$bench" --load="$file"
