"""Tests for tools/capture_trace.py.

Run with Debian's interpreter (it has python3-torch and python3-pytest):

    /usr/bin/python3 -m pytest tools/tests
"""

import gzip
import json
import subprocess
import sys
from time import time_ns
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "capture_trace.py"
REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "tests" / "data" / "sample"

# A model small enough that two steps take about a second.
TINY = ["--d-model", "32", "--n-layer", "2", "--n-head", "2",
        "--vocab-size", "256", "--batch-size", "2",
        "--min-seq-len", "8", "--max-seq-len", "48"]

HEADER_KEYS = ["format", "version", "kind", "producer", "devices", "labels",
               "allocator_settings"]
EVENT_KEYS = {
    "frame": (["action", "id", "name"], []),
    "alloc": (["action", "addr", "size", "time_us"], ["frame"]),
    "free_requested": (["action", "addr", "size", "time_us"], []),
    "step": (["action", "step"], []),
}


def run_tool(out, *extra, steps=2):
    cmd = [sys.executable, str(TOOL), "--steps", str(steps), "-o", str(out)]
    cmd += TINY + list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def read_lines(path):
    path = str(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    assert text.endswith("\n")
    return text[:-1].split("\n")


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def validate(lines, architecture="gpt"):
    """Check a request trace against fragscope trace v1; return a summary."""
    assert lines, "empty trace"
    header = json.loads(lines[0])
    assert list(header) == HEADER_KEYS
    assert header["format"] == "fragscope-trace"
    assert header["version"] == 1
    assert header["kind"] == "request"
    assert header["producer"].startswith("tools/capture_trace.py")
    assert header["devices"] == [{"device": 0, "name": "cpu-virtual-gpu"}]
    assert list(header["labels"]) == ["model", "architecture", "run",
                                      "dtype"]
    assert header["labels"]["architecture"] == architecture
    assert header["labels"]["dtype"] == "float32"
    assert header["allocator_settings"] == {}

    frames = set()
    live = {}
    steps = []
    last_time = 0
    n_alloc = n_free = 0
    for lineno, line in enumerate(lines[1:], start=2):
        assert line, "blank line {}".format(lineno)
        ev = json.loads(line)
        where = "line {}: {}".format(lineno, line)
        assert isinstance(ev, dict), where
        # Compact separators and key order exactly as written by the spec.
        assert json.dumps(ev, separators=(",", ":")) == line, where
        action = ev.get("action")
        assert action in EVENT_KEYS, where
        required, optional = EVENT_KEYS[action]
        keys = list(ev)
        assert keys[:len(required)] == required, where
        assert keys[len(required):] in ([], optional), where
        for key in keys[1:]:
            if key != "name":
                assert is_int(ev[key]), where
        if action == "frame":
            assert ev["id"] == len(frames), where  # small ints from 0
            assert isinstance(ev["name"], str) and ev["name"], where
            frames.add(ev["id"])
        elif action == "step":
            assert ev["step"] == len(steps), where
            steps.append(ev["step"])
        else:
            assert ev["size"] > 0, where
            assert ev["time_us"] >= last_time, where
            last_time = ev["time_us"]
            if action == "alloc":
                assert ev["addr"] not in live, where
                if "frame" in ev:
                    assert ev["frame"] in frames, where
                live[ev["addr"]] = ev["size"]
                n_alloc += 1
            else:
                assert ev["addr"] in live, where
                assert live.pop(ev["addr"]) == ev["size"], where
                n_free += 1
    return {"header": header, "steps": steps, "alloc": n_alloc,
            "free": n_free, "live_at_end": len(live), "frames": len(frames)}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("capture") / "trace.jsonl.gz"
    stderr = run_tool(out, "--run", "pytest")
    return out, stderr


def test_help_works_without_training():
    proc = subprocess.run([sys.executable, str(TOOL), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "--steps" in proc.stdout and "-o PATH" in proc.stdout


def test_two_step_capture_is_valid(captured):
    out, stderr = captured
    with open(out, "rb") as fh:
        assert fh.read(2) == b"\x1f\x8b"  # gzip when the path ends in .gz
    summary = validate(read_lines(out))
    assert summary["steps"] == [0, 1]
    assert summary["header"]["labels"]["run"] == "pytest"
    assert summary["alloc"] > 100
    assert summary["frames"] > 0
    # The teardown frees everything the capture allocated.
    assert summary["free"] == summary["alloc"]
    assert summary["live_at_end"] == 0
    assert "0 unmatched frees" in stderr


def test_steps_split_by_marker_and_clock_agree(captured):
    _, stderr = captured
    assert "0 records whose time-based step differs" in stderr
    assert "0 record_function nodes" in stderr
    assert "0 records out of time order" in stderr


def test_every_step_trains(captured):
    out, _ = captured
    lines = read_lines(out)
    allocs_per_step = {}
    step = None
    for line in lines[1:]:
        ev = json.loads(line)
        if ev["action"] == "step":
            step = ev["step"]
            allocs_per_step[step] = 0
        elif ev["action"] == "alloc" and step is not None:
            allocs_per_step[step] += 1
    # Forward, backward and the Adam update all allocate in every step.
    assert all(n > 50 for n in allocs_per_step.values()), allocs_per_step


def test_plain_output_keep_cpu_only_no_frames(tmp_path, captured):
    out = tmp_path / "trace.jsonl"
    run_tool(out, "--keep-cpu-only", "--no-frames", "--seed", "3")
    with open(out, "rb") as fh:
        assert fh.read(1) == b"{"
    lines = read_lines(out)
    summary = validate(lines)
    assert summary["steps"] == [0, 1]
    assert summary["frames"] == 0
    assert summary["live_at_end"] == 0
    # Keeping the CPU-only scalars adds allocations, all of them tiny.
    dropped = validate(read_lines(captured[0]))
    assert summary["alloc"] > dropped["alloc"]


def test_capture_is_deterministic(tmp_path, captured):
    out = tmp_path / "again.jsonl.gz"
    run_tool(out, "--run", "pytest")

    def without_time(path):
        return [line.split(',"time_us"')[0] for line in read_lines(path)[1:]]

    assert without_time(out) == without_time(captured[0])


@pytest.mark.parametrize("workload,extra", [
    ("cnn", ["--min-batch", "2", "--max-batch", "5", "--image-size", "16",
             "--cnn-width", "4"]),
    ("moe", ["--n-experts", "3"]),
    ("kv-server", ["--arrival-rate", "2", "--max-arrivals", "3"]),
    ("detect", ["--min-batch", "1", "--max-batch", "2", "--min-image", "32",
                "--max-image", "96", "--cnn-width", "4"]),
])
def test_other_workloads_capture_valid_traces(tmp_path, workload, extra):
    """Every workload trains or serves for real, frees all it allocated, and
    marks its steps; the header names its architecture."""
    pytest.importorskip("torch")
    out = tmp_path / (workload + ".jsonl")
    stderr = run_tool(out, "--workload", workload, *extra, steps=3)
    summary = validate(read_lines(out), architecture=workload)
    assert summary["steps"] == [0, 1, 2]
    assert summary["alloc"] > 20
    assert summary["free"] == summary["alloc"]
    assert summary["live_at_end"] == 0
    assert "0 records whose time-based step differs" in stderr
    assert "workload={}".format(workload) in summary["header"]["producer"]


def test_variable_shapes_change_the_requests(tmp_path):
    """A variable batch changes the request sizes from step to step; a fixed
    one repeats them (the property the forecast evaluation relies on)."""
    pytest.importorskip("torch")
    sizes = {}
    for name, lo, hi in (("fixed", 4, 4), ("varied", 2, 9)):
        out = tmp_path / (name + ".jsonl")
        run_tool(out, "--workload", "cnn", "--min-batch", str(lo),
                 "--max-batch", str(hi), "--image-size", "16",
                 "--cnn-width", "4", "--seed", "1", steps=4)
        per_step = []
        for line in read_lines(out)[1:]:
            ev = json.loads(line)
            if ev["action"] == "step":
                per_step.append(set())
            elif ev["action"] == "alloc" and per_step:
                per_step[-1].add(ev["size"])
        sizes[name] = per_step
    # Step 0 makes the optimizer state; steps 1.. repeat under a fixed batch.
    assert sizes["fixed"][1] == sizes["fixed"][2] == sizes["fixed"][3]
    assert len({frozenset(s) for s in sizes["varied"][1:]}) > 1


@pytest.mark.parametrize("name,steps", [("gpt_tiny_3steps.jsonl.gz", 3),
                                        ("gpt_tiny_50steps.jsonl.gz", 50)])
def test_bundled_samples_are_valid(name, steps):
    path = SAMPLES / name
    if not path.exists():
        pytest.skip("bundled sample {} not present".format(name))
    assert path.stat().st_size <= 5 * 1024 * 1024
    summary = validate(read_lines(path))
    assert summary["steps"] == list(range(steps))
    assert summary["live_at_end"] == 0


def test_profiler_clock_matches_time_ns():
    """The step boundaries rest on the profiler's allocation timestamps and
    time.time_ns() using one clock: a time.time_ns() reading taken between
    two allocations must fall between their profiler timestamps."""
    torch = pytest.importorskip("torch")
    readings = []
    keep = []
    prof = torch.autograd.profiler.profile(profile_memory=True)
    prof.__enter__()
    try:
        for i in range(200):
            keep.append(torch.empty(16 + i))
            readings.append(time_ns())
    finally:
        result = torch.autograd._disable_profiler()
    del keep
    stamps = []
    stack = list(result.experimental_event_tree())
    while stack:
        node = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            if fields.alloc_size > 0:
                stamps.append(node.start_time_ns)
        stack.extend(node.children)
    stamps.sort()
    assert len(stamps) == len(readings)
    for i in range(len(readings) - 1):
        assert stamps[i] <= readings[i] <= stamps[i + 1]


def test_write_trace_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    # Issue 24 item 4: the temporary was OUT.tmp, opened with open(..., "wb"): a link planted
    # there had what it points to overwritten.
    monkeypatch.syspath_prepend(str(TOOL.parent))
    import capture_trace
    victim = tmp_path / "victim"
    victim.write_bytes(b"must stay as it is\n")
    out = tmp_path / "trace.jsonl.gz"
    (tmp_path / "trace.jsonl.gz.tmp").symlink_to(victim)
    capture_trace.write_trace(str(out), {"format": "fragscope-trace", "version": 1},
                              [{"action": "step", "step": 0}])
    assert victim.read_bytes() == b"must stay as it is\n"
    with gzip.open(out, "rt") as f:
        assert [json.loads(line) for line in f][1] == {"action": "step", "step": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.jsonl.gz", "trace.jsonl.gz.tmp",
                                                         "victim"]
