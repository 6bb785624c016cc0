"""`fragscope convert`, and snapshots through analyze and replay, on small files of ours.

tests/data/cli/snapshot_small.pickle is a snapshot written with Python's pickle (protocol 4)
from hand-made dicts (the same as fuzz/corpus/snapshot/small_p4.pickle): one 20 MiB segment
created in the recorded history, a 4 MiB block live at the end, a 2 MiB block allocated and
freed, and an oom of 100 MiB with 5 MiB free on the device. evil.pickle would run
`touch /tmp/fragscope_pwned` if Python's pickle.load read it; it is never loaded here.
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
DATA = os.path.join(SOURCE_DIR, "tests", "data", "cli")
SMALL = os.path.join(DATA, "snapshot_small.pickle")
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, timeout=120)


def analyze_json(path):
    r = run("analyze", path, "--json")
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_analyze_snapshot_reports_the_oom_and_the_final_state():
    report = analyze_json(SMALL)
    assert report["trace_kind"] == "allocator"
    assert report["notes"][0].startswith("memory snapshot (pickle, G3): 1 segments, 2 blocks; "
                                         "6 history entries")
    [device] = report["devices"]
    assert device["final"]["all"]["reserved_bytes"] == 20 * MiB
    assert device["final"]["all"]["allocated_bytes"] == 4 * MiB
    [oom] = device["oom_diagnoses"]
    # 16 MiB free in the segment + 5 MiB on the device < 100 MiB: a real shortage.
    assert oom["cause"] == "shortage"
    assert oom["free_unusable_bytes"] == 16 * MiB
    assert oom["device_free_bytes"] == 5 * MiB
    assert oom["margin_bytes"] == 100 * MiB - 21 * MiB
    assert device["stranding_sites_at"] == "first oom"
    assert device["stranding_sites"][0]["site"] == "/u/train.py:3 in fwd"
    assert device["stranding_sites"][0]["stranded_bytes"] == 16 * MiB


def test_text_report_explains_the_oom():
    r = run("analyze", SMALL, "--no-map")
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "verdict: real shortage" in out
    assert "Call sites stranding free gaps (at the first oom)" in out


def test_convert_to_trace_reads_back_the_same(tmp_path):
    out = tmp_path / "small.jsonl.zst"
    r = run("convert", SMALL, "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    assert b"wrote 6 allocator events" in r.stderr
    direct = analyze_json(SMALL)["devices"][0]
    via_trace = analyze_json(str(out))["devices"][0]
    assert via_trace["final"] == direct["final"]
    assert via_trace["peak_reserved"] == direct["peak_reserved"]
    assert via_trace["oom_diagnoses"] == direct["oom_diagnoses"]


def test_convert_to_perfetto(tmp_path):
    out = tmp_path / "small.perfetto.json"
    r = run("convert", SMALL, "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    events = json.loads(out.read_text())["traceEvents"]
    reserved = [e for e in events if e.get("name") == "reserved"]
    assert reserved and reserved[-1]["args"]["value"] == 20 * MiB
    assert [e for e in events if e.get("ph") == "i" and e["name"].startswith("OOM")]
    assert all(e["ts"] >= 0 for e in events if "ts" in e)


def test_convert_to_json_equals_pythons_view(tmp_path):
    out = tmp_path / "small.json"
    r = run("convert", SMALL, "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    with open(SMALL, "rb") as f:
        expected = json.loads(json.dumps(pickle.load(f)))  # our own data file: safe to load
    assert json.loads(out.read_text()) == expected


def test_convert_to_requests_then_replay(tmp_path):
    out = tmp_path / "requests.jsonl"
    r = run("convert", SMALL, "-o", str(out), "--to", "requests")
    assert r.returncode == 0, r.stderr.decode()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["kind"] == "request"
    assert {x["action"] for x in lines[1:]} <= {"frame", "alloc", "free_requested"}
    assert run("replay", str(out), "--capacity", "1GiB").returncode == 0
    assert run("replay", str(out), "--capacity", "50MiB").returncode == 1


def test_replay_snapshot_compares_with_the_recorded_run():
    r = run("replay", SMALL, "--json")
    # The device size is taken from the recorded OOM (20 MiB reserved + 5 MiB free): the 100 MiB
    # request fails again, so the exit status is 1.
    assert r.returncode == 1, r.stderr.decode()
    report = json.loads(r.stdout)
    [f] = report["fidelity"]
    assert f["complete_history"] is True
    assert f["segment_agreement"] == 1.0
    assert f["real_peak_reserved_bytes"] == f["sim_peak_reserved_bytes"] == 20 * MiB
    assert any("capacity taken from its recorded OOM" in n for n in report["notes"])


def test_replay_snapshot_at_the_recorded_addresses():
    with open(SMALL, "rb") as f:
        recorded = pickle.load(f)  # our own data file: safe to load
    [segment] = recorded["segments"]
    r = run("replay", SMALL, "--json")
    assert r.returncode == 1, r.stderr.decode()
    report = json.loads(r.stdout)
    [device] = report["devices"]
    assert [s["address"] for s in device["segments"]] == [segment["address"]]
    assert any("recorded segment addresses taken: 1 of 1; refused (overlapping a segment "
               "still held, or reaching the simulator's own address range): 0" in n for n in report["notes"]), report["notes"]
    [f] = report["fidelity"]
    assert (f["recorded_addresses"], f["addresses_taken"]) == (1, 1)
    assert run("replay", SMALL, "--json", "--addresses", "recorded").stdout == r.stdout
    # --addresses simulated: the simulator's own address policy places it (docs/simulator.md).
    r = run("replay", SMALL, "--json", "--addresses", "simulated")
    report = json.loads(r.stdout)
    [device] = report["devices"]
    assert [s["address"] for s in device["segments"]] == [0x7f0000000000]
    assert not any("recorded segment addresses" in n for n in report["notes"])
    [f] = report["fidelity"]
    assert f["recorded_addresses"] is None and f["addresses_taken"] is None


def test_replay_recorded_addresses_need_a_snapshot(tmp_path):
    out = tmp_path / "requests.jsonl"
    assert run("convert", SMALL, "-o", str(out), "--to", "requests").returncode == 0
    r = run("replay", str(out), "--capacity", "1GiB", "--addresses", "recorded")
    assert r.returncode == 2
    assert b"--addresses recorded needs a PyTorch memory snapshot" in r.stderr
    r = run("replay", SMALL, "--addresses", "driver")
    assert r.returncode == 2
    assert b"--addresses" in r.stderr


@pytest.mark.parametrize("command", ["analyze", "replay", "convert"])
def test_malicious_pickle_is_refused(tmp_path, command):
    args = [command, os.path.join(DATA, "evil.pickle")]
    if command == "convert":
        args += ["-o", str(tmp_path / "x.jsonl")]
    r = run(*args)
    assert r.returncode == 2
    message = r.stderr.decode()
    assert "GLOBAL" in message and "byte 2" in message, message
    assert not os.path.exists("/tmp/fragscope_pwned")
    assert not (tmp_path / "x.jsonl").exists()


def test_truncated_pickle_names_the_offset():
    r = run("analyze", os.path.join(DATA, "snapshot_truncated.pickle"))
    assert r.returncode == 2
    assert b"snapshot_truncated.pickle: byte" in r.stderr


def test_convert_usage_errors(tmp_path):
    r = run("convert", SMALL, "-o", str(tmp_path / "x.txt"))
    assert r.returncode == 2
    assert b"cannot tell the format" in r.stderr
    trace = os.path.join(SOURCE_DIR, "tests", "data", "sample", "gpt_tiny_3steps.jsonl.gz")
    r = run("convert", trace, "-o", str(tmp_path / "x.json"))
    assert r.returncode == 2
    assert b"--to json converts snapshots" in r.stderr


FIXTURES = os.path.join(SOURCE_DIR, "tests", "data", "snapshots")
GOOD_FIXTURES = sorted(f for f in os.listdir(FIXTURES)
                       if f.endswith((".pickle", ".json", ".gz"))
                       and f not in ("malicious.pickle", "truncated.pickle", "corrupted.pickle"))


def load_fixture(name):
    """Our own fixtures (tools/make_snapshot_fixtures.py), safe to load with Python."""
    import gzip
    path = os.path.join(FIXTURES, name)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    return json.loads(data) if name.endswith(".json") else pickle.loads(data)


@pytest.mark.parametrize("name", GOOD_FIXTURES)
def test_every_fixture_replays_into_its_dumped_segments(name):
    # Every layout (G0..G5, protocols 2/4/5, JSON, gzip, expandable, several devices and
    # streams, a bare segment list): the history replayed from the rebuilt start state ends in
    # exactly the segments the file dumped, with no inconsistency noted.
    snapshot = load_fixture(name)
    segments = snapshot if isinstance(snapshot, list) else snapshot["segments"]
    report = analyze_json(os.path.join(FIXTURES, name))
    assert not [n for n in report["notes"] if "skipped" in n or n.startswith("snapshot:")], \
        report["notes"]
    by_device = {}
    for s in segments:
        d = by_device.setdefault(s.get("device", 0), [0, 0, 0])
        d[0] += 1
        d[1] += s["total_size"]
        d[2] += sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    got = {d["device"]: [d["final"]["all"]["segment_count"], d["final"]["all"]["reserved_bytes"],
                         d["final"]["all"]["allocated_bytes"]]
           for d in report["devices"] if d["final"]["all"]["segment_count"] or d["device"] in by_device}
    assert got == by_device


@pytest.mark.parametrize("name,what", [("malicious.pickle", "GLOBAL"),
                                       ("truncated.pickle", "truncated"),
                                       ("corrupted.pickle", "0xff")])
def test_broken_fixtures_are_refused(name, what):
    r = run("analyze", os.path.join(FIXTURES, name))
    assert r.returncode == 2
    message = r.stderr.decode()
    assert what in message and "byte" in message, message


def odd_snapshot(kind):
    """A small snapshot `analyze` reads whose trace entry has one thing a trace cannot hold as
    it is: a frame name that is not UTF-8, a negative line, a time_us below -1."""
    frame = {"name": "f", "filename": "a.py", "line": 3}
    entry = {"action": "alloc", "addr": 1 << 30, "size": MiB, "stream": 0, "time_us": 5,
             "frames": [frame]}
    seg = {"device": 0, "address": 1 << 30, "total_size": 2 * MiB, "stream": 0,
           "segment_type": "small",
           "blocks": [{"size": MiB, "requested_size": MiB, "state": "active_allocated",
                       "address": 1 << 30, "frames": [frame]},
                      {"size": MiB, "state": "inactive", "address": (1 << 30) + MiB}]}
    if kind == "utf8":
        entry["frames"] = [{"name": "bad", "filename": "a.py", "line": 3}]
    elif kind == "line":
        entry["frames"] = [{"name": "f", "filename": "a.py", "line": -7}]
    elif kind == "time":
        entry["time_us"] = -5
    data = pickle.dumps({"segments": [seg], "device_traces": [[entry]]}, protocol=4)
    return data.replace(b"\x8c\x03bad", b"\x8c\x03b\xffd") if kind == "utf8" else data


@pytest.mark.parametrize("kind", ["utf8", "line", "time"])
def test_convert_to_trace_writes_every_input_analyze_reads(tmp_path, kind):
    # Issue 30 item 12: before, these exited 1 ("not valid UTF-8", "negative line", "time_us
    # is negative") though analyze read them.
    src = tmp_path / "odd.pickle"
    src.write_bytes(odd_snapshot(kind))
    assert run("analyze", str(src)).returncode == 0
    out = tmp_path / "odd.jsonl"
    r = run("convert", str(src), "--to", "trace", "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    frames = [x for x in lines if x.get("action") == "frame"]
    if kind == "utf8":
        assert "b\ufffdd" in [f["name"] for f in frames]
    if kind == "line":
        assert all(f.get("line", 0) >= 0 for f in frames)
    if kind == "time":
        assert all(x.get("time_us", -1) >= -1 for x in lines)
    assert run("analyze", str(out)).returncode == 0


def test_convert_trace_to_trace_keeps_the_call_sites(tmp_path):
    # A trace reader learns its frames as it reads; convert looked them up before the first
    # event and wrote every event of a trace without its call site.
    src = os.path.join(SOURCE_DIR, "tests", "data", "traces", "small.jsonl")
    out = tmp_path / "out.jsonl"
    r = run("convert", src, "--to", "trace", "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()

    def sites(path):
        frames, named = {}, []
        for line in open(path, encoding="utf-8"):
            x = json.loads(line)
            if x.get("action") == "frame":
                frames[x["id"]] = (x["name"], x.get("filename", ""), x.get("line", 0))
            elif "frame" in x:
                named.append((x["action"], x["addr"], frames[x["frame"]]))
        return named

    assert sites(src), "the fixture names call sites"
    assert sites(out) == sites(src)


def test_event_counts_have_thousands_separators(tmp_path):
    """Every event count a person reads is grouped: 52,518, not 52518 (issue 29 item 11)."""
    sample = os.path.join(SOURCE_DIR, "tests", "data", "sample", "gpt_tiny_50steps.jsonl.gz")
    r = run("convert", sample, "-o", str(tmp_path / "alloc.jsonl"))
    assert r.returncode == 0, r.stderr.decode()
    m = re.search(rb"wrote ([0-9,]+) allocator events", r.stderr)
    assert m and b"," in m.group(1), r.stderr
