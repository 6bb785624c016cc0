"""The BFC model against the real TensorFlow BFC allocator (issue 32 item 3).

A small recorded sequence runs in real TensorFlow (tensorflow_cpu with TF_CPU_ALLOCATOR_USE_BFC
and a limit) and, through the log of every request the allocator saw, in `fragscope replay
--allocator bfc` of the installed wheel: both must run out of memory at the same request and
hold the same chunks then (tools/bfc_fidelity.py does the work; docs/benchmarks.md has the
table of every sequence).
"""
import importlib.util
import os
import sys

import pytest

from conftest import SOURCE_DIR

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="tensorflow is not installed in this environment (tools/setup_user_env.sh pins "
           "tensorflow-cpu); the BFC model cannot be compared with the real allocator")


def _tool():
    spec = importlib.util.spec_from_file_location(
        "bfc_fidelity", os.path.join(SOURCE_DIR, "tools", "bfc_fidelity.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sequence", ["split-rule", "fragmentation-oom"])
def test_the_model_ends_in_tensorflows_chunks_and_oom(installed, tmp_path, sequence):
    tool = _tool()
    result = tool.compare(sequence, sys.executable, os.path.join(installed.bin, "fragscope"),
                          str(tmp_path))
    assert result["tf_oom"] is not None, "TensorFlow did not run out of memory"
    assert result["model_oom"] == result["tf_oom"], result
    assert result["tf_map"], "TensorFlow dumped no chunk map"
    assert result["model_map"] == result["tf_map"]
