#!/usr/bin/env bash
# Runs every test suite and ends with one line of totals ("TOTAL: N passed, M failed").
# Suites: ctest on the asan-ubsan build (unit, CLI, integration, browser and deploy tests under
# AddressSanitizer + UndefinedBehaviorSanitizer), ctest on the dev build (the Python package on
# Debian's torch; the libraries and tools built optimised with -Werror),
# pytest on tools/tests, and pytest on tests/user_env in the user's own environment (a venv of
# PyPI's torch 2.13 and the frameworks, tools/setup_user_env.sh): `pip install .` and the
# Python package from there.
set -uo pipefail
cd "$(dirname "$0")/.."
log_dir=build/test-logs
mkdir -p "$log_dir"
passed=0
failed=0
status=0

count_ctest() {  # "100% tests passed, 0 tests failed out of 57", or (CTest 4) "100% tests passed out of 57"
  local line
  line=$(grep -E 'tests passed(, [0-9]+ tests? failed)? out of [0-9]+' "$1" | tail -1)
  if [[ -z "$line" ]]; then failed=$((failed + 1)); status=1; return; fi
  local f=0 t
  if [[ "$line" =~ ([0-9]+)\ tests?\ failed ]]; then f=${BASH_REMATCH[1]}; fi
  t=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  passed=$((passed + t - f))
  failed=$((failed + f))
}

count_pytest() {  # "12 passed, 1 failed in 3.2s"
  local p f
  p=$(grep -oE '[0-9]+ passed' "$1" | tail -1 | grep -oE '[0-9]+' || echo 0)
  f=$(grep -oE '[0-9]+ (failed|error)' "$1" | tail -1 | grep -oE '[0-9]+' || echo 0)
  passed=$((passed + p))
  failed=$((failed + f))
}

# run_preset PRESET [TARGET [CTEST ARGS...]]: configure, build TARGET (default: everything),
# run ctest with the arguments, count the results.
run_preset() {
  local preset=$1 target=${2:-all}
  shift $(( $# < 2 ? $# : 2 ))
  local start=$SECONDS
  echo "=== ${preset}: configure and build (${target})"
  if ! cmake --preset "$preset" >"$log_dir/$preset-configure.log" 2>&1; then
    cat "$log_dir/$preset-configure.log"
    echo "${preset}: configure FAILED"
    failed=$((failed + 1)); status=1; return
  fi
  if ! cmake --build --preset "$preset" --target "$target" -k 0 >"$log_dir/$preset-build.log" 2>&1; then
    # The compiler's own words: every failed target and the first errors, not the configure log.
    grep -E '^FAILED:|error:' "$log_dir/$preset-build.log" | head -n 40
    echo "${preset}: build FAILED (whole log: $log_dir/$preset-build.log)"
    failed=$((failed + 1)); status=1; return
  fi
  tail -n 1 "$log_dir/$preset-build.log"
  echo "${preset}: built in $((SECONDS - start)) s"
  start=$SECONDS
  echo "=== ${preset}: ctest $*"
  ctest --preset "$preset" "$@" 2>&1 | tee "$log_dir/$preset-ctest.log" |
    grep -vE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed|^ *Start +[0-9]+: '
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  count_ctest "$log_dir/$preset-ctest.log"
  echo "${preset}: tests ran in $((SECONDS - start)) s"
}

echo "=== format: clang-format --dry-run on every C++ file"
if command -v clang-format >/dev/null; then
  if git ls-files '*.cc' '*.h' | xargs clang-format --dry-run -Werror 2>"$log_dir/format.log"; then
    passed=$((passed + 1)); echo "format: clean"
  else
    failed=$((failed + 1)); status=1
    head -n 20 "$log_dir/format.log"; echo "format: run 'make format'"
  fi
fi

# The optimised dev build compiles the libraries, the CLI and the Python parts with -Werror and
# runs what only it can run: the Python package inside Debian's python3 with the c10 hook
# (a sanitized module cannot load there). Every other test — unit, CLI, integration, browser,
# deploy — runs once, in the sanitizer build. `ctest --preset dev` after a full dev build runs
# them all unsanitized, as a developer does.
run_preset dev python_test_deps -L python
run_preset asan-ubsan

echo "=== pytest tools/tests"
/usr/bin/python3 -m pytest -q tools/tests 2>&1 | tee "$log_dir/pytest.log" | tail -n 5
rc=${PIPESTATUS[0]}
if [[ $rc -ne 0 && $rc -ne 5 ]]; then status=1; fi
count_pytest "$log_dir/pytest.log"

echo "=== user env: pip install . and the Python package on PyPI's torch 2.13"
start=$SECONDS
if user_env=$(tools/setup_user_env.sh 2>"$log_dir/user-env-setup.log" | tail -n 1) &&
   [[ -x "$user_env/bin/python" ]]; then
  FRAGSCOPE_SOURCE_DIR=$PWD "$user_env/bin/python" -m pytest -q -p no:cacheprovider \
    tests/user_env 2>&1 | tee "$log_dir/user-env.log" | tail -n 5
  rc=${PIPESTATUS[0]}
  if [[ $rc -ne 0 ]]; then status=1; fi
  count_pytest "$log_dir/user-env.log"
else
  cat "$log_dir/user-env-setup.log"
  echo "user env: setup FAILED"
  failed=$((failed + 1)); status=1
fi

echo "user env: $((SECONDS - start)) s (venv, wheel build and tests)"

echo
echo "TOTAL: ${passed} passed, ${failed} failed (${SECONDS} s)"
[[ $failed -eq 0 ]] || status=1
exit $status
