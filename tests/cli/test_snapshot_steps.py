"""Steps and wall-clock time of PyTorch memory snapshots (issue 29 item 8; docs/snapshots.md,
"Steps and time").

A snapshot records no step markers, but its external_annotations (record_function ranges such
as Optimizer.step#AdamW.step or ProfilerStep#N, with time_us) and, in PyTorch 2.11+, its
`annotate` entries tell where steps begin. `analyze`, `report`, `convert` and `replay` of such a
snapshot follow those steps. The snapshots here are written by the test (pickle.dumps of plain
dicts, as torch.cuda.memory._dump_snapshot writes them); expected figures follow from how they
are built. The last test reads the real snapshots in ../shared/snapshots in place (skipped when
absent) and derives what to expect from their annotations with a data-only unpickler.
"""

import json
import os
import pickle
import re
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
REAL = os.path.normpath(os.path.join(SOURCE_DIR, "..", "shared", "snapshots", "real"))

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")

MiB = 1 << 20
SEG = 0x7F0000000000
SEG_SIZE = 64 * MiB
T0 = 1_708_187_029_490_966  # time_us of the first entry
SIZES = [4 * MiB, 12 * MiB, 6 * MiB, 20 * MiB, 2 * MiB]  # each step's one allocation


def run(*args):
    return subprocess.run([BIN, *map(str, args)], cwd=SOURCE_DIR, capture_output=True,
                          text=True, timeout=300)


def build(marker="optimizer", timed=True):
    """One device, one 64 MiB segment made in the history. Step k allocates SIZES[k] and, but
    for the last step, frees it; entries are 10 us apart. Between two steps: an
    Optimizer.step START/END pair (marker "optimizer"), a ProfilerStep#(100 + k) START before
    step k (marker "profiler"), or an annotate entry "step k" (marker "annotate").
    Returns (snapshot dict, the time_us of each step's last entry)."""
    entries, annotations, last_times = [], [], []
    t = T0

    def entry(action, size, **extra):
        nonlocal t
        e = {"action": action, "addr": SEG, "size": size, "stream": 0, "frames": []}
        if timed:
            e["time_us"] = t
        e.update(extra)
        t += 10
        entries.append(e)

    def annotation(stage, name, time_us):
        annotations.append({"stage": stage, "name": name, "device": 0, "time_us": time_us})

    entry("segment_alloc", SEG_SIZE)
    for k, size in enumerate(SIZES):
        if marker == "profiler":
            annotation("START", f"ProfilerStep#{100 + k}", t - 5)
        if marker == "annotate":
            entries.append({"action": "annotate", "addr": SEG, "size": 0,
                            "user_metadata": f"step {k}"})
        entry("alloc", size)
        if k + 1 < len(SIZES):
            entry("free_requested", size)
            entry("free_completed", size)
            if marker == "optimizer":
                annotation("START", "Optimizer.step#AdamW.step", t - 8)
                annotation("END", "Optimizer.step#AdamW.step", t - 5)
        last_times.append(t - 10)
    annotation("START", "Optimizer.zero_grad#AdamW.zero_grad", T0 - 100)  # names no step
    last = SIZES[-1]
    blocks = [
        {"address": SEG, "size": last, "requested_size": last, "state": "active_allocated",
         "frames": []},
        {"address": SEG + last, "size": SEG_SIZE - last, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]
    segment = {"device": 0, "address": SEG, "total_size": SEG_SIZE, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
               "allocated_size": last, "active_size": last, "requested_size": last,
               "blocks": blocks}
    snap = {"segments": [segment], "device_traces": [entries],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
            "external_annotations": annotations}
    return snap, last_times


def write(tmp_path, snap, name="steps.pickle"):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def analyze_json(path, *args):
    r = run("analyze", path, "--json", "--no-map", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_optimizer_step_ends_give_one_timeline_row_per_step(tmp_path):
    snap, last_times = build("optimizer")
    path = write(tmp_path, snap)
    j = analyze_json(path)
    assert j["steps"] == len(SIZES)
    assert j["timeline_unit"] == "step"
    [device] = j["devices"]
    timeline = device["timeline"]
    assert [s["step_first"] for s in timeline] == list(range(len(SIZES)))
    # Each step's own peak, and the window ends at the step's last entry.
    assert [s["peak_allocated_bytes"] for s in timeline] == SIZES
    assert [s["time_us"] for s in timeline] == last_times
    assert device["peak_allocated"]["bytes"] == max(SIZES)
    assert device["peak_allocated"]["when"]["step"] == SIZES.index(max(SIZES))
    assert any(n.startswith(f"steps: {len(SIZES)} steps marked in device 0's history, from "
                            f"{len(SIZES) - 1} ends of Optimizer.step#AdamW.step")
               for n in j["notes"]), j["notes"]

    text = run("analyze", path, "--no-map").stdout
    assert f"{len(SIZES)} steps, 1 device; timeline: one row per step" in text, text
    assert re.search(r"peak allocated\s+20\.0 MiB\s+event [\d,]+, step 3,", text), text


def test_profiler_step_starts_number_the_steps(tmp_path):
    snap, _ = build("profiler")
    j = analyze_json(write(tmp_path, snap))
    timeline = j["devices"][0]["timeline"]
    # The segment_alloc comes before ProfilerStep#100: it is the setup's.
    assert [s["step_first"] for s in timeline] == [-1] + [100 + k for k in range(len(SIZES))]
    assert [s["peak_allocated_bytes"] for s in timeline[1:]] == SIZES


def test_annotate_entries_mark_steps_without_times(tmp_path):
    snap, _ = build("annotate", timed=False)
    j = analyze_json(write(tmp_path, snap))
    timeline = j["devices"][0]["timeline"]
    assert [s["step_first"] for s in timeline] == [-1] + list(range(len(SIZES)))
    assert [s["peak_allocated_bytes"] for s in timeline[1:]] == SIZES
    assert all(s["time_us"] is None for s in timeline)


def test_annotations_without_times_are_a_note_not_steps(tmp_path):
    snap, _ = build("optimizer", timed=False)
    j = analyze_json(write(tmp_path, snap))
    assert j["steps"] == 0 and j["timeline_unit"] == "events"
    assert any("records no time_us" in n for n in j["notes"]), j["notes"]


def test_report_carries_steps_and_wall_clock_time(tmp_path):
    snap, last_times = build("optimizer")
    out = tmp_path / "r.html"
    r = run("report", write(tmp_path, snap), "-o", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="fragscope-data">(.*?)</script>', html,
                  re.S)
    data = json.loads(m.group(1))
    assert data["timeline_unit"] == "step" and data["steps"] == len(SIZES)
    # Seconds since the first entry, as the page's x axis counts them.
    assert data["first_time_us"] == T0
    series = data["devices"][0]["series"]
    assert series["step_first"] == list(range(len(SIZES)))
    assert [(t - data["first_time_us"]) / 1e6 for t in series["time_us"]] == \
        [(t - T0) / 1e6 for t in last_times]


def test_convert_and_replay_keep_the_steps(tmp_path):
    snap, _ = build("optimizer")
    path = write(tmp_path, snap)
    trace = tmp_path / "t.jsonl"
    r = run("convert", path, "-o", trace)
    assert r.returncode == 0, r.stderr
    steps = [json.loads(line) for line in trace.read_text().splitlines()
             if '"action":"step"' in line]
    assert [s["step"] for s in steps] == list(range(len(SIZES)))
    # The converted trace analyzes into the same timeline as the snapshot.
    assert analyze_json(trace)["devices"][0]["timeline"] == \
        analyze_json(path)["devices"][0]["timeline"]
    # A replay of the snapshot's requests follows the same steps.
    r = run("replay", path, "--json", "--no-map")
    assert r.returncode == 0, r.stderr
    analysis = json.loads(r.stdout)["analysis"]
    assert analysis["steps"] == len(SIZES)
    assert [s["peak_allocated_bytes"] for s in analysis["devices"][0]["timeline"]] == SIZES


class _DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def expected_steps(snap):
    """What docs/snapshots.md says the steps of a one-device snapshot are, with only
    Optimizer.step annotations (all the real files have): step 0, then one more for each end
    before the history's last entry; none if no end falls before it."""
    if not isinstance(snap, dict):
        return 0
    traces = [t for t in snap.get("device_traces", []) if t]
    ends = [a["time_us"] for a in snap.get("external_annotations") or []
            if a.get("stage") == "END" and a.get("name", "").startswith("Optimizer.step#")]
    if len(traces) != 1 or not ends:
        return 0
    names = [a["name"] for a in snap["external_annotations"]
             if a.get("stage") == "END" and a.get("name", "").startswith("Optimizer.step#")]
    ends = [t for t, n in zip(ends, names) if n == names[0]]
    times = [e["time_us"] for e in traces[0] if "time_us" in e]
    if not times:
        return 0
    inside = [t for t in ends if t < times[-1]]
    if not inside:
        return 0
    before = [t for t in inside if t < times[0]]
    return 1 + len(inside) - len(before)


@pytest.mark.skipif(not os.path.isdir(REAL), reason=f"{REAL} is absent")
def test_real_snapshots_get_the_steps_their_annotations_give():
    seen = {}
    for name in sorted(os.listdir(REAL)):
        with open(os.path.join(REAL, name), "rb") as f:
            expected = expected_steps(_DataOnly(f).load())
        j = analyze_json(os.path.join(REAL, name))
        seen[name] = (j["steps"], expected)
    assert all(got == want for got, want in seen.values()), seen
    assert any(want > 1 for _, want in seen.values()), seen  # the corpus has one at least
