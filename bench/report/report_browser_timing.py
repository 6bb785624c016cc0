"""Times a `fragscope report` page in headless Chromium (docs/benchmarks.md, "HTML report").

Loads the page from disk, then prints: when the first chart was drawn (performance.now() at
that point: milliseconds since navigation start, parsing of the embedded data included), the
wall time until the page said it was ready, and the time to draw the memory map of every kept
moment (each one chosen in turn, as a click on the timeline does): median and worst.

Usage: /usr/bin/python3 bench/report/report_browser_timing.py REPORT.html [--device N]
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "browser"))
from cdp import Browser, find_chromium  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    args = ap.parse_args()
    chromium = find_chromium()
    if not chromium:
        sys.exit("chromium is not installed")
    b = Browser(chromium, width=1300, height=1400)
    try:
        start = time.monotonic()
        b.page("Page.navigate", {"url": pathlib.Path(args.report).resolve().as_uri()})
        if not b.wait_for("window.fragscopeReport && window.fragscopeReport.ready === true", 120):
            sys.exit("the page never became ready")
        ready_s = time.monotonic() - start
        t = json.loads(b.evaluate("JSON.stringify(window.fragscopeReport.timings)"))
        n = b.evaluate("document.getElementById('frame-slider') ? "
                       "Number(document.getElementById('frame-slider').max) + 1 : 0")
        maps = []
        for i in range(n):
            b.evaluate(f"window.fragscopeReport.selectFrame({i})")
            maps.append(b.evaluate("window.fragscopeReport.timings.lastMapMs"))
        size = pathlib.Path(args.report).stat().st_size
        print(f"report: {args.report} ({size / 2**20:.1f} MiB)")
        print(f"first chart drawn at {t['firstChartMs']:.0f} ms after navigation start "
              f"(script {t['scriptMs']:.0f} ms); page ready after {ready_s:.2f} s wall")
        if maps:
            print(f"memory map, {n} kept moments: median {statistics.median(maps):.1f} ms, "
                  f"worst {max(maps):.1f} ms")
    finally:
        b.close()


if __name__ == "__main__":
    main()
