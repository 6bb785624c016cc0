"""Tests of `fragscope explain` against the built binary.

The message fixtures are in tests/data/oom_text (README there); the replay fixture
tests/data/explain/fragmented_oom.jsonl is worked out in tests/data/explain/README.md: on a
160 MiB device the defaults run out of memory on an 80 MiB request with 40 MiB free on the
device and 60 MiB cached in three 20 MiB gaps; expandable_segments:True and max_split_size_mb:32
both make it fit.
"""

import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
DATA = "tests/data/oom_text/"
TRACE = "tests/data/explain/fragmented_oom.jsonl"
MESSAGE = "tests/data/explain/fragmented_oom.txt"
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args, stdin=None):
    return subprocess.run([BIN, "explain", *args], cwd=SOURCE_DIR, capture_output=True,
                          timeout=300, input=stdin)


def explain_json(*args, stdin=None):
    r = run(*args, "--json", stdin=stdin)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["schema"] == "fragscope.explain"
    assert doc["schema_version"] == 1
    return doc


@pytest.mark.parametrize("name,verdict", [
    ("classic_pre110.txt", "fragmentation"),
    ("classic_hint.txt", "fragmentation"),
    ("capacity_of_21.txt", "fragmentation"),
    ("capacity_of_22.txt", "fragmentation"),
    ("private_pools.txt", "shortage"),  # F + U < S: the private pools' cache is not reachable
    ("private_pools_shortage.txt", "shortage"),
    ("limit_allowed.txt", "cap"),  # R + S beyond the allowed memory fraction
    ("cap_allowed.txt", "cap"),
    ("cap_allowed_hip.txt", "cap"),
    ("cap_allowed_xpu.txt", "cap"),
    ("limit_unprinted.txt", "cap"),  # far more free than the request: an unprinted limit
    ("other_processes.txt", "other_processes"),
    ("container_self.txt", "fragmentation"),
    ("shortage.txt", "shortage"),
    ("rocm_hip.txt", "fragmentation"),
    ("rocm_hip_classic.txt", "fragmentation"),
    ("xpu.txt", "fragmentation"),
    ("xpu_estimated_free.txt", "fragmentation"),
    ("rounded_full.txt", "fragmentation"),  # R + F 0.1% above T: the printing's rounding
    ("json_log.jsonl", "fragmentation"),
    ("classic_cached.txt", "fragmentation"),  # 1.0-1.3: "... free; M cached)"
    ("classic_outside.txt", "shortage"),  # F + U < S, whoever holds the rest of the card
    ("sysmem_fallback.txt", "fragmentation"),  # R > T: Windows' WDDM sysmem fallback
    ("sysmem_fallback_shortage.txt", "shortage"),
    ("quoted.txt", "fragmentation"),  # quoted from "Tried to allocate" on
    ("quoted_classic.txt", "fragmentation"),
    ("quoted_hip.txt", "fragmentation"),
    ("newer_link.txt", "shortage"),
])
def test_verdict_of_each_wording(name, verdict):
    doc = explain_json(DATA + name)
    assert len(doc["errors"]) == 1
    assert doc["errors"][0]["verdict"] == verdict
    assert doc["errors"][0]["missing"] == []
    assert doc["verification"] is None


def test_small_request_note_and_no_split_limit():
    # "Tried to allocate 20.00 MiB": the large pool's smallest segment; max_split_size_mb
    # cannot protect it (the minimum is 20 MiB).
    doc = explain_json(DATA + "classic_pre110.txt")
    e = doc["errors"][0]
    assert any("between 1 MiB and 10 MiB" in n for n in e["notes"])
    assert all(r["id"] != "max_split_size_mb" for r in e["remedies"])
    assert e["stranded_bytes"] == round(9.88 * 1024 * MiB) - round(9.81 * 1024 * MiB)


def test_fragmentation_text_report_names_stranded_memory_and_remedies():
    r = run(DATA + "classic_hint.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    # 14.90 GiB reserved - 12.10 GiB allocated = 2.80 GiB stranded.
    assert "Verdict: fragmentation" in out
    assert "Stranded (cached but unusable for this request): 2.80 GiB" in out
    assert "1. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out
    assert "needs PyTorch 2.1 or newer" in out  # a classic (<= 2.0) message
    # 512 MiB request: half is 256 MiB, a power of two.
    assert "2. Set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256" in out
    assert "segment size the allocator asked the driver for" in out
    assert "line 4" in out


@pytest.mark.parametrize("name", ["rocm_hip.txt", "rocm_hip_classic.txt"])
def test_hip_messages_name_the_hip_variable(name):
    r = run(DATA + name)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "1. Set PYTORCH_HIP_ALLOC_CONF=expandable_segments:True" in out
    assert "Set PYTORCH_CUDA_ALLOC_CONF" not in out
    doc = explain_json(DATA + name)
    e = doc["errors"][0]
    assert e["backend"] == "HIP"
    assert e["truncated"] is False
    settings = [r for r in e["remedies"] if r["alloc_conf"]]
    assert settings
    for remedy in settings:
        assert remedy["action"].startswith("Set PYTORCH_HIP_ALLOC_CONF="), remedy["action"]


def test_xpu_messages_name_the_xpu_variable_and_only_settings_xpu_reads():
    # PyTorch's XPU allocator reads PYTORCH_XPU_ALLOC_CONF and, of the settings, only
    # expandable_segments (c10/xpu/XPUCachingAllocator.cpp: no max_split_size, no garbage
    # collection), so no other setting is proposed.
    r = run(DATA + "xpu.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "1. Set PYTORCH_XPU_ALLOC_CONF=expandable_segments:True" in out
    assert "PYTORCH_CUDA_ALLOC_CONF" not in out
    assert "(PyTorch 2.1)" not in out  # CUDA's version labels do not apply
    assert "PyTorch's XPU allocator" in out
    e = explain_json(DATA + "xpu.txt")["errors"][0]
    assert e["backend"] == "XPU"
    assert [r["alloc_conf"] for r in e["remedies"] if r["alloc_conf"]] == [
        "expandable_segments:True"]
    assert any("reads expandable_segments only" in n for n in e["notes"])
    assert not any("cannot report its free memory" in n for n in e["notes"])
    # free == total - reserved: the figure may be PyTorch's estimate.
    e = explain_json(DATA + "xpu_estimated_free.txt")["errors"][0]
    assert e["figures"]["outside_bytes"] == 0
    assert any("cannot report its free memory" in n for n in e["notes"])


def test_xpu_message_without_free_figure_points_at_torch_xpu():
    r = run(DATA + "xpu_no_free.txt")
    assert r.returncode == 2
    out = r.stdout.decode()
    assert "Missing: free" in out
    assert "torch.xpu.memory._record_memory_history()" in out
    assert "torch.cuda" not in out
    assert "no 'free' figure" in r.stderr.decode()


def test_contradictory_figures_give_no_verdict_and_exit_2():
    # "1.\r\r\r00 TiB" (a figure broken by stray carriage returns, found by the oom_text
    # fuzzer) parses as a total of 0 bytes beside 1 TiB reserved. That used to be a confident
    # "shortage" (S > T) although U alone covered the request.
    r = run(DATA + "garbled_total.txt")
    assert r.returncode == 2
    out = r.stdout.decode()
    assert "figures contradict each other" in out
    assert "Stranded" not in out
    assert "shortage" not in out
    assert "its figures contradict each other" in r.stderr.decode()
    r = run(DATA + "garbled_total.txt", "--json")
    assert r.returncode == 2
    e = json.loads(r.stdout)["errors"][0]
    assert e["verdict"] == "undetermined"
    assert e["missing"] == ["figures that agree with each other"]
    assert e["stranded_bytes"] is None and e["shortfall_bytes"] is None
    assert e["figures"]["total_bytes"] == 0
    assert [x["id"] for x in e["remedies"]] == ["record_snapshot", "smaller_batch"]


def test_json_figures_and_remedies():
    doc = explain_json(DATA + "other_processes.txt")
    e = doc["errors"][0]
    assert e["gpu"] == 3
    assert e["wording"] == "capacity_of"
    assert e["figures"]["processes"] == [
        {"pid": 70021, "bytes": 9 * 1024 * MiB, "probably_self": False},
        {"pid": 70544, "bytes": int(6.5 * 1024 * MiB), "probably_self": False}]
    assert e["figures"]["other_processes_bytes"] == int(15.5 * 1024 * MiB)
    assert e["remedies"][0]["id"] == "free_other_processes"
    assert "70021" in e["remedies"][0]["action"]
    assert e["stranded_bytes"] == 512 * MiB


def test_shortage_names_the_missing_amount():
    doc = explain_json(DATA + "shortage.txt")
    e = doc["errors"][0]
    # 6.00 GiB - (2.31 GiB free + 330.00 MiB unallocated)
    missing = 6 * 1024 * MiB - round(2.31 * 1024 * MiB) - 330 * MiB
    assert e["summary"].startswith("shortage")
    assert e["remedies"][0]["id"] == "smaller_batch"
    assert e["shortfall_bytes"] == 6 * 1024 * MiB - round(2.31 * 1024 * MiB)
    assert any(r["id"] == "larger_gpu" for r in e["remedies"])
    assert round(missing / (1024 * MiB), 2) == 3.37
    assert e["summary"].endswith("the job needs 3.37 GiB more")


def test_multi_gpu_log_reports_each_error_with_rank():
    doc = explain_json(DATA + "multi_gpu.log")
    errors = doc["errors"]
    assert [(e["rank"], e["gpu"], e["verdict"]) for e in errors] == [
        (2, 2, "fragmentation"), (3, 3, "shortage")]
    assert errors[0]["repeats"] == 2
    assert errors[0]["repeat_lines"] == [16]
    r = run(DATA + "multi_gpu.log")
    assert "2 out-of-memory errors (GPU 2 rank 2 fragmentation; GPU 3 rank 3 shortage)" in \
        r.stdout.decode()


def test_reads_standard_input():
    with open(os.path.join(SOURCE_DIR, DATA, "capacity_of_22.txt"), "rb") as f:
        text = f.read()
    doc = explain_json(stdin=text)
    assert doc["input"] == "-"
    assert doc["errors"][0]["verdict"] == "fragmentation"
    doc = explain_json("-", stdin=text)
    assert doc["errors"][0]["figures"]["tried_bytes"] == 8 * 1024 * MiB


def test_garbage_exits_2_with_a_clear_message():
    r = run(DATA + "garbage.txt")
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "no out-of-memory message in 5 lines" in err
    assert r.stdout == b""


def test_truncated_message_names_missing_figures():
    r = run(DATA + "truncated.txt")
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "truncated.txt:1: found 'CUDA out of memory' but no 'free', 'allocated', " \
        "'reserved but unallocated' figures" in err
    assert "Verdict: the message has no" in r.stdout.decode()


def test_cuda_runtime_error_is_explained_as_such():
    r = run(DATA + "cuda_error.txt")
    assert r.returncode == 2
    assert "comes from the CUDA runtime" in r.stdout.decode()
    assert "cuda_error.txt:4: found 'CUDA out of memory' but no 'Tried to allocate'" in \
        r.stderr.decode()


def test_missing_file_and_bad_flags():
    r = run("tests/data/oom_text/nope.txt")
    assert r.returncode == 2
    assert "nope.txt: no such file" in r.stderr.decode()
    r = run(DATA + "shortage.txt", "--error", "3", "--trace", TRACE)
    assert r.returncode == 2
    assert "--error 3: the input has 1 out-of-memory message" in r.stderr.decode()
    r = run(DATA + "shortage.txt", "--trace", TRACE, "--snapshot", "x.pickle")
    assert r.returncode == 2
    r = run(DATA + "shortage.txt", "--alloc-conf", "bogus:1")
    assert r.returncode == 2
    assert "--alloc-conf" in r.stderr.decode()


def test_trace_verification_reranks_by_measured_result():
    doc = explain_json(MESSAGE, "--trace", TRACE)
    e = doc["errors"][0]
    assert e["verdict"] == "fragmentation"
    assert e["stranded_bytes"] == 60 * MiB
    v = doc["verification"]
    assert v["capacity_bytes"] == 160 * MiB
    assert v["used_by_others_bytes"] == 0  # 160 - 40 free - 120 reserved
    assert v["reproduced"] is True
    assert v["current"]["oom"] is True
    assert v["current"]["peak_reserved_bytes"] == 120 * MiB
    assert v["current"]["fragmentation_at_oom"] == pytest.approx(0.5)  # 60 of 120 MiB
    by_id = {r["id"]: r for r in e["remedies"]}
    assert by_id["expandable_segments"]["replay"]["oom"] is False
    assert by_id["expandable_segments"]["replay"]["peak_reserved_bytes"] == 140 * MiB
    # 80 MiB request: half is 40, down to a power of two: 32.
    assert by_id["max_split_size_mb"]["alloc_conf"] == "max_split_size_mb:32"
    assert by_id["max_split_size_mb"]["replay"]["oom"] is False
    assert by_id["max_split_size_mb"]["replay"]["peak_reserved_bytes"] == 160 * MiB
    assert by_id["garbage_collection_threshold"]["replay"]["oom"] is True
    assert by_id["fixed_shapes"]["replay"] is None
    # Fixes first (lowest peak first), then what a replay cannot test, then what failed.
    assert [r["id"] for r in e["remedies"]] == [
        "expandable_segments", "max_split_size_mb", "fixed_shapes", "smaller_batch",
        "garbage_collection_threshold"]


def test_trace_verification_text():
    r = run(MESSAGE, "--trace", TRACE)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "Remedies, ranked by the replay:" in out
    assert "replay: fits, peak reserved 140.0 MiB" in out
    assert "current settings (defaults): replay: still OOM at request event 14 (step 2), " \
        "50.0% of reserved unallocated there" in out


def test_trace_verification_on_a_device_where_it_fits():
    doc = explain_json(MESSAGE, "--trace", TRACE, "--capacity", "1GiB")
    v = doc["verification"]
    assert v["capacity_bytes"] == 1024 * MiB
    assert v["reproduced"] is False
    r = run(MESSAGE, "--trace", TRACE, "--capacity", "1GiB")
    assert "does not reproduce this error" in r.stdout.decode()


def test_current_settings_are_combined_with_remedies():
    doc = explain_json(MESSAGE, "--trace", TRACE, "--alloc-conf", "max_split_size_mb:32")
    v = doc["verification"]
    assert v["current_alloc_conf"] == "max_split_size_mb:32"
    assert v["current"]["oom"] is False  # the job's own setting already fits


def test_snapshot_replay_path():
    doc = explain_json(MESSAGE, "--snapshot", "tests/data/cli/snapshot_small.pickle",
                       "--capacity", "8GiB")
    v = doc["verification"]
    assert v["source"] == "tests/data/cli/snapshot_small.pickle"
    assert v["request_events"] > 0
    assert v["current"]["oom"] is False


def test_allocator_trace_is_refused_for_verification():
    r = run(MESSAGE, "--trace", "tests/data/cli/allocator_basic.jsonl")
    assert r.returncode == 2
    assert "allocator trace" in r.stderr.decode()


def test_help_teaches():
    r = subprocess.run([BIN, "explain", "--help"], capture_output=True, timeout=60)
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "Examples:" in out
    assert "--trace" in out and "--snapshot" in out


def test_snapshot_replays_under_its_recorded_settings():
    # g4_expandable.pickle recorded expandable_segments:True: that is the job's own setting
    # unless --alloc-conf says otherwise (as `replay` of the snapshot does).
    snapshot = "tests/data/snapshots/g4_expandable.pickle"
    doc = explain_json(MESSAGE, "--snapshot", snapshot, "--capacity", "8GiB")
    assert doc["verification"]["current_alloc_conf"] == "expandable_segments:True"
    doc = explain_json(MESSAGE, "--snapshot", snapshot, "--capacity", "8GiB", "--alloc-conf", "")
    assert doc["verification"]["current_alloc_conf"] == ""
    # A snapshot that records no settings: PyTorch's defaults, and a note says so.
    doc = explain_json(MESSAGE, "--snapshot", "tests/data/snapshots/g2_oom.pickle",
                       "--capacity", "8GiB")
    assert doc["verification"]["current_alloc_conf"] == ""
    notes = [n for e in doc["errors"] for n in e["notes"]]
    assert any("records no allocator settings" in n for n in notes), notes


def test_cached_wording_of_pytorch_1_0_to_1_3():
    # "... 402.00 MiB free; 5.10 GiB cached)": cached is reserved but unallocated, so
    # R = 4.20 + 5.10 GiB; a progress bar after the message on the same line is not part of it.
    e = explain_json(DATA + "classic_cached.txt")["errors"][0]
    assert e["wording"] == "classic"
    fig = e["figures"]
    assert fig["unallocated_bytes"] == round(5.10 * 1024 * MiB)
    assert fig["reserved_bytes"] == round(4.20 * 1024 * MiB) + round(5.10 * 1024 * MiB)
    assert e["stranded_bytes"] == round(5.10 * 1024 * MiB)
    assert any("1.0-1.3" in n for n in e["notes"])
    out = run(DATA + "classic_cached.txt").stdout.decode()
    assert "PyTorch 1.0-1.3" in out


def test_shortage_says_what_holds_memory_outside_the_cache():
    # S = 3 GiB > F + U = 1.10 + 0.40 GiB. The 4.60 GiB outside PyTorch's cache would cover the
    # rest, but whoever holds it (other processes, the CUDA context, NCCL, cuBLAS) the job
    # lacked memory: a shortage, with where to look, not "undetermined".
    e = explain_json(DATA + "classic_outside.txt")["errors"][0]
    assert e["verdict"] == "shortage"
    assert e["missing"] == []
    ids = [r["id"] for r in e["remedies"]]
    assert "see_outside_memory" in ids
    see = e["remedies"][ids.index("see_outside_memory")]["action"]
    for tool in ("nvidia-smi", "fragscope gpus", "torch.cuda.mem_get_info()"):
        assert tool in see
    text = " ".join(e["reasons"])
    for holder in ("other processes", "CUDA context", "NCCL", "cuBLAS"):
        assert holder in text
    assert e["figures"]["outside_bytes"] == (round(15.90 * 1024 * MiB) - round(1.10 * 1024 * MiB)
                                             - round(10.20 * 1024 * MiB))


def test_figures_beyond_the_card_are_sysmem_fallback_not_garbage():
    # 13.62 GiB reserved on an 8 GiB card with 0 bytes free: Windows' WDDM driver spilled to
    # shared system memory. The verdict is what the figures support (U = 0.52 GiB >= 256 MiB).
    r = run(DATA + "sysmem_fallback.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "Verdict: fragmentation" in out
    assert "sysmem fallback" in out.lower() and "slower" in out
    e = explain_json(DATA + "sysmem_fallback.txt")["errors"][0]
    assert e["figures"]["sysmem_fallback_bytes"] == (round(13.62 * 1024 * MiB)
                                                     - 8 * 1024 * MiB)
    assert "sysmem_fallback" in [x["id"] for x in e["remedies"]]
    e = explain_json(DATA + "sysmem_fallback_shortage.txt")["errors"][0]
    assert e["verdict"] == "shortage"
    assert e["figures"]["sysmem_fallback_bytes"] > 0
    # The garbled total (0 bytes) stays refused: a card of 0 bytes is no state at all.
    e = json.loads(run(DATA + "garbled_total.txt", "--json").stdout)["errors"][0]
    assert e["figures"]["sysmem_fallback_bytes"] is None


def test_garbled_figures_beyond_the_card_with_free_memory_are_refused():
    # Free memory beside more reserved than the card holds: the driver spills only once the
    # card is full, so this is no fallback state but a garbled message.
    text = (b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 6.00 GiB total "
            b"capacity; 9.00 GiB already allocated; 3.00 GiB free; 9.50 GiB reserved in total by "
            b"PyTorch)\n")
    r = run("-", stdin=text)
    assert r.returncode == 2
    assert "figures contradict each other" in r.stdout.decode()


@pytest.mark.parametrize("name,backend", [
    ("quoted.txt", "CUDA"), ("quoted_classic.txt", "CUDA"), ("quoted_hip.txt", "HIP")])
def test_message_quoted_without_its_first_sentence(name, backend):
    e = explain_json(DATA + name)["errors"][0]
    assert e["quoted"] is True
    assert e["backend"] == backend
    assert e["figures"]["tried_bytes"] is not None
    assert any("quoted" in n for n in e["notes"])


def test_quoted_phrase_inside_a_full_message_is_one_message():
    # "CUDA out of memory. Tried to allocate ..." on one line, and wrapped before "Tried": one
    # message each time, not a second quoted one; prose without a figure is no message.
    text = open(os.path.join(SOURCE_DIR, DATA, "capacity_of_22.txt"), "rb").read()
    doc = explain_json("-", stdin=text)
    assert len(doc["errors"]) == 1 and doc["errors"][0]["quoted"] is False
    wrapped = (b"RuntimeError: CUDA out of memory.\nTried to allocate 20.00 MiB (GPU 1; 3.95 GiB "
               b"total capacity; 3.02 GiB already allocated; 12.44 MiB free; 3.10 GiB reserved "
               b"in total by PyTorch)\n")
    doc = explain_json("-", stdin=wrapped)
    assert len(doc["errors"]) == 1 and doc["errors"][0]["quoted"] is False
    r = run("-", stdin=b"Tried to allocate memory for the buffer, failed\n")
    assert r.returncode == 2


def test_remedies_never_propose_a_setting_the_job_has():
    doc = explain_json(DATA + "capacity_of_22.txt", "--alloc-conf", "expandable_segments:True")
    e = doc["errors"][0]
    assert "expandable_segments" not in [r["id"] for r in e["remedies"]]
    assert any("already has it (--alloc-conf)" in n for n in e["notes"])
    # A different value of a setting is still a proposal.
    doc = explain_json(DATA + "capacity_of_22.txt", "--alloc-conf", "max_split_size_mb:128")
    ids = [r["id"] for r in doc["errors"][0]["remedies"]]
    assert "max_split_size_mb" in ids and "expandable_segments" in ids
    conf = [r["alloc_conf"] for r in doc["errors"][0]["remedies"] if r["id"] == "max_split_size_mb"]
    doc = explain_json(DATA + "capacity_of_22.txt", "--alloc-conf", conf[0])
    assert "max_split_size_mb" not in [r["id"] for r in doc["errors"][0]["remedies"]]


def test_remedies_skip_the_snapshots_recorded_settings():
    # g4_expandable.pickle recorded expandable_segments:True.
    doc = explain_json(MESSAGE, "--snapshot", "tests/data/snapshots/g4_expandable.pickle",
                       "--capacity", "8GiB")
    e = doc["errors"][0]
    assert "expandable_segments" not in [r["id"] for r in e["remedies"]]
    assert any("snapshot's recorded settings" in n for n in e["notes"])


def test_newer_documentation_link_ends_the_message():
    e = explain_json(DATA + "newer_link.txt")["errors"][0]
    assert e["last_line"] == 1
    assert e["truncated"] is False
    assert e["message"].endswith("#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    assert "see_outside_memory" in [r["id"] for r in e["remedies"]]

def test_larger_gpu_remedy_and_tune_minimum_agree_or_say_why(tmp_path):
    # g2_oom.pickle's OOM as PyTorch printed it: 180 MiB requested, 150 MiB free of 200 MiB,
    # 50 MiB allocated. "A GPU of at least X" is the failing request's arithmetic; the replay
    # of the whole job states tune's minimum beside it, so the two figures are not left to
    # contradict each other.
    message = tmp_path / "g2.txt"
    message.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 180.00 MiB. GPU 0 has a "
        "total capacity of 200.00 MiB of which 150.00 MiB is free. Of the allocated memory "
        "50.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.\n")
    doc = explain_json(str(message), "--snapshot", "tests/data/snapshots/g2_oom.pickle")
    e = doc["errors"][0]
    assert any(r["id"] == "larger_gpu" for r in e["remedies"]), e["remedies"]
    r = subprocess.run([BIN, "tune", "tests/data/snapshots/g2_oom.pickle", "--min-capacity",
                        "--json", "--setting", doc["verification"]["current_alloc_conf"]],
                       cwd=SOURCE_DIR, capture_output=True, timeout=300)
    minimum = json.loads(r.stdout)["ranked"][0]["min_capacity_bytes"]
    assert minimum == 230 * MiB
    notes = [n for n in e["notes"] if "the whole job fits on a GPU of" in n]
    assert notes and "230.0 MiB" in notes[0], e["notes"]


@pytest.mark.parametrize("name,module,free_enough", [
    ("cap_allowed.txt", "torch.cuda.", False),
    ("cap_allowed_hip.txt", "torch.cuda.", True),
    ("cap_allowed_xpu.txt", "torch.xpu.", True),
    ("limit_allowed.txt", "torch.cuda.", True),
])
def test_memory_fraction_cap_is_the_verdict_with_its_remedy_first(name, module, free_enough):
    e = explain_json(DATA + name)["errors"][0]
    assert e["verdict"] == "cap"
    f = e["figures"]
    assert f["reserved_bytes"] + f["tried_bytes"] > f["allowed_bytes"]
    first = e["remedies"][0]
    assert first["id"] == "raise_memory_fraction"
    assert module in first["action"]
    assert "the device had room" in first["why"] if free_enough else "room" not in first["why"]
    assert e["stranded_bytes"] == f["unallocated_bytes"]
    text = run(DATA + name).stdout.decode()
    assert "Verdict: cap: the process hit its allowed share" in text


def test_far_more_free_than_the_request_is_a_limit_never_undetermined():
    e = explain_json(DATA + "limit_unprinted.txt")["errors"][0]
    assert e["verdict"] == "cap"
    assert e["figures"]["allowed_bytes"] is None
    assert "memory fraction set in code" in e["summary"]
    assert e["remedies"][0]["id"] == "raise_memory_fraction"
    assert e["missing"] == []


def test_private_pools_never_turn_a_shortage_into_fragmentation():
    e = explain_json(DATA + "private_pools_shortage.txt")["errors"][0]
    f = e["figures"]
    assert f["private_pools_bytes"] > 4 * f["tried_bytes"]
    assert f["free_bytes"] + f["unallocated_bytes"] < f["tried_bytes"]
    assert e["verdict"] == "shortage"
    # Stranded is the message's own "reserved but unallocated" (2.63 GiB), not U + P.
    assert e["stranded_bytes"] == f["unallocated_bytes"]
    assert e["stranded_bytes"] == round(2.63 * (1 << 30))
    assert e["remedies"][0]["id"] == "private_pools"


def test_a_remedy_worse_than_todays_settings_is_marked_and_last(tmp_path):
    # 200 MiB device: 100 + 100 MiB fit exactly (99 MiB rounds up to 100 MiB), the 20 MiB after
    # them does not (event 2). The garbage-collection remedy's memory fraction 0.99 (198 MiB)
    # fails already at event 1: worse than today's settings.
    trace = tmp_path / "worse.jsonl"
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "request",
              "producer": "test_explain.py",
              "devices": [{"device": 0, "name": "virtual", "capacity_bytes": 200 * MiB}]}]
    for i, size in enumerate([100 * MiB, 99 * MiB, 20 * MiB]):
        lines.append({"action": "alloc", "addr": i + 1, "size": size})
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    doc = explain_json(MESSAGE, "--trace", str(trace), "--capacity", "200MiB",
                       "--used-by-others", "0")
    assert doc["verification"]["current"]["oom_event_index"] == 2
    remedies = doc["errors"][0]["remedies"]
    gc = [r for r in remedies if r["id"] == "garbage_collection_threshold"][0]
    assert gc["replay"]["oom_event_index"] == 1
    assert gc["replay"]["worse_than_current"] is True
    assert remedies[-1]["id"] == "garbage_collection_threshold"
    others = [r for r in remedies if r["replay"] and r is not gc]
    assert all(r["replay"]["worse_than_current"] is False for r in others)
    out = run(MESSAGE, "--trace", str(trace), "--capacity", "200MiB",
              "--used-by-others", "0").stdout.decode()
    assert "replay: worse than the current settings: OOM at request event 1, earlier than " \
        "their event 2" in out


def test_explain_trace_finds_what_tune_finds_on_the_sample(tmp_path):
    # The bundled sample on a GPU too small for it under the defaults: the OOM message its
    # replay prints, then explain --trace. Whatever tune ranks first must be offered, with the
    # same peak, unless a proposed setting fits as low.
    sample = "tests/data/sample/gpt_tiny_50steps.jsonl.gz"
    replay = subprocess.run([BIN, "replay", sample, "--capacity", "520MiB", "--json"],
                            cwd=SOURCE_DIR, capture_output=True, timeout=300)
    tuned = subprocess.run([BIN, "tune", sample, "--capacity", "520MiB", "--json"],
                           cwd=SOURCE_DIR, capture_output=True, timeout=600)
    best = json.loads(tuned.stdout)["ranked"][0]
    assert best["oom"] is False
    ooms = json.loads(replay.stdout)["ooms"]
    assert ooms and ooms[0]["message"]
    msg = tmp_path / "oom.txt"
    msg.write_text(ooms[0]["message"] + "\n")
    doc = explain_json(str(msg), "--trace", sample)
    fits = [r for r in doc["errors"][0]["remedies"] if r["replay"] and not r["replay"]["oom"]]
    assert fits, "explain --trace misses the setting tune finds to fit"
    assert min(r["replay"]["peak_reserved_bytes"] for r in fits) <= best["peak_reserved_bytes"]
    # Event counts carry thousands separators in the text.
    out = run(str(msg), "--trace", sample).stdout.decode()
    assert f"({doc['verification']['request_events']:,} request events)" in out
