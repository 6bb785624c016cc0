"""`fragscope diff`: two runs side by side, and the rank that differs (issue 33 item 2;
docs/user-guide.md, "Comparing runs"; docs/metrics.md, "Comparing runs").

Goldens (tests/cli/golden/diff_*; FRAGSCOPE_UPDATE_GOLDEN=1 rewrites them, as for
test_analyze.py): the bundled sample under two allocator settings on a device where only the
first runs out of memory (text and JSON), two real snapshots of ../shared/snapshots/real (read
in place by a relative path, skipped when absent), and per-rank request traces made from the
sample in a temporary folder, one of which allocates an extra buffer. Beside the goldens: each
side's figures are `analyze`'s / `replay`'s own, and bad input gets a message naming the input
and where.
"""

import gzip
import json
import os

import pytest

from test_analyze import BIN, SAMPLE, SOURCE_DIR, check_golden, run

REAL = os.path.join("..", "shared", "snapshots", "real")  # relative to SOURCE_DIR
BF16 = os.path.join(REAL, "silmont_memory_forward_bf16_128.pickle")
FP32 = os.path.join(REAL, "silmont_memory_forward_fp32_128.pickle")
NOTHANMIN_FWD = os.path.join(REAL, "nothanmin_memory_snapshot_forward.pickle")
NOTHANMIN_FULL = os.path.join(REAL, "nothanmin_memory_snapshot.pickle")
# 462 MiB: the sample runs out of memory at step 1 under the default settings and fits with
# expandable segments (its peak requested is 441.5 MiB).
TWO_SETTINGS = [SAMPLE, "--capacity", "462MiB", "--alloc-conf", "expandable_segments:True"]
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def present(*paths):
    return all(os.path.exists(os.path.join(SOURCE_DIR, p)) for p in paths)


def ok(*args, cwd=SOURCE_DIR):
    result = run("diff", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    return result.stdout.decode("utf-8")


def bad(*args):
    result = run("diff", *args)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == b""
    err = result.stderr.decode("utf-8")
    assert err.startswith("fragscope: ") and err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------------------------------------
# Goldens
# ---------------------------------------------------------------------------------------------

def test_sample_under_two_settings_golden():
    check_golden("diff_sample_two_settings.txt", ok(*TWO_SETTINGS))


def test_when_both_runs_fail_the_headline_leads_with_which_fails_first():
    # The 50-step sample on 520 MiB fails under both settings, at step 18 under the defaults and
    # at step 5 under expandable_segments: B's peaks are lower only because it stopped sooner,
    # so the headline says first that B fails earlier.
    sample50 = SAMPLE.replace("gpt_tiny_3steps", "gpt_tiny_50steps")
    out = ok(sample50, "--capacity", "520MiB", "--alloc-conf", "expandable_segments:True")
    headline = next(line for line in out.splitlines() if line.startswith("device 0 of A"))
    assert headline.split(": ", 1)[1].startswith(
        "B runs out of memory earlier (step 5, against step 18 in A; the peaks are each run's "
        "up to its first OOM)"), headline


def test_sample_under_two_settings_json_golden():
    out = ok(*TWO_SETTINGS, "--format", "json")
    check_golden("diff_sample_two_settings.json", out)
    j = json.loads(out)
    assert j["schema"] == "fragscope.diff" and j["mode"] == "pair"
    (pair,) = j["devices"]
    # A runs out of memory at a request of the trace; B, with expandable segments, does not.
    assert pair["changes"]["ooms"] == {"a": 1, "b": 0, "change": -1}
    assert pair["a"]["first_oom"]["index_of"] == "request"
    assert pair["b"]["first_oom"] is None
    assert pair["headline"].startswith("A runs out of memory, B does not"), pair["headline"]


@pytest.mark.skipif(not present(BF16, FP32), reason="the real snapshots are absent")
def test_two_real_snapshots_golden():
    check_golden("diff_real_snapshots.txt", ok(BF16, FP32))


def rank_traces(folder, extra_rank):
    """Four per-rank request traces of one job, made from the sample: rank k records device k,
    and `extra_rank` also keeps a 64 MiB buffer from a call site no other rank has."""
    with gzip.open(os.path.join(SOURCE_DIR, SAMPLE), "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    names = []
    for rank in range(4):
        out = []
        for e in lines:
            e = dict(e)
            if "format" in e:
                e["devices"] = [{"device": rank, "name": f"rank{rank}",
                                 "capacity_bytes": 1 << 30}]
            elif e.get("action") in ("alloc", "free_requested", "free_completed"):
                e["device"] = rank
            out.append(e)
            if rank == extra_rank and e.get("action") == "step" and e.get("step") == 1:
                out.append({"action": "frame", "id": 999, "name": "train.py:88 in eval_buffer"})
                out.append({"action": "alloc", "addr": 10 ** 9, "size": 64 * MiB,
                            "device": rank, "frame": 999})
        name = f"rank{rank}.jsonl"
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e) + "\n" for e in out)
        names.append(name)
    return names


def test_ranks_golden_names_the_rank_with_an_extra_call_site(tmp_path):
    names = rank_traces(tmp_path, extra_rank=2)
    out = ok(*names, cwd=tmp_path)
    check_golden("diff_ranks.txt", out)
    j = json.loads(ok(*names, "--format", "json", cwd=tmp_path))
    assert j["mode"] == "ranks"
    assert [r["device"]["device"] for r in j["ranks"]] == [0, 1, 2, 3]
    (rank,) = j["differing"]
    assert rank["rank"] == 2 and rank["device"] == 2
    assert [s["site"] for s in rank["extra_sites"]] == ["train.py:88 in eval_buffer"]
    assert rank["extra_sites"][0]["peak_live_bytes"] == 64 * MiB
    # 64 MiB more of about 440 MiB requested: more requested, by its figures.
    requested = [d for d in rank["deviations"] if d["figure"] == "peak_requested_bytes"]
    assert requested and requested[0]["direction"] == "more"
    assert requested[0]["value"] - requested[0]["median_of_others"] == 64 * MiB


def test_alike_ranks_do_not_differ(tmp_path):
    names = rank_traces(tmp_path, extra_rank=None)
    out = ok(*names, cwd=tmp_path)
    assert "No rank differs" in out, out


@pytest.mark.skipif(not present(NOTHANMIN_FWD, NOTHANMIN_FULL),
                    reason="the real snapshots are absent")
def test_real_snapshots_the_odd_one_out_is_named():
    # Three dumps of the forward pass and one of a full training step: the full step differs.
    j = json.loads(ok(NOTHANMIN_FWD, NOTHANMIN_FWD, NOTHANMIN_FULL, NOTHANMIN_FWD,
                      "--format", "json"))
    assert [d["rank"] for d in j["differing"]] == [2], j["differing"]
    assert j["differing"][0]["extra_sites"] or j["differing"][0]["deviations"]


# ---------------------------------------------------------------------------------------------
# Each side's figures are analyze's and replay's own
# ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(not present(BF16, FP32), reason="the real snapshots are absent")
def test_snapshot_figures_are_analyzes():
    (pair,) = json.loads(ok(BF16, FP32, "--format", "json"))["devices"]
    for side, path in (("a", BF16), ("b", FP32)):
        result = run("analyze", path, "--json", "--no-map")
        assert result.returncode == 0, result.stderr.decode()
        (d,) = json.loads(result.stdout)["devices"]
        figures = pair["changes"]
        assert figures["peak_reserved_bytes"][side] == d["peak_reserved"]["bytes"]
        assert figures["peak_allocated_bytes"][side] == d["peak_allocated"]["bytes"]
        assert figures["peak_requested_bytes"][side] == d["peak_live_requested"]["bytes"]
        assert figures["worst_fragmentation_ratio"][side] == d["worst_fragmentation"]["ratio"]
        assert figures["stranded_bytes_at_end"][side] == d["final"]["all"]["stranded_bytes"]
        assert figures["ooms"][side] == d["ooms"]


def test_replayed_figures_are_replays():
    (pair,) = json.loads(ok(*TWO_SETTINGS, "--format", "json"))["devices"]
    for side, conf in (("a", []), ("b", ["--alloc-conf", "expandable_segments:True"])):
        result = run("replay", SAMPLE, "--capacity", "462MiB", *conf, "--json", "--no-map")
        assert result.returncode in (0, 1), result.stderr.decode()
        j = json.loads(result.stdout)
        (d,) = j["analysis"]["devices"]
        assert pair["changes"]["peak_reserved_bytes"][side] == d["peak_reserved"]["bytes"]
        assert pair["changes"]["worst_fragmentation_ratio"][side] == \
            d["worst_fragmentation"]["ratio"]
        if j["ooms"]:
            oom = pair[side]["first_oom"]
            assert oom["event_index"] == j["ooms"][0]["event_index"]
            assert oom["requested_bytes"] == j["ooms"][0]["requested_bytes"]


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

def test_one_file_says_what_to_give():
    err = bad(SAMPLE)
    assert "one input given (tests/data/sample/gpt_tiny_3steps.jsonl.gz)" in err
    assert "--alloc-conf" in err


def test_inputs_of_different_kinds_are_refused_naming_both():
    err = bad("tests/data/cli/snapshot_small.pickle", SAMPLE)
    assert "A (tests/data/cli/snapshot_small.pickle) is a snapshot" in err
    assert f"B ({SAMPLE}) is a request trace" in err


def test_an_unreadable_input_is_named_with_where():
    err = bad("tests/data/cli/snapshot_small.pickle", "tests/data/cli/snapshot_truncated.pickle")
    assert err.startswith("fragscope: B: tests/data/cli/snapshot_truncated.pickle: byte "), err
    err = bad("tests/data/cli/allocator_basic.jsonl", "tests/data/cli/no_such_file.jsonl")
    assert err.startswith("fragscope: B: tests/data/cli/no_such_file.jsonl: "), err
    err = bad("tests/data/cli/bad_unknown_action.jsonl", "tests/data/cli/allocator_basic.jsonl")
    assert err.startswith("fragscope: A: tests/data/cli/bad_unknown_action.jsonl:"), err


def test_an_allocator_trace_has_no_requests_to_replay():
    err = bad("tests/data/cli/allocator_basic.jsonl", "--alloc-conf", "expandable_segments:True")
    assert "an allocator trace records what the allocator did" in err


def test_settings_are_for_two_runs_only():
    err = bad(SAMPLE, SAMPLE, SAMPLE, "--alloc-conf", "expandable_segments:True")
    assert "--alloc-conf and --alloc-conf-a are for two runs" in err


def test_a_bad_setting_names_the_side():
    err = bad(SAMPLE, "--capacity", "1GiB", "--alloc-conf", "expandable_segments:Maybe")
    assert err.startswith("fragscope: B: "), err


def test_inputs_without_step_markers_name_no_step():
    # Two TensorFlow BFC dumps (read as allocator traces, no step markers): each first OOM is
    # named by its event alone, not "before the first step marker".
    out = ok("tests/data/bfc_text/tf1_fragmentation.log", "tests/data/bfc_text/tf2_shortage.log")
    lines = [line for line in out.splitlines() if line.startswith("  first OOM of ")]
    assert len(lines) == 2, out
    for line in lines:
        assert ": event " in line and "step" not in line, line
    assert "fragmentation:" in lines[0] and "shortage:" in lines[1], lines


def test_json_flag_is_format_json():
    assert ok(*TWO_SETTINGS, "--json") == ok(*TWO_SETTINGS, "--format", "json")
