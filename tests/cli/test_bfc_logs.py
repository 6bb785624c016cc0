"""`fragscope explain`, `analyze` and `report` on TensorFlow / JAX allocator logs (issue 32 items
1 and 2). The fixtures in tests/data/bfc_text are fragscope's own (make_fixtures.py writes them,
following the formats TensorFlow and XLA print); every expected figure is computed here from the
fixture's own chunk lines, not written down."""

import json
import os
import re
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
DATA = os.path.join(SOURCE_DIR, "tests/data/bfc_text")

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")

CHUNK = re.compile(r"(InUse|Free|Chunk) +at (?:0x)?([0-9a-fA-F]+) (?:next \d+ )?of size (\d+)")


def fixture(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


def chunks_of(text):
    """[(in_use, size)] of every chunk line of the text."""
    return [(m.group(1) != "Free", int(m.group(3))) for m in CHUNK.finditer(text)]


def rounded_request(text):
    m = re.search(r"\(rounded to (\d+)\)", text)
    if m:
        return int(m.group(1))
    m = re.search(r"trying to allocate ([\d.]+)MiB", text)
    return (int(float(m.group(1)) * (1 << 20)) + 255) // 256 * 256


def run(cmd, *args, stdin=None):
    return subprocess.run([BIN, cmd, *args], cwd=SOURCE_DIR, capture_output=True, timeout=300,
                          input=stdin)


def explain_json(*args, stdin=None):
    r = run("explain", *args, "--json", stdin=stdin)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["schema"] == "fragscope.explain"
    return doc


@pytest.mark.parametrize("name,verdict,framework", [
    ("tf1_fragmentation.log", "fragmentation", "tensorflow"),
    ("tf2_shortage.log", "shortage", "tensorflow"),
    ("xla_jax_fragmentation.log", "fragmentation", "jax"),
])
def test_bfc_dump_verdict_and_arithmetic_from_the_chunks(name, verdict, framework):
    text = fixture(name)
    chunks = chunks_of(text)
    in_use = sum(s for u, s in chunks if u)
    free = sum(s for u, s in chunks if not u)
    largest = max(s for u, s in chunks if not u)
    doc = explain_json(os.path.join(DATA, name))
    assert len(doc["errors"]) == 1
    e = doc["errors"][0]
    assert e["verdict"] == verdict
    assert e["framework"] == framework
    f = e["figures"]
    assert f["in_use_bytes"] == in_use
    assert f["pool_bytes"] == in_use + free
    assert f["free_in_pool_bytes"] == free
    assert f["largest_free_chunk_bytes"] == largest
    assert f["request_bytes"] == rounded_request(text)
    if verdict == "fragmentation":
        assert free >= f["request_bytes"] > largest
        assert e["stranded_bytes"] == free
    else:
        assert free < f["request_bytes"]
        assert e["shortfall_bytes"] == f["request_bytes"] - free - f["room_to_grow_bytes"]
    # Per-bin figures from the same chunks.
    for b in e["bins"]:
        lo = 256 << b["bin"]
        hi = lo * 2 if b["bin"] < 20 else 1 << 62
        inbin = [(u, s) for u, s in chunks if lo <= s < hi]
        assert b["chunks"] == len(inbin)
        assert b["free_bytes"] == sum(s for u, s in inbin if not u)


def test_remedies_are_in_the_framework_s_terms():
    tf = explain_json(os.path.join(DATA, "tf1_fragmentation.log"))["errors"][0]
    settings = [r["setting"] for r in tf["remedies"]]
    assert settings[0] == "TF_GPU_ALLOCATOR=cuda_malloc_async"
    assert not any((s or "").startswith("XLA_") for s in settings)
    jax = explain_json(os.path.join(DATA, "xla_jax_fragmentation.log"))["errors"][0]
    settings = [r["setting"] for r in jax["remedies"]]
    assert settings[0] == "XLA_PYTHON_CLIENT_ALLOCATOR=platform"
    # XLA's own error after the dump gives the exact request; it is the same failure.
    assert jax["figures"]["request_bytes"] == rounded_request(fixture("xla_jax_fragmentation.log"))
    text = run("explain", os.path.join(DATA, "tf2_shortage.log")).stdout.decode()
    assert "Verdict: shortage" in text and "mixed_float16" in text


def test_a_configured_fraction_is_a_cap_with_the_fraction_that_fits():
    text = ("tf_config: per_process_gpu_memory_fraction = 0.25\n"
            "totalMemory: 16.00GiB freeMemory: 15.50GiB\n" + fixture("tf2_shortage.log"))
    e = explain_json("-", stdin=text.encode())["errors"][0]
    assert e["verdict"] == "cap"
    f = e["figures"]
    need = f["in_use_bytes"] + f["request_bytes"]
    fraction = -(-need * 100 // (16 << 30)) / 100
    assert e["remedies"][0]["setting"] == f"per_process_gpu_memory_fraction={fraction:.2f}"


def test_cuda_malloc_async_uses_the_pool_attributes():
    text = fixture("cuda_malloc_async.log")
    request = int(re.search(r"failed to allocate (\d+) bytes", text).group(1))
    free = int(re.search(r"Free memory/Total memory: (\d+)/", text).group(1))
    reserved = int(re.search(r"RESERVED_MEM_CURRENT: (\d+)", text).group(1))
    used = int(re.search(r"USED_MEM_CURRENT: (\d+)", text).group(1))
    e = explain_json(os.path.join(DATA, "cuda_malloc_async.log"))["errors"][0]
    assert e["verdict"] == "shortage"
    assert e["figures"]["free_in_pool_bytes"] == reserved - used
    assert e["shortfall_bytes"] == request - free - (reserved - used)


def test_a_log_cut_in_the_chunk_map_says_what_is_missing():
    lines = fixture("tf2_shortage.log").splitlines()
    cut = next(i for i, l in enumerate(lines) if "InUse at" in l) + 2
    r = run("explain", "-", "--json", stdin=("\n".join(lines[:cut]) + "\n").encode())
    assert r.returncode == 2  # nothing could be explained: the stderr says which figures lack
    assert b"Sum Total of in-use chunks" in r.stderr
    e = json.loads(r.stdout)["errors"][0]
    assert e["verdict"] == "undetermined"
    assert any("Sum Total of in-use chunks" in m for m in e["missing"])
    assert any("incomplete" in n for n in e["notes"])


def test_several_dumps_are_all_explained_and_the_last_keeps_its_map():
    # (without the 1.x log's device size, which would make the first failure a cap)
    second = "".join(l for l in fixture("tf1_fragmentation.log").splitlines(True)
                     if "totalMemory" not in l)
    text = fixture("tf2_shortage.log") + "some other output\n" + second
    doc = explain_json("-", stdin=text.encode())
    assert [e["verdict"] for e in doc["errors"]] == ["shortage", "fragmentation"]
    assert doc["errors"][0]["bins"] is None and doc["errors"][1]["bins"] is not None
    first = len(fixture("tf2_shortage.log").splitlines())
    assert doc["errors"][1]["line"] > first


def test_jax_error_without_a_dump_names_what_is_missing():
    r = run("explain", "-", stdin=b"jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: "
                                  b"Out of memory while trying to allocate 7406166528 bytes.\n")
    assert r.returncode == 2
    assert b"dump" in r.stderr
    assert b"XLA_PYTHON_CLIENT_MEM_FRACTION" in r.stdout


def test_hostile_chunk_lines_are_skipped_with_their_line_numbers():
    text = fixture("tf2_shortage.log").replace(" of size 8388608 next", " of size 99999999999999999999 next")
    e = explain_json("-", stdin=text.encode())["errors"][0]
    assert any(re.match(r"line \d+: a chunk line without a readable", n) for n in e["notes"])


@pytest.mark.parametrize("name", ["tf1_fragmentation.log", "xla_jax_fragmentation.log"])
def test_analyze_rebuilds_the_map_from_the_dump(name):
    chunks = chunks_of(fixture(name))
    in_use = sum(s for u, s in chunks if u)
    free = [s for u, s in chunks if not u]
    r = run("analyze", os.path.join(DATA, name), "--json")
    assert r.returncode == 0, r.stderr.decode()
    d = json.loads(r.stdout)["devices"][0]
    final = d["final"]["all"]
    assert final["reserved_bytes"] == in_use + sum(free)
    assert final["allocated_bytes"] == in_use
    assert final["largest_free_block_bytes"] == max(free)
    request = rounded_request(fixture(name))
    assert final["stranded_bytes"] == sum(s for s in free if s < request)
    notes = json.loads(r.stdout)["notes"]
    assert any(n.startswith("bin ") for n in notes)


def test_report_writes_the_html_of_a_dump(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", os.path.join(DATA, "xla_jax_fragmentation.log"), "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    assert b"fragmentation" in r.stderr
    assert out.stat().st_size > 1000
