#!/usr/bin/env bash
# The environment a fragscope user trains in, for the tests of the pip route (issue 28,
# docs/python.md): a venv of Python 3.11 with PyPI's CPU torch 2.13.0 and the frameworks,
# pinned. The tests install fragscope into throwaway venvs that see these packages; the venv
# itself never holds fragscope. Idempotent: a stamp of the pins; prints the venv's path last.
# jax/jaxlib: fragscope.jax's tests (tests/user_env/test_jax_keras.py, issue 32 item 4).
# Usage: tools/setup_user_env.sh   (FRAGSCOPE_USER_ENV overrides the place,
#        FRAGSCOPE_USER_PYTHON the interpreter)
set -euo pipefail
pins=(torch==2.13.0 lightning==2.6.6 pytorch-lightning==2.6.6 transformers==5.17.0
      tensorflow-cpu==2.21.0 jax==0.10.2 jaxlib==0.10.2
      accelerate==1.15.0 pytest numpy scikit-build-core pybind11 cmake ninja)
dir=${FRAGSCOPE_USER_ENV:-$HOME/.cache/fragscope/user-env-py311}
python=${FRAGSCOPE_USER_PYTHON:-}
if [[ -z "$python" ]]; then
  for candidate in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$(command -v "$candidate"); break; fi
  done
fi
if [[ -z "$python" ]]; then
  echo "setup_user_env: no Python 3.11 found (PyPI's torch 2.13.0 CPU wheel on this machine is" \
       "for 3.11); set FRAGSCOPE_USER_PYTHON" >&2
  exit 1
fi
stamp="$dir/.fragscope-pins"
want="$("$python" -c 'import sys; print(sys.version.split()[0])') ${pins[*]}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "$dir"
  exit 0
fi
# Same Python, other pins (one was added): install the pins into the venv as it is, which
# downloads only what changed; another Python, or no venv yet: a new venv.
if [[ -f "$stamp" && "$(cut -d' ' -f1 "$stamp")" == "${want%% *}" && -x "$dir/bin/python" ]]; then
  echo "setup_user_env: updating $dir to ${pins[*]}" >&2
else
  echo "setup_user_env: creating $dir with ${pins[*]}" >&2
  rm -rf "$dir"
  "$python" -m venv "$dir"
fi
# A plain `torch` would pull a multi-GB CUDA build: the pin takes the CPU wheel.
"$dir/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" >&2
echo "$want" >"$stamp"
echo "$dir"
