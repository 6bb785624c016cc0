"""A snapshot's headline figures agree between the commands, and come from what was recorded.

For every real PyTorch snapshot in ../shared/snapshots/real (read in place, skipped when the folder
is absent, as tests/cli/test_snapshots.py): `analyze`, `replay` and `tune` (its recorded-settings
row) report the same peak allocated and peak reserved, since the replay of a snapshot's requests
under its recorded settings rebuilds the same blocks, and the events that rebuild its start state
are not part of the run in any of them (docs/snapshots.md, "Recorded and rebuilt figures").
"""

import json
import os
import subprocess

import pytest

import bounds

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
REAL = os.path.normpath(os.path.join(SOURCE_DIR, "..", "shared", "snapshots", "real"))

pytestmark = [
    pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                       reason="FRAGSCOPE_BIN is not set to the built fragscope"),
    pytest.mark.skipif(not os.path.isdir(REAL), reason=f"{REAL} is absent"),
]

SNAPSHOTS = sorted(os.listdir(REAL)) if os.path.isdir(REAL) else []
if bounds.SANITIZED:
    # The figures are checked on every snapshot by the plain build; the sanitizer build looks
    # for memory errors on the formats and shapes, which the ones up to 1 MB span, at a fifth
    # of the time (each command runs 5-20 times slower there).
    SNAPSHOTS = [n for n in SNAPSHOTS if os.path.getsize(os.path.join(REAL, n)) <= 1_000_000]


def run(*args, ok=(0, 1)):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)
    assert p.returncode in ok, p.stderr
    return p


def run_json(*args):
    return json.loads(run(*args, "--json").stdout)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_analyze_replay_and_tune_agree_on_peaks(name):
    path = os.path.join(REAL, name)
    analyzed = run_json("analyze", path, "--no-map")
    replayed = run_json("replay", path, "--no-map")
    if not analyzed["devices"]:
        return  # an empty snapshot: nothing to compare
    # tune under the settings the snapshot recorded (those the replay used)
    recorded = replayed["devices"][0]["alloc_conf"]
    tuned = run_json("tune", path, "--setting", recorded, "--threads", "1")
    # Devices that held memory (a device whose history has a stray entry and nothing else, as
    # muduard's device 0, has no requests to replay).
    real = {d["device"]: d for d in analyzed["devices"] if d["peak_reserved"]["bytes"] > 0}
    sim = {d["device"]: d for d in replayed["analysis"]["devices"]}
    assert set(real) <= set(sim)
    for device, r in real.items():
        s = sim[device]
        assert s["peak_allocated"]["bytes"] == r["peak_allocated"]["bytes"], device
        assert s["peak_reserved"]["bytes"] == r["peak_reserved"]["bytes"], device
    stats = {d["device"]: d for d in replayed["devices"]}
    for device, r in real.items():
        assert stats[device]["peak_allocated_bytes"] == r["peak_allocated"]["bytes"], device
        assert stats[device]["peak_reserved_bytes"] == r["peak_reserved"]["bytes"], device
    for f in replayed["fidelity"]:
        assert f["sim_peak_reserved_bytes"] == f["real_peak_reserved_bytes"], f
    # tune's row: the figures of the device with the highest peak reserved.
    row = tuned["recorded"]
    assert row is not None and row["alloc_conf"] == recorded
    top = max(stats.values(), key=lambda d: d["peak_reserved_bytes"])
    assert row["peak_reserved_bytes"] == top["peak_reserved_bytes"]
    assert row["peak_allocated_bytes"] == top["peak_allocated_bytes"]


def test_segments_only_snapshot_reports_its_final_state():
    """kkaitlyn's snapshot has no history: its only real state is the final one (27%
    fragmented), not a moment in the middle of rebuilding it (58%)."""
    path = os.path.join(REAL, "kkaitlyn_memory_snapshot.pickle")
    d = run_json("analyze", path, "--no-map")["devices"][0]
    final = d["final"]["all"] if "final" in d else None
    assert d["worst_fragmentation"]["ratio"] < 0.3
    assert d["max_cached_free"]["bytes"] < d["peak_reserved"]["bytes"]
    if final is not None:
        assert d["worst_fragmentation"]["ratio"] == pytest.approx(final["fragmentation_ratio"])
    run("check", path, "--max-fragmentation", "0.3", ok=(0,))
    # The report says which figures are recorded and which rebuilt.
    notes = run_json("analyze", path, "--no-map")["notes"]
    assert any("every figure is the final state's" in n and "not part of the run" in n
               for n in notes), notes
    notes = run_json("replay", path, "--no-map")["notes"]
    assert any("rebuild the start state are not part of the run" in n for n in notes), notes


def fmt_bytes(n):
    """FormatBytes (src/common/units.cc)."""
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_replay_says_which_requested_figure_is_which(name):
    # Issue 29, item 4: analyze and replay of a snapshot agree on requested bytes, or the
    # replay says which figure is which and why (nothanmin: 21.26 GiB recorded, 21.68 GiB
    # replayed, from start-state blocks asked for by their block size).
    path = os.path.join(REAL, name)
    analyzed = run_json("analyze", path, "--no-map")
    replayed = run_json("replay", path, "--no-map")
    real = {d["device"]: d for d in analyzed["devices"]}
    for s in replayed["analysis"]["devices"]:
        r = real.get(s["device"])
        if r is None:
            continue
        same = (s["peak_live_requested"] or {}).get("bytes") == \
            (r["peak_live_requested"] or {}).get("bytes") and \
            s["live_requested_bytes"] == r["live_requested_bytes"]
        notes = [n for n in replayed["notes"]
                 if n.startswith(f"device {s['device']}: requested bytes are the replay's")]
        if same:
            assert not notes, notes
            continue
        assert len(notes) == 1, (s["device"], replayed["notes"])
        note = notes[0]
        assert (f"peak live requested {fmt_bytes(s['peak_live_requested']['bytes'])} replayed "
                f"vs {fmt_bytes(r['peak_live_requested']['bytes'])} recorded") in note
        assert (f"{fmt_bytes(s['live_requested_bytes'])} vs "
                f"{fmt_bytes(r['live_requested_bytes'])} at the end") in note
        assert "Why: " in note


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_extremes_do_not_depend_on_the_sampling(name):
    # Issue 29, item 1: the worst moments are taken at every event, so --every never changes
    # them (nesta: worst fragmentation was 1.6% @ event 999 by default, 98.0% @ 1 with
    # --every 1).
    path = os.path.join(REAL, name)
    keys = ("worst_fragmentation", "min_largest_free_block", "min_max_allocatable",
            "max_cached_free", "peak_reserved", "peak_allocated", "peak_live_requested")

    def extremes(*every):
        d = run_json("analyze", path, "--no-map", *every)
        return {x["device"]: {k: x[k] for k in keys} for x in d["devices"]}
    default = extremes()
    assert extremes("--every", "1") == default
    assert extremes("--every", "7") == default
