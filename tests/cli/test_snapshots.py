"""fragscope reads every real PyTorch memory snapshot in ../shared/snapshots/real and agrees with
PyTorch's own tool on what the files hold.

The files are read in place: their licences do not allow copying them into this repository. The
test is skipped when the folder is absent. The expected figures come from PyTorch itself:

    /usr/bin/python3 tools/snapshot_parity.py ../shared/snapshots/real/*

which runs torch.cuda._memory_viz.stats() (Debian's torch 1.13) over each file's segment list:
segments, total_size (reserved, all devices) and active_allocated bytes, plus the number of
trace entries. fragscope's figures are the final state of its replay of the file's history
(start state rebuilt from the segments, then every recorded event), summed over devices, so
agreement also checks that the history replays into exactly the segments PyTorch dumped.
"""

import json
import os
import subprocess

import pytest

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

# (file, segments, reserved bytes, allocated bytes, trace entries) per tools/snapshot_parity.py.
PYTORCH_FIGURES = [
    ("albi2_dump_snapshot.pickle", 3, 85983232, 17049600, 0),
    ("angelolmn_my_snapshot.pickle", 0, 0, 0, 0),
    ("bcrafton_memory_snapshot.pickle", 96, 4238344192, 3072871424, 6486),
    ("charran_dump_snapshot.pickle", 12, 109051904, 90861056, 0),
    ("constructorsun_memory_snapshot.pickle", 12, 114628231168, 28728827904, 7923),
    ("cranberrii_memory_snapshot.pickle", 215, 6471811072, 2297283072, 10307),
    ("felix_dump_snapshot_f46f1f5.pickle", 12, 190840832, 88716288, 0),
    ("hugepanda_my_snapshot_a617bea.pickle", 51, 20860370944, 3075039744, 3797),
    ("jaspersolt_snapshot.pickle", 10, 134217728, 48760832, 5803),
    ("jogregoire_my_snapshot.pickle", 7, 33554432, 14503424, 1),
    ("kkaitlyn_memory_2.7b_forward.pickle", 961, 34898706432, 34094880256, 8694),
    ("kkaitlyn_memory_ctx128_forward_mixed.pickle", 688, 24245174272, 24018738176, 5992),
    ("kkaitlyn_memory_ctx128_fullstep.pickle", 1010, 61111009280, 54873829888, 19052),
    ("kkaitlyn_memory_small_forward.pickle", 30, 1107296256, 1043817472, 8507),
    ("kkaitlyn_memory_snapshot.pickle", 1457, 75902222336, 55083942400, 0),
    ("lfielike_my_snapshot.pickle", 259, 17133731840, 16397578240, 1),
    ("magma27_memory_snapshot.pickle", 216, 14180941824, 1377753600, 5163),
    ("maphsge4_snapshot_04d383c.pickle", 136, 18566086656, 16199101440, 10327),
    ("maphsge4_snapshot_1f2f548.pickle", 82, 2776629248, 1875182080, 4496),
    ("maphsge4_snapshot_dec166a.pickle", 40, 5559549952, 545266688, 0),
    ("muduard_dump_snapshot_413b2eb.pickle", 673, 11274289152, 10715782144, 2),
    ("muduard_dump_snapshot_e600157.pickle", 368, 5475663872, 3848104960, 0),
    ("muduard_memory_snapshot.pkl", 255, 3649044480, 3353639424, 0),
    ("nesta_memory_snapshot.json", 120, 22571646976, 22536960512, 1299),
    ("nothanmin_memory_snapshot.pickle", 999, 23842521088, 16019091968, 19464),
    ("nothanmin_memory_snapshot_forward.pickle", 1722, 47234154496, 44607570432, 8948),
    ("silmont_mem_snapshot.pickle", 9, 3781165056, 31719936, 97),
    ("silmont_memory_forward_bf16_128.pickle", 43, 861929472, 525286400, 2811),
    ("silmont_memory_forward_fp32_128.pickle", 29, 610271232, 525286400, 2043),
    ("sunny_dump_snapshot.pickle", 0, 0, 0, 0),
    ("wedsonlin_medium_128_inference.pickle", 98, 1763704832, 1703276544, 3840),
    ("wedsonlin_medium_128_training.pickle", 377, 7235174400, 6816891392, 19136),
    ("yiyi_1.3b_snapshot_61261a2.pickle", 257, 7608467456, 5683450880, 1),
    ("yiyi_1.3b_snapshot_a21816f.pickle", 266, 6658457600, 3872498688, 1),
    ("yiyi_oom_snapshot.pickle", 176, 11844714496, 11840159744, 1),
]


def analyze(path):
    proc = subprocess.run([BIN, "analyze", path, "--json", "--no-map"], capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_the_table_covers_every_real_file():
    assert sorted(row[0] for row in PYTORCH_FIGURES) == sorted(os.listdir(REAL))


@pytest.mark.parametrize("name,segments,reserved,allocated,entries", PYTORCH_FIGURES,
                         ids=[row[0] for row in PYTORCH_FIGURES])
def test_real_snapshot_matches_pytorch(name, segments, reserved, allocated, entries):
    report = analyze(os.path.join(REAL, name))
    finals = [d["final"]["all"] for d in report["devices"]]
    assert sum(f["segment_count"] for f in finals) == segments
    assert sum(f["reserved_bytes"] for f in finals) == reserved
    assert sum(f["allocated_bytes"] for f in finals) == allocated
    assert report["notes"][0].startswith("memory snapshot (")
    if entries:
        assert f"{entries:,} history entr" in report["notes"][0]


@pytest.mark.parametrize("name", [row[0] for row in PYTORCH_FIGURES])
def test_real_snapshot_replays_into_its_recorded_segments(name):
    # The recorded requests replayed through the simulator under the recorded settings, after
    # the start state was rebuilt with requests, with the segments at the addresses the real
    # driver gave them (the default for a snapshot, so that equal-fit ties between segments
    # break as they did): every device's final segments equal the recorded ones block by
    # block, and reserved memory agrees at the end and at its peak (docs/benchmarks.md,
    # "Simulator fidelity").
    proc = subprocess.run([BIN, "replay", os.path.join(REAL, name), "--json", "--no-map"],
                          capture_output=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr.decode()
    report = json.loads(proc.stdout)
    for f in report["fidelity"] or []:  # null for a snapshot without segments
        assert f["segment_agreement"] == 1.0, (f["device"], f)
        assert f["sim_reserved_bytes"] == f["real_reserved_bytes"]
        assert f["sim_peak_reserved_bytes"] == f["real_peak_reserved_bytes"]


@pytest.mark.parametrize("name", ["constructorsun_memory_snapshot.pickle",
                                  "nesta_memory_snapshot.json"])
def test_tune_of_a_real_oom_snapshot_reproduces_its_oom(name):
    # The two real snapshots whose history ends in an OOM. `tune` gives the failing device the
    # size its OOM reveals, and under the recorded settings the replay fails at the request
    # that failed in the recorded run, as `replay` does.
    path = os.path.join(REAL, name)
    replay = json.loads(subprocess.run([BIN, "replay", path, "--json", "--no-map"],
                                       capture_output=True, timeout=300).stdout)
    [conf] = {d["alloc_conf"] for d in replay["devices"]}
    proc = subprocess.run([BIN, "tune", path, "--json", "--setting", conf],
                          capture_output=True, timeout=300)
    assert proc.returncode == 1, proc.stderr.decode()
    tuned = json.loads(proc.stdout)
    [row] = tuned["ranked"]
    assert row["recorded"] is True
    assert row["oom"] is True
    assert row["oom_event_index"] == replay["ooms"][0]["event_index"]
    failing = str(replay["ooms"][0]["device"])
    assert list(tuned["device_capacity_bytes"]) == [failing]
