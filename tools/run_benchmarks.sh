#!/usr/bin/env bash
# Runs every benchmark of the "bench" preset (build it first: make bench does) and keeps the
# output in build/bench/results/. Not part of CI: timings need a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/bench/results
mkdir -p "$out"
for b in build/bench/bench/*_bench; do
  [[ -x "$b" ]] || continue
  name=$(basename "$b")
  echo "=== $name"
  "$b" --benchmark_out="$out/$name.json" --benchmark_out_format=json "$@"
done
