#!/bin/bash
# Server Scout plugin for fragscope: install as /opt/scout-agent/plugins.d/fragscope.sh.
# It asks the node daemon (`fragscope serve`) through `fragscope probe` for the worst OOM risk of
# the node's training processes, their fragmentation, and the largest free block against the
# largest request (docs/live-monitoring.md, "Monitoring systems").
#
#   detect   exit 0 when fragscope and a reachable daemon are there, else 1
#   collect  the probe's status line (Nagios-style, with performance data); returns its code
#            (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)
#   json     the same as JSON
#
# Settings (environment): FRAGSCOPE_BIN (default: fragscope on PATH, then
# /usr/local/bin/fragscope), FRAGSCOPE_METRICS_URL (default http://127.0.0.1:9464/metrics).

PLUGIN_TIER="${PLUGIN_TIER:-standard}"

_fragscope_bin() {
  if [ -n "${FRAGSCOPE_BIN:-}" ]; then
    echo "$FRAGSCOPE_BIN"
  elif command -v fragscope >/dev/null 2>&1; then
    command -v fragscope
  else
    echo /usr/local/bin/fragscope
  fi
}

_fragscope_url() {
  echo "${FRAGSCOPE_METRICS_URL:-http://127.0.0.1:9464/metrics}"
}

detect() {
  local bin
  bin=$(_fragscope_bin)
  [ -x "$bin" ] || return 1
  "$bin" probe --url "$(_fragscope_url)" --timeout 2 >/dev/null 2>&1
  [ $? -ne 3 ]  # UNKNOWN: no daemon to ask
}

collect() {
  "$(_fragscope_bin)" probe --url "$(_fragscope_url)" --timeout 2
}

json() {
  "$(_fragscope_bin)" probe --url "$(_fragscope_url)" --timeout 2 --json
}

# Run directly: `fragscope.sh detect|collect|json` (default collect).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  "${1:-collect}"
fi
