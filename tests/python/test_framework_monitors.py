"""The framework-neutral half of the JAX and Keras monitors (issue 32 item 4), in any
interpreter: `import fragscope` pulls in no framework, fragscope.jax and fragscope.keras say what
is missing where JAX or TensorFlow is, the BFC statistics become a sample by the allocator's
rules, and a recommendation file sets only the variables its framework reads. The monitors with
the real jax 0.10.2 and tensorflow-cpu 2.21 are tests/user_env/test_jax_keras.py (the user env's
interpreter; skipped there too if the env lacks them)."""
import importlib.util
import json
import subprocess
import sys

import pytest

import conftest

from fragscope import _monitor
from fragscope_agent import sample_from_bfc_stats

MiB = 1 << 20


def python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=conftest.subprocess_env(), timeout=120)


def test_import_fragscope_and_the_monitor_core_import_no_framework():
    proc = python("import sys, fragscope, fragscope._monitor, fragscope_agent\n"
                  "print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'keras')"
                  " if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("module,needs", [("fragscope.jax", "JAX"),
                                          ("fragscope.keras", "TensorFlow and Keras")])
def test_a_monitor_without_its_framework_says_what_is_missing(module, needs):
    # The framework is made unimportable, whether or not this interpreter has it.
    proc = python("import sys\n"
                  "sys.modules.update(jax=None, keras=None, tensorflow=None)\n"
                  "try:\n"
                  "    import {}\n"
                  "except ImportError as e:\n"
                  "    print(e)\n".format(module))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("{} needs {}".format(module, needs)), proc.stdout


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed for {} (the user env has it: "
                           "tests/user_env/test_jax_keras.py)".format(sys.executable))
def test_import_fragscope_jax_imports_no_torch():
    proc = python("import sys, fragscope.jax\nprint('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_bfc_statistics_become_a_sample_by_the_allocators_rules():
    limit, pool, used, largest = 1024 * MiB, 600 * MiB, 500 * MiB, 40 * MiB
    stats = {"bytes_in_use": used, "peak_bytes_in_use": used + MiB, "pool_bytes": pool,
             "peak_pool_bytes": pool, "largest_free_block_bytes": largest,
             "bytes_limit": limit, "num_allocs": 7, "largest_alloc_size": 3 * MiB}
    s = sample_from_bfc_stats(stats, step=4)
    assert (s["allocated_bytes"], s["reserved_bytes"], s["cached_free_bytes"]) == \
        (used, pool, pool - used)
    assert s["device_free_bytes"] == limit - pool  # what the pool can still grow by
    # A new region can serve any request up to limit - pool: more than the largest chunk.
    assert s["max_allocatable"] == limit - pool
    assert (s["num_allocs"], s["largest_alloc_size"], s["step"]) == (7, 3 * MiB, 4)
    # Preallocated (JAX's default): the pool is the limit, only the chunks count.
    full = sample_from_bfc_stats(dict(stats, pool_bytes=limit))
    assert full["max_allocatable"] == largest and full["device_free_bytes"] == 0
    # The growth left is counted in whole 256-byte units, as BFC rounds requests.
    odd = sample_from_bfc_stats(dict(stats, pool_bytes=limit - 1000, largest_free_block_bytes=0))
    assert odd["max_allocatable"] == 768
    # cuda_malloc_async reports bytes_reserved, not pool_bytes; no limit: no capacity.
    async_pool = sample_from_bfc_stats({"bytes_in_use": used, "bytes_reserved": pool})
    assert async_pool["reserved_bytes"] == pool and "device_free_bytes" not in async_pool
    assert "max_allocatable" not in async_pool
    assert sample_from_bfc_stats({}) == {}


ALLOWED = ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE")


def write(tmp_path, rec):
    (tmp_path / _monitor.RECOMMENDATION_FILE).write_text(json.dumps(rec))


def test_a_recommendation_sets_only_its_frameworks_variables(tmp_path, capsys):
    good = {"framework": "jax", "step": 150, "worst_rank": 0, "worst_level": "warning",
            "env": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}}
    for bad, why in [(dict(good, framework="tensorflow"), "made for 'tensorflow'"),
                     (dict(good, env={"LD_PRELOAD": "/tmp/x.so"}), "'LD_PRELOAD' is not one"),
                     (dict(good, env={"XLA_PYTHON_CLIENT_ALLOCATOR": "a b;c"}), "plain value"),
                     (dict(good, env={}), "expected an object"),
                     (["not", "an", "object"], "expected a JSON object")]:
        write(tmp_path, bad)
        environ = {}
        assert _monitor.apply_env_recommendation(str(tmp_path), "jax", ALLOWED, False,
                                                 environ) is None
        assert environ == {}
        assert why in capsys.readouterr().err
    write(tmp_path, good)
    environ = {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}
    # Too late: the framework read its variables already; nothing is set, and it says so.
    assert _monitor.apply_env_recommendation(str(tmp_path), "jax", ALLOWED, True,
                                             environ) is None
    assert environ == {"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}
    assert "comes too late" in capsys.readouterr().err
    assert _monitor.apply_env_recommendation(str(tmp_path), "jax", ALLOWED, False,
                                             environ) == good["env"]
    assert environ == good["env"]
    err = capsys.readouterr().err
    assert "applied the recommendation of step 150" in err and "'bfc'" in err, err
