"""Tests for tools/make_snapshot_fixtures.py.

    /usr/bin/python3 -m pytest tools/tests

Python's own pickle must load every fixture except the broken ones, which are only inspected
with pickletools (it decodes opcodes without running them): the malicious one is never loaded.
"""

import gzip
import json
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "make_snapshot_fixtures.py"
COMMITTED = Path(__file__).resolve().parents[2] / "tests" / "data" / "snapshots"
BROKEN = {"malicious.pickle", "truncated.pickle", "corrupted.pickle"}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("snapshots")
    subprocess.run([sys.executable, str(TOOL), "--out", str(out)], check=True,
                   capture_output=True, timeout=120)
    return out


def load(path):
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    if path.suffix == ".json":
        return json.loads(data)
    return pickle.loads(data)


def segments_of(snap):
    return snap if isinstance(snap, list) else snap["segments"]


def test_every_good_fixture_loads_and_is_consistent(out):
    names = sorted(p.name for p in out.iterdir())
    assert len(names) >= 18
    for path in sorted(out.iterdir()):
        if path.name in BROKEN:
            continue
        snap = load(path)
        for seg in segments_of(snap):
            # Blocks tile the segment.
            assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"], path.name
            if "address" in seg["blocks"][0]:
                at = seg["address"]
                for b in seg["blocks"]:
                    assert b["address"] == at, path.name
                    at += b["size"]
            active = [b for b in seg["blocks"] if b["state"] == "active_allocated"]
            assert seg["allocated_size"] == sum(b["size"] for b in active)


def test_layouts(out):
    g0 = load(out / "g0_history.pickle")
    block = g0["segments"][0]["blocks"][0]
    assert "history" in block and "address" not in block and "frames" not in block
    assert "time_us" not in g0["device_traces"][0][0]
    assert list(g0["device_traces"][0][0]["frames"][0]) == ["filename", "name", "line"]
    g1 = load(out / "g1_blocks_with_address.pickle")
    assert len(g1["device_traces"]) == 4 and g1["segments"][0]["segment_pool_id"] == (0, 0)
    assert "time_us" not in g1["device_traces"][0][0]
    assert "time_us" in load(out / "g2_time_us.pickle")["device_traces"][0][0]
    g3 = load(out / "g3_settings_annotations.pickle")
    assert "allocator_settings" in g3 and g3["external_annotations"]
    assert load(out / "g4_compile_context.pickle")["device_traces"][0][0]["compile_context"] \
        == "N/A"
    assert load(out / "g5_user_metadata.pickle")["device_traces"][0][0]["user_metadata"] == ""
    assert isinstance(load(out / "segments_list.pickle"), list)
    assert load(out / "empty.pickle")["segments"] == []
    assert load(out / "g3_snapshot.json")["segments"][0]["segment_pool_id"] == [0, 0]
    for name, proto in [("g2_protocol2.pickle", 2), ("g2_time_us.pickle", 4),
                        ("g5_protocol5.pickle", 5)]:
        first = next(pickletools.genops((out / name).read_bytes()))
        assert first[0].name == "PROTO" and first[1] == proto
    actions = {e["action"] for e in load(out / "g4_expandable.pickle")["device_traces"][0]}
    assert {"segment_map", "segment_unmap"} <= actions
    many = load(out / "g5_three_devices_two_streams.pickle")
    assert len(many["device_traces"]) == 3
    assert len({s["stream"] for s in many["segments"]}) == 2
    oom = [e["action"] for e in load(out / "g2_oom.pickle")["device_traces"][0]]
    assert oom[-4:] == ["segment_free"] * 3 + ["oom"]


def test_frames_are_shared_objects(out):
    snap = load(out / "g2_time_us.pickle")
    entries = snap["device_traces"][0]
    frame_ids = {id(f) for e in entries for f in e["frames"]}
    frame_refs = sum(len(e["frames"]) for e in entries)
    assert len(frame_ids) < frame_refs / 4
    list_ids = {id(e["frames"]) for e in entries}
    assert len(list_ids) < len(entries)


def test_broken_fixtures_are_never_loaded(out):
    ops = [op.name for op, _, _ in pickletools.genops((out / "malicious.pickle").read_bytes())]
    assert "GLOBAL" in ops and "REDUCE" in ops
    with pytest.raises(Exception):
        pickle.loads((out / "truncated.pickle").read_bytes())
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads((out / "corrupted.pickle").read_bytes())


def test_committed_fixtures_are_up_to_date(out):
    for path in sorted(out.iterdir()):
        assert (COMMITTED / path.name).read_bytes() == path.read_bytes(), \
            "%s is stale: rerun tools/make_snapshot_fixtures.py" % path.name


def test_big_mode(tmp_path):
    big = tmp_path / "big.pickle"
    subprocess.run([sys.executable, str(TOOL), "--big", str(big), "--entries", "5000"],
                   check=True, capture_output=True, timeout=120)
    snap = pickle.loads(big.read_bytes())
    entries = snap["device_traces"][0]
    assert len(entries) == 5000
    assert list(entries[0]) == ["action", "addr", "size", "stream", "time_us", "frames"]
    assert 120 < big.stat().st_size / len(entries) < 400
    assert all(isinstance(f, dict) for e in entries for f in e["frames"])
