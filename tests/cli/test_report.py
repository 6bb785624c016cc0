"""Tests of `fragscope report` against the built binary (the page itself is checked in a real
browser by tests/browser/test_report_browser.py; docs/report.md).

Here: bad input gets analyze's messages and exit codes and writes nothing; an oversized report
is refused with the options that bound it and leaves no file; the page is self-contained and
its embedded data agrees with `analyze --json`; the kept memory maps are bounded.
"""

import json
import os
import re
import subprocess

import pytest

from report_page import page_data, unpack_ints

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
SAMPLE = "tests/data/sample/gpt_tiny_50steps.jsonl.gz"
CLI = "tests/data/cli/"

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args):
    return subprocess.run([BIN, *map(str, args)], cwd=SOURCE_DIR, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("fixture", [
    "bad_unknown_action.jsonl", "bad_empty.jsonl", "snapshot_truncated.pickle", "evil.pickle",
    "bad_overlapping_segments.jsonl", "no_such_file.jsonl"])
def test_bad_input_as_analyze_and_nothing_written(fixture, tmp_path):
    out = tmp_path / "r.html"
    a = run("analyze", CLI + fixture)
    r = run("report", CLI + fixture, "-o", out)
    assert r.returncode == a.returncode
    if a.returncode == 2:
        assert r.stderr.splitlines()[0] == a.stderr.splitlines()[0]
        assert not out.exists()
        assert os.listdir(tmp_path) == []


def test_request_trace_needs_a_capacity(tmp_path):
    r = run("report", SAMPLE, "-o", tmp_path / "r.html")
    assert r.returncode == 2
    assert "give --capacity SIZE" in r.stderr
    assert os.listdir(tmp_path) == []


def test_tune_needs_a_replay(tmp_path):
    r = run("report", CLI + "snapshot_small.pickle", "--tune", "-o", tmp_path / "r.html")
    assert r.returncode == 2
    assert "--tune" in r.stderr and "--capacity" in r.stderr


def test_oversized_report_is_refused_with_the_options_that_bound_it(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", SAMPLE, "--capacity", "520MiB", "--no-verify", "-o", out,
            "--max-size", "64KiB")
    assert r.returncode == 2
    for option in ("--max-frames", "--every", "--device", "--max-size"):
        assert option in r.stderr
    assert "nothing was written" in r.stderr
    assert os.listdir(tmp_path) == []


def test_page_is_self_contained_and_agrees_with_analyze(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", CLI + "allocator_basic.jsonl", "-o", out)
    assert r.returncode == 0, r.stderr
    html, data = page_data(out)
    # Nothing is fetched: no external script, style, font or image.
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)
    assert "@import" not in html and "url(http" not in html
    assert "default-src 'none'" in html
    a = json.loads(run("analyze", CLI + "allocator_basic.jsonl", "--json").stdout)
    assert len(data["devices"]) == len(a["devices"])
    for d, j in zip(data["devices"], a["devices"]):
        assert d["device"] == j["device"]
        assert d["num_ooms"] == j["ooms"]
        assert d["key"]["peak_reserved"]["bytes"] == j["peak_reserved"]["bytes"]
        assert len(d["series"]["reserved"]) == len(j["timeline"])
        assert d["frames"], "no memory map kept"
        # The final frame is the final layout analyze prints.
        final = d["frames"][-1]
        assert final["why"] == "end"
        assert len(final["segs"]) == len(j["layout"])
        # Block by block, unpacked (report_page.py, from docs/report.md): what analyze prints.
        states = {"free": 0, "allocated": 1, "pending_free": 2}
        for seg, want in zip(final["segs"], j["layout"]):
            assert seg[:5] == [want["addr"], want["size_bytes"], want["stream"],
                               0 if want["pool"] == "small" else 1, want["expandable"]]
            blocks = [seg[5][k:k + 5] for k in range(0, len(seg[5]), 5)]
            assert [(seg[0] + b[0], b[1], b[2], b[3]) for b in blocks] == [
                (w["addr"], w["size_bytes"], w["requested_bytes"] or 0,
                 3 if w["stranded"] else states[w["state"]]) for w in want["blocks"]]


def test_replayed_oom_has_the_panel_and_verified_remedies(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", SAMPLE, "--capacity", "520MiB", "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    replay = json.loads(run("replay", SAMPLE, "--capacity", "520MiB", "--json", "--no-map").stdout)
    d = data["devices"][0]
    first = replay["analysis"]["devices"][0]["oom_diagnoses"][0]
    assert d["ooms"][0]["event"] == first["when"]["event_index"]
    assert data["verdict"].startswith(f"Out of memory at event {first['when']['event_index']:,}")
    assert any(f["why"] == "before_oom" and f["event"] == d["ooms"][0]["event"]
               for f in d["frames"])
    checked = [x for x in d["explain"]["remedies"] if "check" in x]
    assert checked, "no remedy was replayed"
    # On the sample at 520 MiB the proposed settings run out of memory earlier than the
    # defaults do: the page marks them worse (and ranks them last), not just "still OOM".
    assert all(isinstance(x["check"]["worse"], bool) for x in checked)
    worse = [x for x in checked if x["check"]["worse"]]
    assert worse and all(x["check"]["oom"] for x in worse)
    assert d["explain"]["remedies"][-len(worse):] == worse


def test_kept_maps_are_bounded(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", SAMPLE, "--capacity", "1GiB", "--max-frames", "4", "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    frames = data["devices"][0]["frames"]
    periodic = [f for f in frames if f["why"] == "periodic"]
    assert 2 <= len(periodic) <= 4
    assert frames[-1]["why"] == "end"
    events = [f["event"] for f in frames]
    assert events == sorted(events)
    # Spread over the run, not bunched at its start.
    assert periodic[-1]["event"] > data["total_events"] / 4


def test_two_devices_are_both_in_the_page(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", CLI + "two_devices.jsonl", "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    assert [d["device"] for d in data["devices"]] == [0, 1]
    assert all(d["frames"] for d in data["devices"])


def test_snapshot_oom_gets_explain_with_the_capacity_its_oom_recorded(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", "tests/data/snapshots/g2_oom.pickle", "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    d = data["devices"][0]
    assert d["explain"]["verdict"] == "shortage"
    assert d["explain"]["remedies"]
    # The capacity comes from the recorded OOM (reserved + driver free), as analyze takes it.
    assert any("capacity" in n and "recorded OOM" in n for n in data["notes"]), data["notes"]


def test_tune_table_matches_tune(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", SAMPLE, "--capacity", "520MiB", "--no-verify", "--tune", "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    tuned = json.loads(run("tune", SAMPLE, "--capacity", "520MiB", "--json").stdout)
    rows = tuned["ranked"]
    assert len(data["tune"]) == len(rows)
    assert [t["conf"] for t in data["tune"]] == [x["alloc_conf"] for x in rows]
    assert data["tune"][0]["peak_reserved"] == rows[0]["peak_reserved_bytes"]
    assert data["tune"][0]["oom"] is False


def plain_trace(path, timed):
    """An allocator trace without step markers; its events carry times when `timed`."""
    mib = 1 << 20
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "allocator",
              "devices": [{"device": 0, "capacity_bytes": 1 << 30}]},
             {"action": "segment_alloc", "addr": 1 << 30, "size": 20 * mib, "pool": "large"}]
    for k in range(30):
        for action in ("alloc", "free_requested", "free_completed"):
            lines.append({"action": action, "addr": 1 << 30, "size": 4 * mib})
    if timed:
        for k, line in enumerate(lines[1:]):
            line["time_us"] = 1_000_000 + 10 * k
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_json_names_the_timeline_axis(tmp_path):
    # Issue 33 item 4: what a chart of the timeline is drawn against, as the page does it.
    plain_trace(tmp_path / "plain.jsonl", timed=False)
    plain_trace(tmp_path / "timed.jsonl", timed=True)
    for path, axis in ((tmp_path / "plain.jsonl", "event"), (tmp_path / "timed.jsonl", "time"),
                       ("tests/data/snapshots/g2_time_us.pickle", "time"),
                       (CLI + "two_devices.jsonl", "step")):
        p = run("analyze", path, "--json", "--no-map")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["timeline_axis"] == axis, path


def test_page_interns_frames_and_stacks(tmp_path):
    # Issue 33 item 1: each frame once in the page, stacks as frame ids, allocations as stack ids.
    out = tmp_path / "r.html"
    p = run("report", "tests/data/snapshots/g5_three_devices_two_streams.pickle", "-o", out)
    assert p.returncode == 0, p.stderr
    _, data = page_data(out)
    frames, stacks = data["stack_frames"], data["stacks"]
    assert frames and stacks
    assert len({tuple(f[:3]) for f in frames}) == len(frames), "a frame is written twice"
    assert all(0 <= f < len(frames) for s in stacks for f in s)
    used = set()
    for d in data["devices"]:
        allocs = d["allocs"]
        n = len(allocs["stack"])
        assert all(len(allocs[k]) == n for k in ("alloc_event", "alloc_time", "free_event",
                                                 "free_time", "stream", "site"))
        for stack in allocs["stack"]:
            assert -1 <= stack < len(stacks)
            used.add(stack)
        for frame in d["frames"]:
            for seg in frame["segs"]:
                if isinstance(seg, list):
                    blocks = seg[5]
                    assert len(blocks) % 5 == 0
                    for k in range(0, len(blocks), 5):
                        held = blocks[k + 3] in (1, 2)
                        assert (blocks[k + 4] >= 0) == held, blocks[k:k + 5]
                        assert blocks[k + 4] < n
    assert used - {-1} == set(range(len(stacks))), "a stack no allocation uses"
    assert len({tuple(s) for s in stacks}) == len(stacks), "a stack is written twice"


def test_the_page_says_where_the_risk_comes_from(tmp_path):
    # Issue 31 item 5: wherever a risk is shown, one line says where it comes from. The sample
    # on 600 MiB, forecast at every step, first warns at step 39 (as `replay --forecast` says).
    out = tmp_path / "r.html"
    args = (SAMPLE, "--capacity", "600MiB", "--forecast", "--forecast-every", "1")
    r = run("report", *args, "-o", out)
    assert r.returncode == 0, r.stderr
    _, data = page_data(out)
    f = data["devices"][0]["forecast"]
    replay = json.loads(run("replay", *args, "--json", "--no-map").stdout)
    want = replay["analysis"]["devices"][0]["forecast"]
    assert f["first_warning_step"] == want["first_warning_step"] is not None
    warned = next(c for c in f["changes"] if c["step"] == f["first_warning_step"])
    assert warned["risk"]["steps"] == 100
    assert 0 < warned["risk"]["p"] <= 1
    assert warned["risk"]["from"].startswith("step demand came within one spread"), warned
    assert f["last"]["risk"]["from"] == want["last"]["risk"]["explanation"]
