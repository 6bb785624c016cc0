"""Every allocation in the report page (issue 33 items 1 and 4), in headless Chromium.

* A click on a block of the memory map opens the block panel: its size and requested size as
  the snapshot records them, when it was allocated and freed, its stream, and its whole stack,
  every frame of the snapshot's stack in order (runs of allocator / dispatcher frames folded
  into a closed <details> that opens).
* The search box: by function or file and by size, the number of matching blocks in the map
  is the number of live blocks of the snapshot that match (counted here from the pickle), they
  are drawn in the highlight colour, and their total over the kept moments is charted.
* "Active memory by call site": the stacked layers add up to the allocated bytes of every
  sample (the analyzer's own figure), and the top site of a snapshot made here is the one that
  held the most.
* Every chart's x axis is titled: seconds for a snapshot with times, steps when it has step
  markers, the event index for a trace with neither.

On the bundled snapshot fixtures, and on real snapshots from /work/shared (skipped when absent).
Skipped, not failed, when no Chromium is installed.
"""

import json
import os
import pathlib
import pickle
import re
import subprocess

import pytest

from cdp import Browser, count_near, find_chromium

BIN = os.environ.get("FRAGSCOPE_BIN", "fragscope")
SRC = pathlib.Path(os.environ.get("FRAGSCOPE_SOURCE_DIR", pathlib.Path(__file__).parents[2]))
SHARED = pathlib.Path("/work/shared/snapshots/real")
FIXTURES = SRC / "tests/data/snapshots"

HIGHLIGHT = (241, 196, 15)     # report.js HIGHLIGHT: blocks that match the search
SEARCH_LINE = (183, 149, 11)   # the search total's line
AXIS_TITLE = (29, 35, 48)      # the axis title's text colour
MIB = 1 << 20

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                "(tools/install-deps.sh installs Debian's chromium)")

# Snapshots with recorded stacks and history: ours, and real ones when present.
SNAPSHOTS = {
    "fixture_g2_time_us": (FIXTURES / "g2_time_us.pickle", False),
    "fixture_g5_three_devices": (FIXTURES / "g5_three_devices_two_streams.pickle", False),
    "real_bcrafton": (SHARED / "bcrafton_memory_snapshot.pickle", True),
    "real_constructorsun": (SHARED / "constructorsun_memory_snapshot.pickle", True),
    "real_magma27": (SHARED / "magma27_memory_snapshot.pickle", True),
}


class DataOnly(pickle.Unpickler):
    """Reads plain data only: a snapshot needs no class, so none is ever loaded."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def load_snapshot(path):
    with open(path, "rb") as f:
        return DataOnly(f).load()


def live_blocks(snap, device):
    """{address: block} of the blocks holding an allocation in the dumped segments of `device`."""
    out = {}
    for seg in snap["segments"]:
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            addr = b.get("address", addr)
            if b["state"] in ("active_allocated", "active_pending_free"):
                out[addr] = b
            addr += b["size"]
    return out


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], cwd=SRC, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def browser():
    b = Browser(CHROMIUM, height=3600)  # the whole page in the viewport: clicks and pixels
    yield b
    b.close()


def load(b, html):
    b.events.clear()
    b.page("Page.navigate", {"url": html.as_uri()})
    assert b.wait_for("window.fragscopeReport && window.fragscopeReport.ready === true"), \
        b.evaluate("JSON.stringify(window.fragscopeReport)")
    b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    assert b.evaluate("window.fragscopeReport.errors.length") == 0
    errors = [e for e in b.events if e["method"] == "Runtime.exceptionThrown"]
    assert not errors, errors


def rect(b, selector):
    r = b.evaluate(f"(() => {{ const r = document.querySelector('{selector}')"
                   ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()")
    assert r and r[2] > 10 and r[3] > 10, f"{selector} is not laid out: {r}"
    return r


def report_at_end(b, path, tmp_path, name):
    """The report of `path`, loaded, its map at the end of the run (the dumped segments)."""
    html = tmp_path / f"{name}.html"
    run("report", path, "-o", html)
    load(b, html)
    b.evaluate("(() => { const s = document.getElementById('frame-slider');"
               " return fragscopeReport.selectFrame(Number(s.max)); })()")
    assert b.evaluate("(() => { const d = JSON.parse(document.getElementById('fragscope-data')"
                      ".textContent).devices.find(x => x.device === fragscopeReport.device);"
                      " return d.frames[d.frames.length - 1].why; })()") == "end"
    return b.evaluate("fragscopeReport.device")


def case(name):
    path, shared = SNAPSHOTS[name]
    if shared and not path.exists():
        pytest.skip(f"{path} is absent")
    return path


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_click_a_block_shows_its_stack(name, browser, tmp_path):
    path = case(name)
    b = browser
    device = report_at_end(b, path, tmp_path, name)
    point = b.evaluate("JSON.stringify(fragscopeReport.blockPoint((blk) => blk[3] === 1 &&"
                       " blk[4] >= 0 && fragscopeReport.allocation(blk[4])[8] >= 0))")
    point = json.loads(point)
    assert point, "no allocated block with a stack is drawn in the map"
    b.click(point["x"], point["y"])
    text = b.evaluate("document.getElementById('block-panel').textContent")

    snap = load_snapshot(path)
    block = live_blocks(snap, device)[point["addr"]]
    assert f"{point['addr']:#x}" in text, text
    assert f"({block['size']:,} B)" in text, text
    requested = block.get("requested_size", block["size"])
    assert f"requested size" in text and f"({requested:,} B)" in text, text
    assert "allocated" in text and "not freed by the end of the input" in text, text
    assert "stream" in text
    # Its alloc's time, when the history recorded the alloc with one: seconds after the input's
    # first timed event.
    traces = snap.get("device_traces", [])
    allocs = [e for e in (traces[device] if device < len(traces) else [])
              if e["action"] == "alloc" and e["addr"] == point["addr"]]
    if allocs and allocs[-1].get("time_us", -1) >= 0:
        first = b.evaluate("JSON.parse(document.getElementById('fragscope-data').textContent)"
                           ".first_time_us")
        assert f"{(allocs[-1]['time_us'] - first) / 1e6:.3f} s" in text, text
    # Every frame of the recorded stack, in order (folded ones are inside the page too).
    at = text.index("Stack (innermost first")
    for frame in block["frames"]:
        found = text.find(frame["name"], at)
        assert found >= 0, (frame, text[at:])
        at = found + len(frame["name"])
    folded = b.evaluate("document.querySelectorAll('#block-panel details').length")
    if folded:
        assert b.evaluate("document.querySelector('#block-panel details').open") is False
        x, y, w, h = rect(b, "#block-panel details summary")
        b.click(x + 20, y + h / 2)
        assert b.evaluate("document.querySelector('#block-panel details').open") is True


def matching(blocks, needle=None, at_least=None):
    out = []
    for b in blocks.values():
        if at_least is not None:
            if b["size"] >= at_least:
                out.append(b)
        elif any(needle.lower() in (f["name"] + "\0" + f["filename"]).lower()
                 for f in b.get("frames", [])):
            out.append(b)
    return out


@pytest.mark.parametrize("name", list(SNAPSHOTS))
def test_search_highlights_blocks_and_charts_their_total(name, browser, tmp_path):
    path = case(name)
    b = browser
    device = report_at_end(b, path, tmp_path, name)
    blocks = live_blocks(load_snapshot(path), device)
    # A file name of the stack of one of the live blocks, and a size half-way up their sizes.
    files = sorted({f["filename"] for blk in blocks.values() for f in blk.get("frames", [])
                    if f["filename"].endswith(".py")})
    assert files, "no Python file in the live blocks' stacks"
    needle = re.split(r"[\\/]", files[len(files) // 2])[-1]  # Windows paths too
    sizes = sorted(blk["size"] for blk in blocks.values())
    at_least = sizes[len(sizes) // 2]
    for query, want in ((needle, matching(blocks, needle=needle)),
                        (f">={at_least}B", matching(blocks, at_least=at_least))):
        b.evaluate("(() => { const s = document.getElementById('search');"
                   f" s.value = {json.dumps(query)}; s.dispatchEvent(new Event('change')); }})()")
        got = json.loads(b.evaluate("JSON.stringify(fragscopeReport.search("
                                    "document.getElementById('search').value))"))
        assert got["blocks"] == len(want), (query, got["blocks"], len(want))
        assert got["bytes"] == sum(blk["size"] for blk in want), query
        assert got["totals"][-1]["bytes"] == got["bytes"]
        text = b.evaluate("document.getElementById('search-result').textContent")
        assert text.startswith(f"{len(want):,} block"), text
        if want:
            assert count_near(b.pixels(rect(b, "#map")), HIGHLIGHT, 12) > 0, query
            assert count_near(b.pixels(rect(b, "#chart-search")), SEARCH_LINE, 40) > 10, query


def site_snapshot(path):
    """A one-device snapshot whose history holds three call sites: attention (two 8 MiB blocks,
    freed), mlp (one 40 MiB block, held) and loss (2 MiB, held); times 10 us apart."""
    seg, t = 0x7F0000000000, 1_708_187_029_490_966

    def stack(name, file, line):
        return [{"name": "torch::unwind::unwind()", "filename": "", "line": 0},
                {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
                 "(signed char, unsigned long, CUstream_st*)", "filename": "", "line": 0},
                {"name": name, "filename": file, "line": line},
                {"name": "main", "filename": "train.py", "line": 3}]

    sites = {"attention": stack("attention", "model.py", 20), "mlp": stack("mlp", "model.py", 40),
             "loss": stack("loss", "train.py", 9)}
    plan = [("alloc", seg, 8 * MIB, "attention"), ("alloc", seg + 8 * MIB, 8 * MIB, "attention"),
            ("alloc", seg + 16 * MIB, 40 * MIB, "mlp"), ("alloc", seg + 56 * MIB, 2 * MIB, "loss"),
            ("free_requested", seg, 8 * MIB, "attention"), ("free_completed", seg, 8 * MIB, "attention"),
            ("free_requested", seg + 8 * MIB, 8 * MIB, "attention"),
            ("free_completed", seg + 8 * MIB, 8 * MIB, "attention")]
    entries = [{"action": "segment_alloc", "addr": seg, "size": 128 * MIB, "stream": 0,
                "frames": [], "time_us": t}]
    for action, addr, size, site in plan:
        t += 10
        entries.append({"action": action, "addr": addr, "size": size, "stream": 0,
                        "frames": sites[site], "time_us": t})
    blocks = [{"address": seg, "size": 16 * MIB, "requested_size": 0, "state": "inactive",
               "frames": []},
              {"address": seg + 16 * MIB, "size": 40 * MIB, "requested_size": 40 * MIB,
               "state": "active_allocated", "frames": sites["mlp"]},
              {"address": seg + 56 * MIB, "size": 2 * MIB, "requested_size": 2 * MIB,
               "state": "active_allocated", "frames": sites["loss"]},
              {"address": seg + 58 * MIB, "size": 70 * MIB, "requested_size": 0,
               "state": "inactive", "frames": []}]
    snap = {"segments": [{"device": 0, "address": seg, "total_size": 128 * MIB, "stream": 0,
                          "segment_type": "large", "blocks": blocks}],
            "device_traces": [entries]}
    path.write_bytes(pickle.dumps(snap, protocol=4))


def check_layers_add_up(b):
    t = json.loads(b.evaluate("JSON.stringify(fragscopeReport.siteTimeline())"))
    assert t["layers"], t
    for i, allocated in enumerate(t["allocated"]):
        assert sum(layer[i] for layer in t["layers"]) == allocated, (i, t)
    return t


def test_call_site_timeline_top_site(browser, tmp_path):
    site_snapshot(tmp_path / "sites.pickle")
    html = tmp_path / "sites.html"
    run("report", tmp_path / "sites.pickle", "-o", html)
    b = browser
    load(b, html)
    t = check_layers_add_up(b)
    names = t["names"]
    assert names[0].endswith(" in mlp") and names[1].endswith(" in attention"), names
    assert names[2].endswith(" in loss") and names[-1].startswith("other"), names
    # attention's layer rises to 16 MiB and falls back to nothing; mlp's ends at 40 MiB.
    assert max(t["layers"][1]) == 16 * MIB and t["layers"][1][-1] == 0, t["layers"][1]
    assert t["layers"][0][-1] == 40 * MIB
    legend = b.evaluate("document.getElementById('sites-legend').textContent")
    assert "mlp" in legend and "attention" in legend
    pixels = b.pixels(rect(b, "#chart-sites"))
    assert count_near(pixels, (78, 121, 167), 12) > 100, "mlp's layer is not drawn"
    # The mlp block's panel: its stack with the allocator's frame folded, closed until opened.
    b.evaluate("(() => { const s = document.getElementById('frame-slider');"
               " return fragscopeReport.selectFrame(Number(s.max)); })()")
    point = json.loads(b.evaluate("JSON.stringify(fragscopeReport.blockPoint((blk) =>"
                                  " blk[4] >= 0 && blk[1] === 40 * 1048576))"))
    b.click(point["x"], point["y"])
    panel = b.evaluate("document.getElementById('block-panel').textContent")
    assert "2 frames of the unwinder, allocator, dispatcher or interpreter (folded)" in panel, panel
    stack = panel[panel.index("Stack (innermost first"):]
    assert stack.index("unwind") < stack.index("malloc") < stack.index("mlp") < \
        stack.index("main"), stack
    assert b.evaluate("document.querySelectorAll('#block-panel details').length") == 1
    assert b.evaluate("document.querySelector('#block-panel details').open") is False
    assert "event 3" in panel and "not freed by the end of the input" in panel, panel
    # A click on a point of the chart, near its end: each site's bytes there.
    x, y, w, h = rect(b, "#chart-sites")
    b.click(x + w - 20, y + h / 3)
    at = b.evaluate("document.getElementById('sites-at').textContent")
    assert " in mlp 40.0 MiB" in at and " in loss 2.0 MiB" in at and "attention" not in at, at


@pytest.mark.parametrize("name", [n for n in SNAPSHOTS if n.startswith("real")])
def test_call_site_timeline_of_a_real_snapshot(name, browser, tmp_path):
    path = case(name)
    html = tmp_path / f"{name}.html"
    run("report", path, "-o", html)
    b = browser
    load(b, html)
    t = check_layers_add_up(b)
    peaks = [max(layer) for layer in t["layers"][:-1]]
    assert peaks == sorted(peaks, reverse=True), peaks


def plain_trace(path):
    """An allocator trace with neither times nor step markers."""
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "allocator",
              "devices": [{"device": 0, "capacity_bytes": 1 << 30}]},
             {"action": "segment_alloc", "addr": 1 << 30, "size": 20 * MIB, "pool": "large"}]
    for k in range(40):
        addr = 1 << 30
        lines.append({"action": "alloc", "addr": addr, "size": 4 * MIB})
        lines.append({"action": "free_requested", "addr": addr, "size": 4 * MIB})
        lines.append({"action": "free_completed", "addr": addr, "size": 4 * MIB})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def axis_titles_drawn(b):
    """Each chart's bottom strip (its axis title) holds dark text."""
    for chart in ("#chart-bytes", "#chart-frag", "#chart-sites"):
        if not b.evaluate(f"!!document.querySelector('{chart}')"):
            continue
        x, y, w, h = rect(b, chart)
        assert count_near(b.pixels((x, y + h - 14, w, 14)), AXIS_TITLE, 30) > 30, chart


def test_axis_says_what_it_counts(browser, tmp_path):
    b = browser
    # Times, no steps: wall-clock seconds.
    html = tmp_path / "times.html"
    run("report", FIXTURES / "g2_time_us.pickle", "-o", html)
    load(b, html)
    axis = json.loads(b.evaluate("JSON.stringify(fragscopeReport.xAxis())"))
    assert axis["axis"] == "seconds" and "seconds" in axis["title"], axis
    assert all(t["label"].endswith(" s") for t in axis["ticks"]), axis
    axis_titles_drawn(b)
    # The search total follows the same axis.
    b.evaluate("(() => { const s = document.getElementById('search'); s.value = '>=1B';"
               " s.dispatchEvent(new Event('change')); })()")
    x, y, w, h = rect(b, "#chart-search")
    assert count_near(b.pixels((x, y + h - 14, w, 14)), AXIS_TITLE, 30) > 30

    # Neither times nor steps: the event index.
    plain_trace(tmp_path / "plain.jsonl")
    html = tmp_path / "plain.html"
    run("report", tmp_path / "plain.jsonl", "-o", html)
    load(b, html)
    axis = json.loads(b.evaluate("JSON.stringify(fragscopeReport.xAxis())"))
    assert axis["axis"] == "events" and axis["choices"] == ["events"], axis
    assert "event index" in axis["title"], axis
    axis_titles_drawn(b)

    # Step markers: steps, and the title changes with the choice.
    html = tmp_path / "steps.html"
    run("report", SRC / "tests/data/cli/two_devices.jsonl", "-o", html)
    load(b, html)
    axis = json.loads(b.evaluate("JSON.stringify(fragscopeReport.xAxis())"))
    assert axis["axis"] == "steps" and "step" in axis["title"], axis
    b.evaluate("(() => { const s = document.getElementById('x-axis'); s.value = 'events';"
               " s.dispatchEvent(new Event('change')); })()")
    assert "event index" in json.loads(
        b.evaluate("JSON.stringify(fragscopeReport.xAxis())"))["title"]
    axis_titles_drawn(b)
