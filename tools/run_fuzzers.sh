#!/usr/bin/env bash
# Builds the libFuzzer targets with the "fuzz" preset (clang, ASan+UBSan) and runs each one for
# FUZZ_SECONDS (default 300) seconds. Exits non-zero if a fuzzer finds a crash, a sanitizer
# report, a leak, a timeout or an out-of-memory; the input is saved under
# fuzz/artifacts/<target>/. Commit it to fuzz/corpus/<target>/ with the fix, so the replay test
# (ctest: <target>_fuzz_replay) keeps it fixed.
#
#   tools/run_fuzzers.sh                        # every target, 300 s each
#   FUZZ_SECONDS=30 tools/run_fuzzers.sh trace_reader
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-300}"
build_dir=build/fuzz  # the fuzz preset's binaryDir

# Target -> -max_len. trace_reader: room for several lines and for lines beyond the target's
# 4 KiB line limit, and for small compressed traces; longer inputs only slow the search.
declare -A max_len=(
  [trace_reader]=16384
  [alloc_conf]=4096  # a conf string; PyTorch's are < 200 bytes, the parser caps at 64 KiB
  # Room for the small snapshot fixtures (2-8 KiB) and for payloads beyond small caps.
  [pickle_reader]=16384
  [snapshot]=65536   # small snapshots: a few segments and a few hundred trace entries
  [agent_protocol]=8192  # a few frames; the target's decoder caps a frame at 4 KiB
  [oom_text]=16384   # log text: several messages, wrapped lines, lines beyond the 4 KiB cap
  [alert_config]=16384  # a TOML rules file; real ones are a few KiB
)

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=("${!max_len[@]}"); fi
for t in "${targets[@]}"; do
  if [[ -z "${max_len[$t]:-}" ]]; then
    echo "unknown fuzz target: $t (known: ${!max_len[*]})" >&2
    exit 2
  fi
done

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]/%/_fuzzer}"

status=0
for t in "${targets[@]}"; do
  work="$build_dir/corpus/$t"  # new inputs land here; fuzz/corpus/ holds only reviewed seeds
  artifacts="fuzz/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  extra=()
  if [[ -f "fuzz/$t.dict" ]]; then extra+=("-dict=fuzz/$t.dict"); fi
  echo "== $t: ${seconds} s, -max_len=${max_len[$t]}"
  if ! "$build_dir/fuzz/${t}_fuzzer" "$work" "fuzz/corpus/$t" "${extra[@]}" \
      -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=25 -rss_limit_mb=2048 \
      -use_value_profile=1 -artifact_prefix="$artifacts" -print_final_stats=1; then
    echo "== $t: the fuzzer found a problem; inputs are in $artifacts" >&2
    status=1
  fi
done
exit "$status"
