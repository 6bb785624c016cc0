#!/usr/bin/env bash
# Installs what fragscope needs to build, test, fuzz and benchmark, from Debian's packages only.
# Idempotent: packages already installed are skipped, and apt-get runs only when one is missing.
# Usage: tools/install-deps.sh [--with-torch]   (python3-torch for tools/capture_trace.py, and
# libtorch-dev + pybind11-dev for the virtual GPU's native module: docs/virtual-gpu.md)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format ccache
  clang libclang-rt-dev            # libFuzzer for make fuzz
  libfmt-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libzstd-dev
  libsqlite3-dev                   # the history database (docs/history.md)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-pytest
  libcpp-httplib-dev               # fragscope serve's /metrics endpoint
  prometheus                       # integration test: a real Prometheus scrapes the daemon; promtool
  systemd                          # systemd-analyze verify deploy/systemd/fragscope.service
  libtomlplusplus-dev libssl-dev python3-yaml  # alert rules (TOML), https webhooks, deploy/ checks
  chromium                         # the HTML report's browser test (tests/browser, docs/report.md)
  tmux                             # `fragscope top` in a real terminal (tests/integration/test_top.py)
)
if [[ "${1:-}" == "--with-torch" ]]; then
  packages+=(python3-torch libopenblas0-pthread libtorch-dev pybind11-dev python3-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
