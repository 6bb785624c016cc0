#!/usr/bin/python3
"""Makes the pictures of docs/report.md's views (docs/img/report-*.png) in headless Chromium.

    /usr/bin/python3 tools/report_screenshots.py build/dev/apps/fragscope/fragscope

From the bundled snapshot fixture tests/data/snapshots/g5_three_devices_two_streams.pickle
only (ours to publish; never a file of /work/shared/snapshots): the timeline with its x axis
in seconds, the call-site timeline, a block's panel with its folded stack, and a search.
"""

import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
from cdp import Browser, find_chromium  # noqa: E402

FIXTURE = ROOT / "tests/data/snapshots/g5_three_devices_two_streams.pickle"
OUT = ROOT / "docs" / "img"


def box(b, *selectors, pad=2):
    """The page rectangle around the elements `selectors` (x, y, w, h)."""
    rects = [b.evaluate(f"(() => {{ const r = document.querySelector('{s}')"
                        ".getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })()")
             for s in selectors]
    x0 = min(r[0] for r in rects) - pad
    y0 = min(r[1] for r in rects) - pad
    x1 = max(r[2] for r in rects) + pad
    y1 = max(r[3] for r in rects) + pad
    return (max(0, x0), max(0, y0), x1 - max(0, x0), y1 - max(0, y0))


def main(binary):
    chromium = find_chromium()
    if not chromium:
        sys.exit("chromium is not installed")
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        html = pathlib.Path(tmp) / "report.html"
        subprocess.run([binary, "report", str(FIXTURE), "-o", str(html)], check=True)
        b = Browser(chromium, width=1100, height=2600)
        try:
            b.page("Page.navigate", {"url": html.as_uri()})
            assert b.wait_for("window.fragscopeReport && window.fragscopeReport.ready === true")
            b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            (OUT / "report-timeline.png").write_bytes(
                b.screenshot(box(b, "h2", "#chart-frag")))
            (OUT / "report-call-sites.png").write_bytes(
                b.screenshot(box(b, "#sites-legend", "#chart-sites")))
            b.evaluate("(() => { const s = document.getElementById('frame-slider');"
                       " return fragscopeReport.selectFrame(Number(s.max)); })()")
            # A block allocated inside the recorded history, with a stack.
            point = b.evaluate("fragscopeReport.blockPoint((blk) => blk[3] === 1 && blk[4] >= 0"
                               " && fragscopeReport.allocation(blk[4])[8] >= 0"
                               " && fragscopeReport.allocation(blk[4])[0] >= 0)")
            b.click(point["x"], point["y"])
            b.evaluate("document.querySelector('#block-panel details') &&"
                       " (document.querySelector('#block-panel details').open = true)")
            (OUT / "report-block.png").write_bytes(
                b.screenshot(box(b, "#map-title", "#block-panel")))
            b.evaluate("(() => { const s = document.getElementById('search'); s.value = '>=1MiB';"
                       " s.dispatchEvent(new Event('change')); })()")
            b.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
            (OUT / "report-search.png").write_bytes(
                b.screenshot(box(b, "#search", "#chart-search", "#map-title", "#map")))
        finally:
            b.close()
    for p in sorted(OUT.glob("report-*.png")):
        print(p.relative_to(ROOT), p.stat().st_size, "bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build/dev/apps/fragscope/fragscope"))
