"""`fragscope report A --compare B` in a real headless Chromium (issue 33 item 2; docs/report.md).

For two real snapshots (skipped without /work/shared), two of the hand-made allocator traces,
and the bundled runs of 3 and 50 steps replayed on 520 MiB (only the longer one runs out of
memory): the page loads with no console error and no exception; its compare section shows A
and B's figures as `fragscope diff A B --format json` gives them (the same values, formatted),
the first OOMs and the call sites whose memory changed most. A screenshot of the section goes
to FRAGSCOPE_SCREENSHOT_DIR. Skipped, not failed, when no Chromium is installed.
"""

import json
import os
import pathlib
import subprocess

import pytest

from cdp import Browser, find_chromium

BIN = os.environ.get("FRAGSCOPE_BIN", "fragscope")
SRC = pathlib.Path(os.environ.get("FRAGSCOPE_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
SHARED = pathlib.Path("/work/shared/snapshots/real")
SHOTS = pathlib.Path(os.environ.get("FRAGSCOPE_SCREENSHOT_DIR",
                                    pathlib.Path(BIN).resolve().parents[2] / "browser-screenshots"
                                    if os.sep in BIN else "browser-screenshots"))

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                "(tools/install-deps.sh installs Debian's chromium)")

CASES = {
    # name: (A, B, extra arguments, needs /work/shared)
    "real_snapshots": (SHARED / "silmont_memory_forward_bf16_128.pickle",
                       SHARED / "silmont_memory_forward_fp32_128.pickle", [], True),
    "allocator_traces": (pathlib.Path("tests/data/cli/allocator_basic.jsonl"),
                         pathlib.Path("tests/data/cli/allocator_no_steps.jsonl"), [], False),
    # The bundled runs of 3 and 50 steps replayed on 520 MiB: only the longer one runs out of
    # memory (docs/report.md's picture).
    "sample_runs": (pathlib.Path("tests/data/sample/gpt_tiny_3steps.jsonl.gz"),
                    pathlib.Path("tests/data/sample/gpt_tiny_50steps.jsonl.gz"),
                    ["--capacity", "520MiB"], False),
}


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], cwd=SRC, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM)
    yield b
    b.close()


def cells(b, selector):
    return json.loads(b.evaluate(
        f"JSON.stringify([...document.querySelectorAll('{selector} tr')].slice(1)"
        ".map(r => [...r.children].map(c => c.textContent)))"))


@pytest.mark.parametrize("name", list(CASES))
def test_compare_section(name, browser, tmp_path):
    a, b_path, extra, shared = CASES[name]
    if shared and not (a.exists() and b_path.exists()):
        pytest.skip(f"{a} or {b_path} is absent")
    html = tmp_path / f"{name}.html"
    run("report", a, *extra, "--compare", b_path, "-o", html)
    diff = json.loads(run("diff", a, b_path, *extra, "--format", "json").stdout)

    b = browser
    b.events.clear()
    b.page("Page.navigate", {"url": html.as_uri()})
    assert b.wait_for("window.fragscopeReport && window.fragscopeReport.ready === true"), \
        b.evaluate("JSON.stringify(window.fragscopeReport)")
    errors = [e for e in b.events if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")]
    assert not errors, errors
    assert b.evaluate("window.fragscopeReport.errors.length") == 0

    # The section of the device shown: its title names B, its table A's and B's figures.
    heading = b.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)"
                         ".find(t => t.startsWith('Compared with')) || ''")
    assert heading == f"Compared with {b_path}", heading
    shown = b.evaluate("window.fragscopeReport.device")
    pair = next((p for p in diff["devices"] if p["a"] and p["a"]["device"] == shown),
                diff["devices"][0])
    rows = cells(b, "table.compare")
    assert [r[0] for r in rows] == ["peak reserved", "peak allocated", "peak requested",
                                    "worst fragmentation ratio", "stranded at the end", "OOMs"]
    ooms = pair["changes"]["ooms"]
    assert rows[5][1] == f"{ooms['a']:,}" and rows[5][2] == f"{ooms['b']:,}", rows[5]
    ratio = pair["changes"]["worst_fragmentation_ratio"]
    if ratio["a"] is not None:
        assert rows[3][1] == f"{100 * ratio['a']:.1f}%", rows[3]
    # Bytes as the page formats them: the same order of values as the JSON's.
    for row, key in zip(rows[:3], ["peak_reserved_bytes", "peak_allocated_bytes",
                                   "peak_requested_bytes"]):
        c = pair["changes"][key]
        assert (row[3] == "same") == (c["change"] == 0), (row, c)
        if c["change"]:
            assert row[3].startswith("+" if c["change"] > 0 else "-"), (row, c)

    # First OOMs and call sites, as diff lists them.
    text = b.evaluate("document.getElementById('app').textContent")
    for side in ("A", "B"):
        assert f"First OOM of {side}: " in text
    sites = cells(b, "table.compare-sites")
    assert [r[3].split(" (only in")[0] for r in sites] == [s["site"] for s in pair["site_changes"]]

    # A picture of the section, for a person (docs/report.md).
    SHOTS.mkdir(parents=True, exist_ok=True)
    top = b.evaluate("(() => { const h = [...document.querySelectorAll('h2')]"
                     ".find(e => e.textContent.startsWith('Compared with'));"
                     " window.scrollTo(0, 0); return h.getBoundingClientRect().y; })()")
    (SHOTS / f"compare_{name}.png").write_bytes(b.screenshot((0, max(0, top - 10), 1300, 700)))
