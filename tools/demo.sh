#!/usr/bin/env bash
# The demo behind `make demo`: the bundled request trace of a real PyTorch training run
# (tools/capture_trace.py), analyzed, then replayed through the caching-allocator simulator on
# virtual GPUs: one that fits, one on which PyTorch's default settings run out of memory, and
# `tune` finding the PYTORCH_CUDA_ALLOC_CONF that avoids it, `check` gating the run as CI
# would; then a PyTorch memory snapshot (a synthetic fixture of ours) analyzed and converted
# for Perfetto, a pasted CUDA OOM message explained and its remedies verified by replay, and
# the OOM written as one HTML report (docs/report.md) whose path is printed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${FRAGSCOPE_BIN:-build/release/apps/fragscope/fragscope}
sample=${SAMPLE:-tests/data/sample/gpt_tiny_50steps.jsonl.gz}
tight=${TIGHT_CAPACITY:-520MiB}

banner() { printf '\n\033[1m==> %s\033[0m\n\n' "$*"; }

banner "fragscope analyze $sample   (what the program asked for)"
"$bin" analyze "$sample" --timeline-rows 12 || exit 1

banner "fragscope replay $sample --capacity 1GiB   (a virtual GPU that fits the run)"
"$bin" replay "$sample" --capacity 1GiB --timeline-rows 12
rc=$?; [[ $rc -le 1 ]] || exit 1

banner "fragscope replay $sample --capacity $tight   (PyTorch's defaults run out of memory)"
"$bin" replay "$sample" --capacity "$tight" --timeline-rows 12 --no-map
rc=$?; [[ $rc -le 1 ]] || exit 1

banner "fragscope tune $sample --capacity $tight   (which allocator setting avoids it)"
"$bin" tune "$sample" --capacity "$tight" --rows 10
rc=$?; [[ $rc -le 1 ]] || exit 1

banner "fragscope replay $sample --capacity 600MiB --forecast --forecast-every 1   (the forecast: the OOM risk from step 40; a young tail, under 100 steps, raises watch at most)"
"$bin" replay "$sample" --capacity 600MiB --forecast --forecast-every 1 --timeline-rows 0 --no-map
rc=$?; [[ $rc -le 1 ]] || exit 1

banner "fragscope check $sample --capacity $tight --max-fragmentation 0.9   (a CI gate: exit 1)"
"$bin" check "$sample" --capacity "$tight" --max-fragmentation 0.9
rc=$?; [[ $rc -le 1 ]] || exit 1

snapshot=${SNAPSHOT:-tests/data/snapshots/g2_oom.pickle}
banner "fragscope analyze $snapshot --no-map   (a PyTorch memory snapshot that ended in an OOM)"
"$bin" analyze "$snapshot" --no-map || exit 1

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
banner "fragscope convert $snapshot -o memory.perfetto.json   (a timeline for ui.perfetto.dev)"
"$bin" convert "$snapshot" -o "$out/memory.perfetto.json" || exit 1

oom_log=tests/data/explain/fragmented_oom.txt
banner "fragscope explain $oom_log --trace ${oom_log%.txt}.jsonl   (why the OOM, and which fix works)"
"$bin" explain "$oom_log" --trace "${oom_log%.txt}.jsonl" || exit 1

report=${REPORT:-build/demo/oom-report.html}
mkdir -p "$(dirname "$report")"
banner "fragscope report $sample --capacity $tight -o $report   (the OOM above, as one HTML page)"
"$bin" report "$sample" --capacity "$tight" -o "$report" || exit 1
echo "Open it in a browser: file://$(cd "$(dirname "$report")" && pwd)/$(basename "$report")"
