"""What a new user meets first (issue 19, item 8): the top-level help, README's jq example on the
bundled sample, and no "(coming)" for commands that exist."""

import json
import os
import re
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
SAMPLE = "tests/data/sample/gpt_tiny_50steps.jsonl.gz"

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def test_top_level_help_names_snapshots_and_logs():
    r = subprocess.run([BIN, "--help"], capture_output=True, timeout=60)
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "snapshot" in out
    assert "_dump_snapshot" in out
    assert "explain" in out


def test_a_bare_fragscope_lists_the_commands():
    r = subprocess.run([BIN], capture_output=True, timeout=60)
    # A usage error like any other (exit 2, nothing on stdout), but one that teaches.
    assert r.returncode == 2 and r.stdout == b""
    out = r.stderr.decode()
    for command in ("analyze", "replay", "tune", "explain", "report", "check", "serve"):
        assert re.search(rf"^\s+{command}\b", out, re.M), out
    assert "--help" in out


def jq_path(doc, path):
    """Evaluates a jq path of keys and [N] indexes, as README's examples use."""
    for key, index in re.findall(r"\.(\w+)|\[(\d+)\]", path):
        doc = doc[key] if key else doc[int(index)]
    return doc


def test_readme_jq_examples_return_a_value_on_the_bundled_sample():
    readme = open(os.path.join(SOURCE_DIR, "README.md"), encoding="utf-8").read()
    paths = re.findall(r"analyze trace\.jsonl\.gz --json \| jq '([^']+)'", readme)
    assert paths, "README has no analyze | jq example"
    r = subprocess.run([BIN, "analyze", SAMPLE, "--json"], cwd=SOURCE_DIR, capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    for path in paths:
        value = jq_path(doc, path)
        assert value is not None and value != "", path
        assert isinstance(value, int) and value > 0, (path, value)


def test_no_coming_for_commands_that_exist():
    roots = ["README.md", "docs", "tests/cli/golden", "src", "apps"]
    r = subprocess.run([BIN, "analyze", SAMPLE], cwd=SOURCE_DIR, capture_output=True,
                       timeout=300)
    assert "(coming)" not in r.stdout.decode()
    for root in roots:
        base = os.path.join(SOURCE_DIR, root)
        files = [base] if os.path.isfile(base) else [
            os.path.join(d, f) for d, _, fs in os.walk(base) for f in fs]
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                assert "(coming)" not in f.read(), path
