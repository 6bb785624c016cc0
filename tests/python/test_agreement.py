"""Agreement with the offline path (docs/virtual-gpu.md): the same program captured with
tools/capture_trace.py and replayed with `fragscope replay` gives exactly the memory_stats(),
the segments with their blocks, and the OOM that the live virtual GPU reports
(tools/run_on_virtual_gpu.py runs the program live).  Small models, few steps: CPU time is
scarce."""
import json
import os
import subprocess

import pytest

from conftest import PYTHON, TOOLS_DIR, replay_json, subprocess_env

pytest.importorskip("torch")

SMALL_GPT = ["--max-seq-len", "64", "--min-seq-len", "16", "--n-layer", "2", "--d-model", "64",
             "--n-head", "4", "--vocab-size", "512", "--batch-size", "4"]
WORKLOADS = {
    "gpt": ["--workload", "gpt", "--steps", "3"] + SMALL_GPT,
    "cnn": ["--workload", "cnn", "--steps", "2", "--image-size", "16", "--cnn-width", "4",
            "--min-batch", "4", "--max-batch", "12"],
    "moe": ["--workload", "moe", "--steps", "2", "--n-experts", "3"] + SMALL_GPT,
    "kv-server": ["--workload", "kv-server", "--steps", "4", "--arrival-rate", "2",
                  "--max-arrivals", "3"] + SMALL_GPT,
}
# (workload, capacity, alloc_conf): one OOM case (the GPT on a 9 MiB device), the rest fit.
CASES = [
    ("gpt", "1GiB", ""),
    ("gpt", "9MiB", ""),
    ("gpt", "1GiB", "max_split_size_mb:21,roundup_power2_divisions:4"),
    ("cnn", "1GiB", ""),
    ("moe", "1GiB", ""),
    ("kv-server", "1GiB", "garbage_collection_threshold:0.5"),
]
BLOCK_KEYS = ("address", "size", "requested_size", "state")
SEGMENT_KEYS = ("address", "total_size", "allocated_size", "active_size", "requested_size",
                "segment_type", "is_expandable")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """Captures each workload once (lazily)."""
    directory = tmp_path_factory.mktemp("captures")
    traces = {}

    def get(workload):
        if workload not in traces:
            path = str(directory / (workload + ".jsonl"))
            proc = subprocess.run(
                [PYTHON, os.path.join(TOOLS_DIR, "capture_trace.py"), "-o", path]
                + WORKLOADS[workload], capture_output=True, text=True, timeout=600,
                env=subprocess_env())
            assert proc.returncode == 0, proc.stderr
            traces[workload] = path
        return traces[workload]
    return get


def live(tmp_path, workload, capacity, alloc_conf):
    out = str(tmp_path / "live.json")
    proc = subprocess.run(
        [PYTHON, os.path.join(TOOLS_DIR, "run_on_virtual_gpu.py"), "--capacity", capacity,
         "--alloc-conf", alloc_conf, "--torch-version", "1.13", "--json", out]
        + WORKLOADS[workload], capture_output=True, text=True, timeout=600,
        env=subprocess_env())
    if "not built" in proc.stderr:
        pytest.skip(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def layout(segments):
    return [tuple(seg[k] for k in SEGMENT_KEYS)
            + (tuple(tuple(b[k] for k in BLOCK_KEYS) for b in seg["blocks"]),)
            for seg in segments]


@pytest.mark.parametrize("workload, capacity, alloc_conf", CASES)
def test_live_virtual_gpu_equals_capture_and_replay(captured, tmp_path, workload, capacity,
                                                     alloc_conf):
    got = live(tmp_path, workload, capacity, alloc_conf)
    want = replay_json(captured(workload), "--capacity", capacity, "--alloc-conf", alloc_conf,
                       "--torch-version", "1.13")
    device = want["devices"][0]
    assert got["memory_stats"] == device["memory_stats"]
    assert layout(got["segments"]) == layout(device["segments"])
    assert [o["message"] for o in got["ooms"]] == [o["message"] for o in want["ooms"]]
    if want["oom"] is not None:
        assert got["ooms"][0]["step"] == want["oom"]["step"]
        assert got["ooms"][0]["requested_bytes"] == want["oom"]["requested_bytes"]
    else:
        assert got["memory_stats"]["num_ooms"] == 0
        assert got["memory_stats"]["allocation.all.allocated"] > 100  # the run did something
