"""Shared set-up of the virtual GPU tests: paths, the fragscope binary, and a skip (not a
failure) when the native module or torch is missing."""
import os
import subprocess
import sys

import pytest

SOURCE_DIR = os.environ.get("FRAGSCOPE_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(SOURCE_DIR, "python")
TOOLS_DIR = os.path.join(SOURCE_DIR, "tools")
for p in (PYTHON_DIR, TOOLS_DIR):
    if p not in sys.path:
        sys.path.insert(0, p)

PYTHON = "/usr/bin/python3"


def subprocess_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PYTHON_DIR, TOOLS_DIR])
    env.pop("FRAGSCOPE_VIRTUAL_GPU", None)
    env.update(extra)
    return env


def native_or_skip():
    """At a module's top: skips the module when torch or fragscope's native module is missing."""
    pytest.importorskip("torch")
    try:
        from fragscope import _native
        _native.load()
    except ImportError as e:
        pytest.skip(str(e), allow_module_level=True)


def integration_daemon():
    """tests/integration/test_serve.py's Daemon: a `fragscope serve` on a temporary socket."""
    path = os.path.join(SOURCE_DIR, "tests", "integration")
    if path not in sys.path:
        sys.path.insert(0, path)
    from test_serve import Daemon
    return Daemon


def fragscope_bin():
    path = os.environ.get("FRAGSCOPE_BIN")
    if not path:
        for preset in ("dev", "release"):
            candidate = os.path.join(SOURCE_DIR, "build", preset, "apps", "fragscope",
                                     "fragscope")
            if os.path.exists(candidate):
                return candidate
        pytest.skip("no fragscope binary (set FRAGSCOPE_BIN)")
    return path


def replay_json(trace, *args):
    """`fragscope replay TRACE --json ARGS` as a dict (exit 0 or 1: 1 = the run OOMs)."""
    import json
    proc = subprocess.run([fragscope_bin(), "replay", trace, "--json", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def fst():
    try:
        import fragscope.torch as module
    except ImportError as e:
        pytest.skip("fragscope.torch is not available: {}".format(e))
    return module
