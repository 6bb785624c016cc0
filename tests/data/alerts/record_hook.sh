#!/bin/sh
# Test hook for tests/sinks/hook_runner_test.cc: copies its stdin to "$1.json" and its
# environment (NUL-separated, so values with newlines stay intact) to "$1.env", prints one
# line for the daemon's log, and exits with status ${2:-0}.
cat > "$1.json"
env -0 > "$1.env"
echo "recorded $FRAGSCOPE_ALERT_NAME $FRAGSCOPE_ALERT_STATE"
exit "${2:-0}"
