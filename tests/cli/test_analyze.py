"""Golden and error tests of `fragscope analyze`, run against the built binary.

ctest runs this file with FRAGSCOPE_BIN (the binary) and FRAGSCOPE_SOURCE_DIR (the source
tree) set; see tests/cli/tests.cmake. By hand:

    FRAGSCOPE_BIN=build/dev/apps/fragscope/fragscope python3 -m pytest -q tests/cli

Goldens live in tests/cli/golden/. After an intended change of the output, rewrite them with
FRAGSCOPE_UPDATE_GOLDEN=1 and review the diff. The traces are in tests/data/cli/ (made by
tests/data/cli/make_fixtures.py). The binary runs from the source dir with relative paths, so
the goldens do not depend on where the tree is checked out.
"""

import difflib
import gzip
import json
import os
import pty
import re
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
GOLDEN_DIR = os.path.join(SOURCE_DIR, "tests", "cli", "golden")
DATA = "tests/data/cli"  # relative to SOURCE_DIR, as the binary sees it
SAMPLE = "tests/data/sample/gpt_tiny_3steps.jsonl.gz"
UPDATE = os.environ.get("FRAGSCOPE_UPDATE_GOLDEN") == "1"

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args, env=None, cwd=SOURCE_DIR):
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)
    full_env.update(env or {})
    return subprocess.run([BIN, *args], cwd=cwd, env=full_env, capture_output=True, timeout=120)


def check_golden(name, actual):
    path = os.path.join(GOLDEN_DIR, name)
    if UPDATE:
        os.makedirs(GOLDEN_DIR, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(actual)
        return
    assert os.path.exists(path), f"no golden {path}; run with FRAGSCOPE_UPDATE_GOLDEN=1"
    with open(path, encoding="utf-8") as f:
        expected = f.read()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{name}", "actual"))
        pytest.fail(f"output differs from golden/{name} "
                    f"(FRAGSCOPE_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


# ---------------------------------------------------------------------------------------------
# Goldens: text and JSON of the hand-made traces.
# ---------------------------------------------------------------------------------------------

GOLDEN_CASES = [
    # (golden file, arguments)
    ("allocator_basic.txt", [f"{DATA}/allocator_basic.jsonl"]),
    ("allocator_basic.json", [f"{DATA}/allocator_basic.jsonl", "--json"]),
    ("allocator_basic_every5_segment_scale.txt",
     [f"{DATA}/allocator_basic.jsonl", "--every", "5", "--map-scale", "segment"]),
    ("allocator_basic_fixed_threshold.txt",
     [f"{DATA}/allocator_basic.jsonl", "--stranded-threshold", "2MiB", "--no-map"]),
    ("allocator_no_steps_every4.txt", [f"{DATA}/allocator_no_steps.jsonl", "--every", "4"]),
    ("two_devices.txt", [f"{DATA}/two_devices.jsonl"]),
    ("two_devices_device1.json", [f"{DATA}/two_devices.jsonl", "--device", "1", "--json"]),
    ("request_basic.txt", [f"{DATA}/request_basic.jsonl"]),
    ("request_basic.json", [f"{DATA}/request_basic.jsonl", "--json"]),
]


@pytest.mark.parametrize("golden,args", GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_golden(golden, args):
    result = run("analyze", *args)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    check_golden(golden, result.stdout.decode("utf-8"))


def test_check_invariants_changes_nothing():
    plain = run("analyze", f"{DATA}/allocator_basic.jsonl")
    checked = run("analyze", f"{DATA}/allocator_basic.jsonl", "--check-invariants")
    assert checked.returncode == 0, checked.stderr.decode()
    assert checked.stdout == plain.stdout


def test_gzip_input_gives_the_same_report(tmp_path):
    with open(os.path.join(SOURCE_DIR, DATA, "allocator_basic.jsonl"), "rb") as f:
        raw = f.read()
    path = tmp_path / "allocator_basic.jsonl.gz"
    path.write_bytes(gzip.compress(raw))
    plain = run("analyze", f"{DATA}/allocator_basic.jsonl", "--json")
    zipped = run("analyze", str(path), "--json")
    assert zipped.returncode == 0, zipped.stderr.decode()
    a, b = json.loads(plain.stdout), json.loads(zipped.stdout)
    a.pop("source")
    b.pop("source")
    assert a == b


@pytest.mark.parametrize("trace", ["allocator_basic.jsonl", "allocator_no_steps.jsonl",
                                   "two_devices.jsonl", "request_basic.jsonl"])
def test_json_schema_basics(trace):
    result = run("analyze", f"{DATA}/{trace}", "--json")
    assert result.returncode == 0, result.stderr.decode()
    doc = json.loads(result.stdout)
    assert doc["schema"] == "fragscope.analyze"
    assert doc["schema_version"] == 1
    assert doc["trace_kind"] in ("allocator", "request")
    for device in doc["devices"]:
        for key in ("device", "peak_reserved", "peak_allocated", "worst_fragmentation",
                    "min_largest_free_block", "final", "requests", "timeline", "layout"):
            assert key in device, key
        allocator = doc["trace_kind"] == "allocator"
        assert (device["final"] is not None) == allocator
        assert (device["layout"] is not None) == allocator
        for sample in device["timeline"]:
            assert sample["end_event"] > sample["first_event"]
        if allocator:
            # The layout adds up: blocks tile each segment.
            for segment in device["layout"]:
                assert sum(b["size_bytes"] for b in segment["blocks"]) == segment["size_bytes"]
            final = device["final"]["all"]
            assert final["reserved_bytes"] == sum(s["size_bytes"] for s in device["layout"])


def test_no_map_leaves_out_the_layout():
    text = run("analyze", f"{DATA}/allocator_basic.jsonl", "--no-map")
    assert b"Memory map" not in text.stdout
    doc = json.loads(run("analyze", f"{DATA}/allocator_basic.jsonl", "--no-map", "--json").stdout)
    assert doc["devices"][0]["layout"] is None


def test_map_draws_the_stranded_gaps():
    out = run("analyze", f"{DATA}/allocator_basic.jsonl").stdout.decode()
    rows = [line for line in out.splitlines() if "0x7f0000000000" in line and "|" in line]
    assert len(rows) == 1
    bar = rows[0].split("|")[1]
    assert "!" in bar and "#" in bar


def test_color():
    plain = run("analyze", f"{DATA}/allocator_basic.jsonl")
    assert b"\x1b[" not in plain.stdout  # stdout is a pipe: auto means no color
    colored = run("analyze", f"{DATA}/allocator_basic.jsonl", "--color", "always")
    assert b"\x1b[" in colored.stdout
    never = run("analyze", f"{DATA}/allocator_basic.jsonl", "--color", "never")
    assert never.stdout == plain.stdout


def test_long_timeline_is_elided_in_text_but_complete_in_json(tmp_path):
    lines = [json.dumps({"format": "fragscope-trace", "version": 1, "kind": "request",
                         "devices": [{"device": 0, "name": "v"}]})]
    for step in range(200):
        lines.append(json.dumps({"action": "step", "step": step}))
        lines.append(json.dumps({"action": "alloc", "addr": step + 1, "size": 1024 * (step + 1)}))
        lines.append(json.dumps({"action": "free_requested", "addr": step + 1}))
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(lines) + "\n")
    text = run("analyze", str(path)).stdout.decode()
    assert re.search(r"showing \d+ of 200 rows", text)
    assert "--json has all of them" in text
    doc = json.loads(run("analyze", str(path), "--json").stdout)
    assert len(doc["devices"][0]["timeline"]) == 200


# ---------------------------------------------------------------------------------------------
# Bad input: exit status 2 and a message that names file:line.
# ---------------------------------------------------------------------------------------------

BAD_CASES = [
    # (trace, line the error is on, words the message must hold)
    ("bad_unknown_action.jsonl", 3, "allocate"),
    ("bad_free_unknown_address.jsonl", 4, "free_completed"),
    ("bad_overlapping_segments.jsonl", 3, "overlaps"),
    ("bad_negative_size.jsonl", 3, "size"),
    ("bad_absurd_size.jsonl", 3, "size"),
]


@pytest.mark.parametrize("trace,line,words", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input(trace, line, words):
    for extra in ([], ["--json"]):
        result = run("analyze", f"{DATA}/{trace}", *extra)
        assert result.returncode == 2
        assert result.stdout == b""
        err = result.stderr.decode()
        assert err.startswith("fragscope: "), err
        assert f"{DATA}/{trace}:{line}:" in err, err
        assert words in err, err


def test_empty_file():
    result = run("analyze", f"{DATA}/bad_empty.jsonl")
    assert result.returncode == 2
    err = result.stderr.decode()
    # The reader names the file (there is no line 1 to name).
    assert err.startswith(f"fragscope: {DATA}/bad_empty.jsonl"), err
    assert "empty" in err, err


def test_truncated_gzip(tmp_path):
    with open(os.path.join(SOURCE_DIR, DATA, "request_basic.jsonl"), "rb") as f:
        raw = f.read()
    whole = gzip.compress(raw * 20)
    path = tmp_path / "truncated.jsonl.gz"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    result = run("analyze", str(path))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert re.search(re.escape(str(path)) + r":\d+: ", err), err


def test_huge_line(tmp_path):
    path = tmp_path / "huge.jsonl"
    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "devices": [{"device": 0}]}
    with open(path, "w") as f:
        f.write(json.dumps(header) + "\n")
        f.write(json.dumps({"action": "alloc", "addr": 1, "size": 512}) + "\n")
        f.write('{"action":"alloc","addr":2,"size":512,"pad":"' + "x" * (20 << 20) + '"}\n')
    result = run("analyze", str(path))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert f"{path}:3:" in err, err[:500]
    assert len(err) < 2000  # the message does not echo the line


def test_device_without_events():
    result = run("analyze", f"{DATA}/two_devices.jsonl", "--device", "7")
    assert result.returncode == 2
    assert result.stdout == b""
    assert "device 7 has no events" in result.stderr.decode()


def test_missing_file():
    result = run("analyze", f"{DATA}/does_not_exist.jsonl")
    assert result.returncode == 2
    assert f"{DATA}/does_not_exist.jsonl" in result.stderr.decode()


# ---------------------------------------------------------------------------------------------
# Usage.
# ---------------------------------------------------------------------------------------------

def test_help_lists_commands():
    result = run("--help")
    assert result.returncode == 0
    out = result.stdout.decode()
    assert "analyze" in out
    assert "fragmentation" in out


def test_analyze_help_teaches():
    result = run("analyze", "--help")
    assert result.returncode == 0
    out = result.stdout.decode()
    for words in ("--json", "--every", "--stranded-threshold", "fragmentation ratio",
                  "stranded", "max allocatable", "Examples:",
                  "fragscope analyze trace.jsonl.gz --json | jq .devices[0].peak_reserved",
                  "docs/metrics.md", "fragscope replay"):
        assert words in out, words


def test_version():
    result = run("--version")
    assert result.returncode == 0
    assert re.match(r"fragscope \d+\.\d+\.\d+", result.stdout.decode())


@pytest.mark.parametrize("args", [
    [],
    ["analyze"],
    ["frobnicate"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--bogus"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--every", "0"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--device", "-1"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--stranded-threshold", "lots"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--stranded-quantile", "1.5"],
    ["analyze", f"{DATA}/allocator_basic.jsonl", "--color", "sometimes"],
])
def test_usage_errors_exit_2(args):
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == b""
    assert result.stderr != b""


# ---------------------------------------------------------------------------------------------
# Progress on a terminal.
# ---------------------------------------------------------------------------------------------

def test_progress_on_a_terminal(tmp_path):
    path = tmp_path / "many.jsonl"
    lines = [json.dumps({"format": "fragscope-trace", "version": 1, "kind": "request",
                         "devices": [{"device": 0}]})]
    for i in range(1, 10001):
        lines.append(f'{{"action":"alloc","addr":{i},"size":4096}}')
        lines.append(f'{{"action":"free_requested","addr":{i}}}')
    path.write_text("\n".join(lines) + "\n")
    master, slave = pty.openpty()
    env = dict(os.environ, FRAGSCOPE_PROGRESS_DELAY_MS="0")
    proc = subprocess.Popen([BIN, "analyze", str(path)], cwd=SOURCE_DIR, env=env,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read()
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0
    assert b"M events" in err and b"%" in err, err
    assert err.endswith(b"\r\x1b[K"), err  # the line is erased at the end
    assert b"fragscope analyze:" in out and b"\r" not in out


def test_no_progress_when_stderr_is_not_a_terminal():
    result = run("analyze", f"{DATA}/allocator_basic.jsonl",
                 env={"FRAGSCOPE_PROGRESS_DELAY_MS": "0"})
    assert result.stderr == b""


# ---------------------------------------------------------------------------------------------
# The bundled sample (a request trace from a real PyTorch run), if present.
# ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists(os.path.join(SOURCE_DIR, SAMPLE)),
                    reason=f"{SAMPLE} is not there")
def test_bundled_sample():
    text = run("analyze", SAMPLE)
    assert text.returncode == 0, text.stderr.decode()
    out = text.stdout.decode()
    assert "request trace" in out
    assert "fragscope replay" in out
    assert "Timeline (one row per step)" in out
    doc = json.loads(run("analyze", SAMPLE, "--json").stdout)
    assert doc["trace_kind"] == "request"
    device = doc["devices"][0]
    assert device["requests"]["count"] > 0
    assert device["peak_live_requested"]["bytes"] > 0
    assert len(device["timeline"]) >= 3


@pytest.mark.parametrize("threads", ["1", "2"])
def test_first_error_in_file_order_whichever_thread_finds_it(tmp_path, threads):
    # With two threads the parser runs ahead of the analysis; the error reported is still the
    # one on the earlier line, whether the analysis or the parser meets it.
    head = '{"format":"fragscope-trace","version":1,"kind":"request"}'
    # Fewer events than the two threads hold in flight: the parser meets its error first.
    allocs = [f'{{"action":"alloc","addr":{i},"size":100}}' for i in range(1, 3000)]
    analysis_first = tmp_path / "analysis_first.jsonl"
    analysis_first.write_text("\n".join(
        [head, '{"action":"free_requested","addr":999999}'] + allocs + ["{not json"]) + "\n")
    r = run("analyze", str(analysis_first), "--threads", threads)
    assert r.returncode == 2
    assert f"{analysis_first}:2: free_requested of id 999999" in r.stderr.decode(), r.stderr
    parser_first = tmp_path / "parser_first.jsonl"
    parser_first.write_text("\n".join(
        [head, allocs[0], "{not json"] + allocs[1:] + ['{"action":"free_requested","addr":7}'])
        + "\n")
    r = run("analyze", str(parser_first), "--threads", threads)
    assert r.returncode == 2
    assert f"{parser_first}:3:" in r.stderr.decode(), r.stderr


@pytest.mark.parametrize("args", [
    ["tests/data/sample/gpt_tiny_50steps.jsonl.gz"],
    ["tests/data/cli/two_devices.jsonl"],
    ["tests/data/cli/allocator_no_steps.jsonl", "--every", "3"],
    ["tests/data/cli/request_basic.jsonl", "--forecast"],
])
def test_two_threads_report_exactly_what_one_does(args):
    outs = [run("analyze", *args, "--threads", t, "--json") for t in ("1", "2")]
    assert outs[0].returncode == outs[1].returncode == 0, outs[0].stderr.decode()
    assert outs[0].stdout == outs[1].stdout
