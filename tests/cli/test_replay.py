"""Tests of `fragscope replay` and `fragscope tune` against the built binary.

The expected figures of tests/data/replay/fragmenting.jsonl are worked out by hand in
tests/data/replay/README.md: on a 64 MiB device the default allocator holds 30 MiB (a 20 MiB
segment with free blocks of 6 and 8 MiB, and a 10 MiB segment), so a 40 MiB request fails with
34 MiB free on the device and 14 MiB free in the cache.
"""

import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
FRAG = "tests/data/replay/fragmenting.jsonl"
CONTROLS = "tests/data/replay/controls.jsonl"
SAMPLE = "tests/data/sample/gpt_tiny_3steps.jsonl.gz"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")

# PyTorch's OOM text (shared/spec/pytorch-caching-allocator.md §12.1), with this trace's figures.
EXPECTED_OOM = (
    "CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 64.00 MiB "
    "of which 34.00 MiB is free. Of the allocated memory 16.00 MiB is allocated by PyTorch, and "
    "14.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
    "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
    "  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def run(*args):
    return subprocess.run([BIN, *args], cwd=SOURCE_DIR, capture_output=True, timeout=300)


def run_json(*args):
    r = run(*args, "--json")
    assert r.returncode in (0, 1), r.stderr.decode()
    return r.returncode, json.loads(r.stdout)


def test_fragmentation_oom_exit_status_and_exact_message():
    r = run("replay", FRAG)
    assert r.returncode == 1, r.stderr.decode()
    out = r.stdout.decode()
    # Both numberings named: the request trace's, and the simulated allocator trace's that the
    # analysis below uses.
    assert ("OUT OF MEMORY at request event 9 (device 0, step 2, simulated allocator event 13)"
            in out)
    assert "its event numbers count that trace's events, not the request events" in out
    assert EXPECTED_OOM in out


def test_fragmentation_oom_json():
    rc, j = run_json("replay", FRAG)
    assert rc == 1
    assert j["schema"] == "fragscope.replay"
    assert j["stopped_at_oom"] is True
    oom = j["oom"]
    assert oom["event_index"] == 9
    assert oom["step"] == 2
    assert oom["requested_bytes"] == 40 * MiB
    assert oom["tried_to_allocate_bytes"] == 40 * MiB
    assert oom["device_total_bytes"] == 64 * MiB
    assert oom["device_free_bytes"] == 34 * MiB
    assert oom["allocated_bytes"] == 16 * MiB
    assert oom["reserved_bytes"] == 30 * MiB
    assert oom["message"] == EXPECTED_OOM
    stats = j["devices"][0]["memory_stats"]
    assert stats["num_ooms"] == 1
    assert stats["num_alloc_retries"] == 1  # the release-all-and-retry attempt
    assert stats["segment.all.current"] == 2
    assert stats["reserved_bytes.all.current"] == 30 * MiB
    assert stats["allocated_bytes.all.peak"] == 18 * MiB
    segments = j["devices"][0]["segments"]
    assert [s["total_size"] for s in segments] == [20 * MiB, 10 * MiB]
    first = segments[0]["blocks"]
    assert [(b["size"], b["state"]) for b in first] == [
        (6 * MiB, "inactive"), (6 * MiB, "active_allocated"), (8 * MiB, "inactive")]
    assert all(b["pool"] == "large" for b in first)
    assert j["analysis"]["schema"] == "fragscope.analyze"


def test_continue_after_oom_goes_on_and_ignores_the_failed_free():
    rc, j = run_json("replay", FRAG, "--continue-after-oom")
    assert rc == 1
    assert j["stopped_at_oom"] is False
    assert j["request_events"] == 13
    assert len(j["ooms"]) == 1
    assert j["devices"][0]["memory_stats"]["allocated_bytes.all.current"] == 0


def test_enough_capacity_fits():
    rc, j = run_json("replay", FRAG, "--capacity", "70MiB")  # 30 MiB + a 40 MiB segment
    assert rc == 0
    assert j["oom"] is None
    assert j["devices"][0]["peak_reserved_bytes"] == 70 * MiB


def test_controls_replay(tmp_path):
    rc, j = run_json("replay", CONTROLS, "--capacity", "1GiB")
    assert rc == 0
    assert j["devices"][0]["alloc_conf"] == "expandable_segments:True"


def test_emit_writes_an_allocator_trace_that_analyze_reads(tmp_path):
    out = tmp_path / "sim.jsonl.zst"
    r = run("replay", SAMPLE, "--capacity", "1GiB", "--emit", str(out), "--json")
    assert r.returncode == 0, r.stderr.decode()
    replay = json.loads(r.stdout)
    a = run("analyze", str(out), "--json")
    assert a.returncode == 0, a.stderr.decode()
    analysis = json.loads(a.stdout)
    assert analysis["trace_kind"] == "allocator"
    peak = analysis["devices"][0]["peak_reserved"]["bytes"]
    assert peak == replay["devices"][0]["peak_reserved_bytes"]


@pytest.mark.parametrize("args", [
    [FRAG],  # stops at its OOM, after a release-and-retry
    [FRAG, "--continue-after-oom"],
    [CONTROLS, "--capacity", "1GiB"],
    # 14 allocation retries across the steps, and OOMs the replay goes on after
    ["tests/data/sample/gpt_tiny_50steps.jsonl.gz", "--capacity", "300MiB",
     "--continue-after-oom"],
    [SAMPLE, "--capacity", "1GiB", "--every", "7"],  # windows by event count, not steps
    ["tests/data/snapshots/g5_three_devices_two_streams.pickle"],
    ["tests/data/snapshots/g2_oom.pickle", "--every", "3"],
])
def test_two_threads_report_exactly_what_one_does(tmp_path, args):
    """--threads 2 analyzes on a second thread; the report and --emit are byte-identical."""
    outputs = []
    for threads in ("1", "2"):
        emitted = tmp_path / f"sim{threads}.jsonl"
        r = run("replay", *args, "--threads", threads, "--json", "--emit", str(emitted))
        assert r.returncode in (0, 1), r.stderr.decode()
        outputs.append((r.returncode, r.stdout, emitted.read_bytes()))
    assert outputs[0] == outputs[1]
    retries = [s.get("alloc_retries") for d in json.loads(outputs[0][1])["analysis"]["devices"]
               for s in d["timeline"]]
    assert retries and all(r is not None for r in retries)  # known in every sample


def test_retries_are_counted_in_the_timeline_with_two_threads():
    rc, j = run_json("replay", "tests/data/sample/gpt_tiny_50steps.jsonl.gz", "--capacity",
                     "300MiB", "--continue-after-oom", "--threads", "2")
    assert rc == 1
    retries = sum(s["alloc_retries"] for s in j["analysis"]["devices"][0]["timeline"])
    assert retries == j["devices"][0]["memory_stats"]["num_alloc_retries"] > 0


@pytest.mark.parametrize("args, needle", [
    (["replay", FRAG, "--alloc-conf", "max_split_mb:64"], "max_split_mb"),
    (["replay", FRAG, "--alloc-conf", "expandable_segments:yes"], "expandable_segments"),
    (["replay", FRAG, "--capacity", "12XB"], "unknown unit"),
    (["replay", CONTROLS], "--capacity"),
    (["replay", FRAG, "--forecast-every", "2"], "--forecast-every requires --forecast"),
    (["replay", "tests/data/cli/allocator_basic.jsonl", "--capacity", "1GiB"],
     "allocator trace"),
    (["replay", "tests/data/cli/bad_unknown_action.jsonl", "--capacity", "1GiB"],
     "bad_unknown_action.jsonl:"),
    (["tune", FRAG], "a request trace needs --capacity"),
    (["tune", "tests/data/cli/allocator_basic.jsonl", "--capacity", "1GiB"], "allocator trace"),
    (["tune", "tests/data/snapshots/truncated.pickle"], "truncated.pickle"),
    (["tune", "tests/data/snapshots/malicious.pickle"], "malicious.pickle"),
    (["tune", FRAG, "--capacity", "64MiB", "--setting", "garbage_collection_threshold:2"],
     "garbage_collection_threshold"),
])
def test_bad_input_exits_2(args, needle):
    r = run(*args)
    assert r.returncode == 2, (r.returncode, r.stdout.decode(), r.stderr.decode())
    assert needle in r.stderr.decode()


def test_free_of_unknown_id_names_the_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"format":"fragscope-trace","version":1,"kind":"request"}\n'
                     '{"action":"alloc","addr":1,"size":100}\n'
                     '{"action":"free_requested","addr":2}\n')
    r = run("replay", str(trace), "--capacity", "1GiB")
    assert r.returncode == 2
    assert f"{trace}:3:" in r.stderr.decode()
    assert "not live" in r.stderr.decode()


def test_tune_ranks_and_finds_min_capacity():
    r = run("tune", FRAG, "--capacity", "64MiB", "--setting", "",
            "--setting", "expandable_segments:True", "--min-capacity", "--json")
    assert r.returncode == 1  # nothing fits in 64 MiB
    j = json.loads(r.stdout)
    rows = {row["alloc_conf"]: row for row in j["ranked"]}
    assert rows[""]["oom"] is True
    assert rows[""]["min_capacity_bytes"] == 70 * MiB  # 30 MiB held + a 40 MiB segment
    assert j["recommended"] is None
    assert j["default"]["alloc_conf"] == ""


def test_tune_recommends_a_setting_that_fits():
    r = run("tune", FRAG, "--capacity", "70MiB", "--setting", "",
            "--setting", "max_split_size_mb:64")
    assert r.returncode == 0, r.stderr.decode()
    assert "Recommended: PYTORCH_CUDA_ALLOC_CONF=" in r.stdout.decode()


def test_help_teaches():
    for cmd in ("replay", "tune"):
        r = run(cmd, "--help")
        assert r.returncode == 0
        assert "Examples:" in r.stdout.decode()


@pytest.mark.parametrize("command", ["analyze", "replay"])
def test_error_names_its_line_although_the_reader_reads_ahead(tmp_path, command):
    # The CLI reads a few events ahead of the analysis (to prefetch); the message must still
    # name the line of the event that failed, not the line the reader has reached.
    lines = ['{"format":"fragscope-trace","version":1,"kind":"request"}']
    lines += [f'{{"action":"alloc","addr":{i},"size":100}}' for i in range(1, 4)]
    lines.append('{"action":"free_requested","addr":99}')  # line 5: id 99 was never allocated
    lines += [f'{{"action":"alloc","addr":{i},"size":100}}' for i in range(10, 30)]
    trace = tmp_path / "late.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    r = run(command, str(trace), "--capacity", "1GiB") if command == "replay" else run(
        command, str(trace))
    assert r.returncode == 2
    assert f"{trace}:5:" in r.stderr.decode(), r.stderr.decode()


def test_forecast_of_a_simulated_run():
    # On 520 MiB the defaults run out of memory at step 18; the forecaster, sampling every two
    # steps as an agent would, reports on the simulated run.
    rc, j = run_json("replay", "tests/data/sample/gpt_tiny_50steps.jsonl.gz", "--capacity",
                     "520MiB", "--forecast", "--forecast-every", "2")
    assert rc == 1
    forecast = j["analysis"]["devices"][0]["forecast"]
    assert forecast["every"] == 2
    assert forecast["samples"] >= 9
    assert forecast["worst_level"] in ("watch", "warning", "critical")
    rc, j = run_json("replay", "tests/data/sample/gpt_tiny_50steps.jsonl.gz", "--capacity",
                     "520MiB")
    assert j["analysis"]["devices"][0].get("forecast") is None


def test_forecast_options_are_checked():
    r = run("replay", FRAG, "--forecast", "--forecast-warning-steps", "100",
            "--forecast-watch-steps", "10")
    assert r.returncode == 2
    assert "--forecast: steps-to-OOM thresholds" in r.stderr.decode()


@pytest.mark.parametrize("threads", ["1", "2"])
def test_emit_write_failure_ends_the_replay(tmp_path, threads):
    # The output outgrows a file-size limit mid-replay (EFBIG): exit 2 naming the file, and no
    # output left behind, with the analysis on this thread or on a second one.
    import resource
    import signal
    import sys
    snapshot = tmp_path / "snap.pickle"
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "bench/python/make_big_snapshot.py"),
                    str(snapshot), "--entries", "30000"], check=True, capture_output=True)
    out = tmp_path / "sim.jsonl"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    r = subprocess.run([BIN, "replay", str(snapshot), "--emit", str(out), "--threads", threads,
                        "--no-map"], cwd=SOURCE_DIR, capture_output=True, timeout=300,
                       preexec_fn=limit)
    assert r.returncode == 2, r.stderr.decode()
    assert "sim.jsonl: write failed: File too large" in r.stderr.decode()
    # Nor its temporary (a new dot file next to it, issue 24 item 4).
    assert sorted(os.listdir(tmp_path)) == ["snap.pickle"]


# tests/data/snapshots/g2_oom.pickle (tools/make_snapshot_fixtures.py): 50 MiB stay live when a
# 180 MiB request fails with 150 MiB free on the driver, so the device held 50 + 150 = 200 MiB
# and the job would have needed 50 + 180 = 230 MiB.
OOM_SNAPSHOT = "tests/data/snapshots/g2_oom.pickle"


def test_tune_snapshot_takes_the_size_its_recorded_oom_reveals():
    r = run("tune", OOM_SNAPSHOT, "--min-capacity", "--json")
    assert r.returncode == 1, r.stderr.decode()  # a shortage: no setting avoids it
    j = json.loads(r.stdout)
    assert j["device_capacity_bytes"] == {"0": 200 * MiB}
    assert j["recorded_alloc_conf"] == ""  # no settings recorded: PyTorch's defaults
    rec = j["recorded"]
    assert rec["recorded"] is True and rec == j["default"]
    assert [row["alloc_conf"] for row in j["ranked"] if row["recorded"]] == [""]
    assert len(j["ranked"]) == 72  # the recorded settings are in the grid already
    assert rec["min_capacity_bytes"] == 230 * MiB
    # The recorded settings fail where `replay` of the snapshot fails, at the recorded OOM.
    _, replayed = run_json("replay", OOM_SNAPSHOT)
    assert rec["oom"] is True
    assert rec["oom_event_index"] == replayed["oom"]["event_index"]
    assert any("capacity taken from its recorded OOM" in n for n in j["notes"]), j["notes"]


@pytest.mark.parametrize("capacity, rc", [("230MiB", 0), ("228MiB", 1)])
def test_tune_snapshot_on_a_given_device(capacity, rc):
    r = run("tune", OOM_SNAPSHOT, "--capacity", capacity, "--setting", "")
    assert r.returncode == rc, r.stderr.decode()
    text = r.stdout.decode()
    assert f"on {capacity[:3]}.0 MiB (0 B used by others)" in text, text
    assert ("Recommended: PYTORCH_CUDA_ALLOC_CONF=\"\"" in text) == (rc == 0), text


def test_tune_snapshot_without_an_oom_ranks_on_unlimited_memory():
    snapshot = "tests/data/snapshots/g4_expandable.pickle"
    rc, j = run_json("tune", snapshot)
    assert rc == 0
    assert j["capacity_bytes"] == 1 << 50 and j["device_capacity_bytes"] == {}
    assert all(not row["oom"] for row in j["ranked"])
    [rec] = [row for row in j["ranked"] if row["recorded"]]
    assert rec["alloc_conf"] == j["recorded_alloc_conf"] == "expandable_segments:True"
    # The same requests, settings and addresses as `replay` of the snapshot: the same peak.
    _, replayed = run_json("replay", snapshot)
    [device] = replayed["devices"]
    assert rec["peak_reserved_bytes"] == device["memory_stats"]["reserved_bytes.all.peak"]
    assert any("unlimited memory" in n for n in j["notes"]), j["notes"]


def test_tune_snapshot_adds_its_recorded_settings_to_the_grid(tmp_path):
    snapshot = json.load(open(os.path.join(SOURCE_DIR, "tests/data/snapshots/g3_snapshot.json")))
    snapshot["allocator_settings"]["max_split_size"] = 96 * MiB  # not in the default grid
    path = tmp_path / "split96.json"
    path.write_text(json.dumps(snapshot))
    rc, j = run_json("tune", str(path))
    assert rc == 0
    assert j["recorded_alloc_conf"] == "max_split_size_mb:96"
    assert len(j["ranked"]) == 73
    assert j["recorded"]["alloc_conf"] == "max_split_size_mb:96"
    # --setting replaces the grid, recorded settings included.
    rc, j = run_json("tune", str(path), "--setting", "", "--setting", "expandable_segments:True")
    assert [row["alloc_conf"] for row in j["ranked"]].count("max_split_size_mb:96") == 0
    assert j["recorded"] is None
    text = run("tune", str(path)).stdout.decode()
    assert "max_split_size_mb:96  (recorded)" in text, text


def test_tune_addresses():
    r = run("tune", FRAG, "--capacity", "64MiB", "--addresses", "recorded")
    assert r.returncode == 2
    assert "--addresses recorded needs a PyTorch memory snapshot" in r.stderr.decode()
    r = run("tune", OOM_SNAPSHOT, "--addresses", "elsewhere")
    assert r.returncode == 2
    _, recorded = run_json("tune", OOM_SNAPSHOT, "--setting", "")
    _, simulated = run_json("tune", OOM_SNAPSHOT, "--setting", "", "--addresses", "simulated")
    assert recorded == simulated  # one segment at a time: nothing for the placement to decide


def test_replay_on_unlimited_memory_reports_no_device_size():
    # A snapshot without a recorded OOM replays on an unlimited device; the analysis of the
    # simulated run must not report that stand-in size (2^50 bytes) as the GPU's capacity, nor
    # count it as free device memory in "max allocatable".
    snapshot = "tests/data/snapshots/g4_expandable.pickle"
    _, j = run_json("replay", snapshot, "--no-map")
    [device] = j["analysis"]["devices"]
    assert device["capacity_bytes"] is None
    assert device["final"]["device_free_bytes"] is None
    assert device["min_max_allocatable"]["bytes"] < 1 << 30
    text = run("replay", snapshot, "--no-map").stdout.decode()
    assert "virtual GPU of unlimited memory" in text
    assert "1048576" not in text


def test_tune_counts_the_rows_it_leaves_out():
    # --rows 1 prints the best row, and the defaults' row wherever it ranks; the footer counts
    # only the rows left out.
    r = run("tune", FRAG, "--capacity", "70MiB", "--rows", "1", "--setting", "max_split_size_mb:64",
            "--setting", "expandable_segments:True", "--setting", "")
    lines = r.stdout.decode().splitlines()
    printed = [line for line in lines if line[:6].strip().isdigit()]
    assert any(line.endswith("(defaults)") for line in printed), lines
    hidden = 3 - len(printed)
    assert hidden >= 1, lines
    assert f"({hidden} more setting{'' if hidden == 1 else 's'};" in r.stdout.decode(), lines


# Settings that change the usable size (per_process_memory_fraction) beside ones that do not.
MIN_CAPACITY_GRID = ["", "per_process_memory_fraction:0.95",
                     "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
                     "expandable_segments:True,per_process_memory_fraction:0.9",
                     "max_split_size_mb:128"]
REAL_SNAPSHOTS = os.path.normpath(os.path.join(SOURCE_DIR, "..", "shared", "snapshots", "real"))


@pytest.mark.parametrize("trace", [
    "tests/data/sample/gpt_tiny_50steps.jsonl.gz",
    OOM_SNAPSHOT,
    os.path.join(REAL_SNAPSHOTS, "yiyi_oom_snapshot.pickle"),
])
def test_tune_min_capacity_is_a_size_replay_fits_on(trace):
    """Every row's --min-capacity is a device `replay` with that setting fits on, whatever the
    setting does to the usable size. (Not checked: that 2 MiB less fails. The bisection assumes
    more memory never hurts, which the allocator's decisions do not always honour,
    docs/simulator.md.)"""
    if not os.path.exists(os.path.join(SOURCE_DIR, trace)):
        pytest.skip(f"{trace} is absent")
    args = ["tune", trace, "--min-capacity", "--json", "--threads", "1"]
    if trace.endswith(".jsonl.gz"):
        args += ["--capacity", "64GiB"]
    for s in MIN_CAPACITY_GRID:
        args += ["--setting", s]
    r = run(*args)
    assert r.returncode in (0, 1), r.stderr.decode()
    rows = json.loads(r.stdout)["ranked"]
    assert len(rows) == len(MIN_CAPACITY_GRID)
    for row in rows:
        minimum = row["min_capacity_bytes"]
        assert minimum is not None, row
        code, replayed = run_json("replay", trace, "--capacity", str(minimum),
                                  "--alloc-conf", row["alloc_conf"], "--no-map")
        assert code == 0, (row["alloc_conf"], minimum, replayed["oom"])


def test_snapshot_figures_use_its_recorded_oom_and_no_steps_it_lacks():
    """g2_oom.pickle has no step markers and one OOM with the driver's free bytes: its capacity
    is known from the OOM (reserved 50 MiB + free 150 MiB), and no figure is placed "before the
    first step" of a run that has none."""
    r = run("analyze", OOM_SNAPSHOT, "--no-map")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "Device 0, capacity 200.0 MiB" in out
    assert "no capacity in the header" not in out
    assert "capacity 200.0 MiB taken from its first recorded OOM" in out
    _, j = run_json("analyze", OOM_SNAPSHOT, "--no-map")
    assert j["devices"][0]["capacity_bytes"] == 200 * MiB
    r = run("check", OOM_SNAPSHOT)
    assert r.returncode == 1
    assert "before the first step" not in r.stdout.decode()
    _, replayed = run_json("replay", OOM_SNAPSHOT, "--no-map")
    assert replayed["oom"] is not None
    r = run("replay", OOM_SNAPSHOT, "--no-map")
    assert "before the first step" not in r.stdout.decode()


def test_expandable_segment_counts_agree():
    """memory_stats() does not count expandable segments (as PyTorch's); the report says how
    many its memory snapshot holds, so the two counts do not contradict each other."""
    r = run("replay", FRAG, "--capacity", "1GiB", "--alloc-conf", "expandable_segments:True",
            "--no-map")
    out = r.stdout.decode()
    _, j = run_json("replay", FRAG, "--capacity", "1GiB", "--alloc-conf",
                    "expandable_segments:True")
    d = j["devices"][0]
    assert d["memory_stats"]["segment.all.current"] == 0
    assert len(d["segments"]) > 0
    assert (f"segments in its memory snapshot: {len(d['segments'])} (memory_stats' segment count "
            "leaves out expandable segments" in out)


def snapshot_reserved_before(tmp_path, grow):
    """A small PyTorch snapshot: one 20 MiB segment, and a recorded history of 4-8 MiB requests
    that fit in it. grow=False: the segment was reserved before recording began (the history
    holds no segment_alloc); grow=True: the history begins with its segment_alloc."""
    import pickle
    base = 1 << 30
    frames = [{"name": "step", "filename": "train.py", "line": 7}]
    trace = []
    if grow:
        trace.append({"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0,
                      "frames": frames})
    for i in range(10):
        size = (4 + i % 3 * 2) * MiB
        for action in ("alloc", "free_requested", "free_completed"):
            trace.append({"action": action, "addr": base, "size": size, "stream": 0,
                          "frames": frames})
    seg = {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 0,
           "active_size": 0, "stream": 0, "segment_type": "large",
           "blocks": [{"size": 20 * MiB, "requested_size": 0, "state": "inactive",
                       "address": base, "frames": []}]}
    path = tmp_path / ("grown.pickle" if grow else "reserved_before.pickle")
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [trace]}, protocol=4))
    return str(path)


def test_tune_says_when_the_history_cannot_tell_the_settings_apart(tmp_path):
    # Issue 29 item 5: every byte was reserved before recording began; the history cannot
    # rank the settings, and tune says so and why instead of "the defaults are best".
    before = snapshot_reserved_before(tmp_path, grow=False)
    r = run("tune", before, "--json")
    assert r.returncode == 0, r.stderr.decode()
    j = json.loads(r.stdout)
    assert j["recommended"] is None
    assert "cannot tell the settings apart" in j["cannot_rank"]
    assert "reserved before recording began" in j["cannot_rank"]
    text = run("tune", before).stdout.decode()
    assert "defaults are best" not in text
    assert "Recommended: none: the recorded history cannot tell the settings apart" in text
    assert "min capacities" in run("tune", before, "--min-capacity").stdout.decode()
    # The report's tune table says so too.
    page = tmp_path / "report.html"
    r = run("report", before, "--capacity", "1GiB", "--tune", "-o", str(page))
    assert r.returncode == 0, r.stderr.decode()
    assert "cannot tell the settings apart" in page.read_text()
    # The same requests with their segment allocated in the history: a recommendation.
    grown = snapshot_reserved_before(tmp_path, grow=True)
    g = json.loads(run("tune", grown, "--json").stdout)
    assert g["cannot_rank"] is None and g["recommended"] is not None
    # A request trace is its whole history.
    s = json.loads(run("tune", SAMPLE, "--capacity", "1GiB", "--json").stdout)
    assert s["cannot_rank"] is None and s["recommended"] is not None


def test_explain_says_when_the_history_cannot_rank_its_remedies(tmp_path):
    # Issue 29 items 5 and 6d (one search serves both): explain's replays of a snapshot whose
    # history holds no segment allocation compare rebuilds; it keeps the message's remedies
    # unranked and says why, instead of a "searched setting" the history cannot support.
    message = tmp_path / "oom.txt"
    message.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 MiB. GPU 0 has a "
        "total capacity of 24.00 MiB of which 2.00 MiB is free. Of the allocated memory 6.00 MiB "
        "is allocated by PyTorch, and 14.00 MiB is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n")
    for grow, ranked in ((False, False), (True, True)):
        snap = snapshot_reserved_before(tmp_path, grow=grow)
        r = run("explain", str(message), "--snapshot", snap, "--json")
        assert r.returncode in (0, 1), r.stderr.decode()
        v = json.loads(r.stdout)["verification"]
        remedies = json.loads(r.stdout)["errors"][0]["remedies"]
        if ranked:
            assert v["cannot_rank"] is None, v
        else:
            assert "cannot tell the settings apart" in v["cannot_rank"], v
            assert all(x["replay"] is None for x in remedies), remedies
            assert not any(x["id"] == "searched_setting" for x in remedies), remedies
            text = run("explain", str(message), "--snapshot", snap).stdout.decode()
            assert "Remedies not ranked: the recorded history cannot tell" in text
            assert "ranked by the replay" not in text
    # A shortage (a larger GPU is a remedy): the smallest device the job fits on is not
    # measured on a rebuild either.
    short = tmp_path / "short.txt"
    short.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.00 MiB. GPU 0 has a "
        "total capacity of 24.00 MiB of which 1.00 MiB is free. Of the allocated memory 20.00 MiB "
        "is allocated by PyTorch, and 1.00 MiB is reserved by PyTorch but unallocated.\n")
    for grow in (False, True):
        snap = snapshot_reserved_before(tmp_path, grow=grow)
        text = run("explain", str(short), "--snapshot", snap).stdout.decode()
        assert "Use a GPU with at least" in text, text
        assert ("the whole job fits on a GPU of" in text) == grow, text


# ---- --allocator bfc (issue 32 item 3) ----

def _bfc_trace(tmp_path, sizes, frees, last):
    path = tmp_path / "bfc.jsonl"
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "request", "producer": "test"}]
    lines += [{"action": "alloc", "addr": i + 1, "size": s} for i, s in enumerate(sizes)]
    lines += [{"action": "free_requested", "addr": i + 1} for i in frees]
    lines.append({"action": "alloc", "addr": 1000, "size": last})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_bfc_replay_reports_regions_chunks_and_a_fragmentation_oom(tmp_path):
    # 13 chunks of about 1 MiB in regions of 2, 4 and 8 MiB under a 16 MiB limit; every other one
    # freed: over 6 MiB free, no chunk of 3 MiB, and 2 MiB left under the limit.
    trace = _bfc_trace(tmp_path, [(1 << 20) - 1000 + i for i in range(13)], range(0, 13, 2),
                       3 << 20)
    proc = run("replay", trace, "--allocator", "bfc", "--bfc-conf", "memory_limit:16MiB",
               "--json", "--no-map")
    assert proc.returncode == 1, proc.stderr.decode()
    report = json.loads(proc.stdout)
    assert report["allocator"] == "bfc"
    assert report["oom"]["event_index"] == 20  # 13 allocs, 7 frees, then the 3 MiB request
    assert report["oom"]["rounded_bytes"] == 3 << 20
    assert report["oom"]["message"].startswith("Allocator (bfc) ran out of memory trying to "
                                               "allocate 3.00MiB")
    device = report["devices"][0]
    assert [s["total_size"] for s in device["segments"]] == [2 << 20, 4 << 20, 8 << 20]
    assert device["memory_stats"]["bytes_limit"] == 16 << 20
    assert device["memory_stats"]["pool_bytes"] == 14 << 20
    text = run("replay", trace, "--allocator", "bfc", "--bfc-conf", "memory_limit:16MiB",
               "--no-map").stdout.decode()
    assert "BFC allocator (TensorFlow / JAX) with a limit of 16.0 MiB" in text
    assert "ResourceExhaustedError" in text


def test_bfc_replay_refuses_bad_settings_and_a_missing_limit(tmp_path):
    trace = _bfc_trace(tmp_path, [1000], [], 2000)
    bad = run("replay", trace, "--allocator", "bfc", "--bfc-conf", "allow_grwoth:true")
    assert bad.returncode == 2 and b"allow_grwoth" in bad.stderr
    none = run("replay", trace, "--allocator", "bfc")
    assert none.returncode == 2 and b"--capacity" in none.stderr
    mixed = run("replay", trace, "--bfc-conf", "allow_growth:true", "--capacity", "1GiB")
    assert mixed.returncode == 2 and b"--allocator bfc" in mixed.stderr


def test_bfc_tune_ranks_settings_that_fit_first(tmp_path):
    trace = _bfc_trace(tmp_path, [(1 << 20) - 1000 + i for i in range(13)], range(0, 13, 2),
                       3 << 20)
    proc = run("tune", trace, "--allocator", "bfc", "--capacity", "64MiB", "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    ranked = json.loads(proc.stdout)["ranked"]
    assert len(ranked) == 16
    assert not ranked[0]["oom"]
    oom_flags = [r["oom"] for r in ranked]
    assert oom_flags == sorted(oom_flags)  # every fitting setting before every failing one
    pools = [r["peak_pool_bytes"] for r in ranked if not r["oom"]]
    assert pools == sorted(pools)


# ---- explain LOG --trace on a TensorFlow / JAX failure: remedies replayed through the BFC model

_XLA = "2026-01-01 12:00:00.000001: {} external/local_xla/xla/tsl/framework/bfc_allocator.cc:{}] "


def _bfc_dump(tmp_path, regions, in_use_mib, pool_mib, limit_mib, largest_mib, jax=False):
    lines = ["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED"] if jax else []
    lines.append(_XLA.format("W", 501) + "Allocator (GPU_0_bfc) ran out of memory trying to "
                 "allocate 3.00MiB (rounded to 3145728)requested by op MatMul")
    lines += [_XLA.format("I", 1085) + "Next region of size {}".format(r << 20) for r in regions]
    lines.append(_XLA.format("I", 1112) + "Sum Total of in-use chunks: {}.00MiB".format(in_use_mib))
    lines.append(_XLA.format("I", 1114) + "total_region_allocated_bytes_: {} memory_limit_: {} "
                 "available bytes: 0 curr_region_allocation_bytes_: {}".format(
                     pool_mib << 20, limit_mib << 20, limit_mib << 20))
    lines.append(_XLA.format("I", 1119) + "Stats: ")
    lines += ["Limit: {}".format(limit_mib << 20), "InUse: {}".format(in_use_mib << 20),
              "LargestFreeBlock: {}".format(largest_mib << 20)]
    path = tmp_path / ("jax.log" if jax else "tf.log")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_explain_replays_tensorflow_and_jax_remedies_through_the_bfc_model(tmp_path):
    # The fragmenting trace above under memory growth and a 16 MiB limit fails at its last
    # request (event 20); its dump shows 3 regions. Preallocation (one region) fits in the model;
    # leaving the BFC allocator is checked by a bound only, and ranks after it.
    trace = _bfc_trace(tmp_path, [(1 << 20) - 1000 + i for i in range(13)], range(0, 13, 2),
                       3 << 20)
    log = _bfc_dump(tmp_path, [2, 4, 8], 6, 14, 16, 2)
    proc = run("explain", log, "--trace", trace)
    assert proc.returncode == 0, proc.stderr.decode()
    text = proc.stdout.decode()
    assert "Remedies, ranked by the replay:" in text
    growth_off = text.index("turn memory growth off")
    cuda_async = text.index("set TF_GPU_ALLOCATOR=cuda_malloc_async")
    assert growth_off < cuda_async, text
    assert "replay: fits, peak pool 16.0 MiB" in text
    assert "bound (no pool modelled: live bytes against the same limit): fits" in text
    assert "the pool grew in 3 regions: memory growth" in text
    assert "replay: still OOM at request event 20" in text  # the job's own settings

    report = json.loads(run("explain", log, "--trace", trace, "--json").stdout)
    v = report["verification"]
    assert v["reproduced"] and v["current"]["oom_event_index"] == 20
    assert v["current_bfc_conf"] == "memory_limit:16777216" and v["limit_bytes"] == 16 << 20
    remedies = report["errors"][0]["remedies"]
    assert [r["id"] for r in remedies[:2]] == ["memory_growth_off", "cuda_malloc_async"]
    assert remedies[0]["replay"]["method"] == "bfc_model" and not remedies[0]["replay"]["oom"]
    assert remedies[1]["replay"]["method"] == "live_bytes_bound"

    # JAX's terms for the same failure.
    jax = run("explain", _bfc_dump(tmp_path, [2, 4, 8], 6, 14, 16, 2, jax=True), "--trace", trace)
    text = jax.stdout.decode()
    assert text.index("XLA_PYTHON_CLIENT_PREALLOCATE") < text.index("XLA_PYTHON_CLIENT_ALLOCATOR")

    # Preallocated under the same limit the job would not have failed: the replay says so.
    other = run("explain", log, "--trace", trace, "--bfc-conf", "allow_growth:false,"
                "memory_limit:16MiB").stdout.decode()
    assert "does not reproduce this failure" in other


def test_explain_replays_a_raised_memory_fraction_on_the_devices_size(tmp_path):
    # 13 MiB in use under a 14 MiB limit on a 32 MiB device, then 3 MiB: the cap. The fraction
    # that holds in use + request (0.50 of 32 MiB) is replayed and fits; without the device's
    # size the fraction cannot be replayed, and the report says why.
    path = tmp_path / "cap.jsonl"
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "request", "producer": "test"}]
    lines += [{"action": "alloc", "addr": i + 1, "size": 1 << 20} for i in range(13)]
    lines.append({"action": "alloc", "addr": 1000, "size": 3 << 20})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    log = _bfc_dump(tmp_path, [], 13, 14, 14, 1)
    text = run("explain", log, "--trace", str(path), "--capacity", "32MiB").stdout.decode()
    assert "raise per_process_gpu_memory_fraction to 0.50" in text
    assert "replay: fits, peak pool 16.0 MiB" in text
    # Without the device's size it reads as a shortage: nothing to replay but the job's run.
    without = run("explain", log, "--trace", str(path)).stdout.decode()
    assert "Verdict: shortage" in without and "Remedies, best first:" in without
    assert "replay: still OOM at request event 13" in without
    # JAX's default share (a fraction) needs the device's size to be replayed.
    jax_log = _bfc_dump(tmp_path, [], 13, 14, 14, 1, jax=True)
    jax = run("explain", jax_log, "--trace", str(path)).stdout.decode()
    assert ("Not replayed: XLA_PYTHON_CLIENT_MEM_FRACTION=.95: a fraction of the device needs "
            "its size (--capacity)") in jax, jax
    jax = run("explain", jax_log, "--trace", str(path), "--capacity", "32MiB").stdout.decode()
    assert "Not replayed" not in jax, jax


def test_explain_of_a_bfc_log_refuses_pytorch_replays_and_bad_settings(tmp_path):
    trace = _bfc_trace(tmp_path, [1000], [], 2000)
    log = _bfc_dump(tmp_path, [2, 4, 8], 6, 14, 16, 2)
    for args in (["--snapshot", trace], ["--alloc-conf", "expandable_segments:True"]):
        proc = run("explain", log, *args)
        assert proc.returncode == 2 and b"--trace" in proc.stderr, proc.stderr
    bad = run("explain", log, "--trace", trace, "--bfc-conf", "allow_grwoth:true")
    assert bad.returncode == 2 and b"allow_grwoth" in bad.stderr
    assert run("explain", log, "--trace", trace, "--error", "2").returncode == 2
