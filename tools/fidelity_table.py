#!/usr/bin/python3
"""The simulator's fidelity on real snapshots, as a Markdown table for docs/benchmarks.md.

For each snapshot: `fragscope replay FILE --json` (the recorded requests under the recorded
allocator settings, on an unlimited device) and, per device with history, how the simulated
final segments and reserved peak compare with the recorded ones (segments at the addresses the
real driver gave them); then the same replay with `--addresses simulated` (segments where the
simulator's own rule puts them), whose layout agreement is the second "same layout" column.

    /usr/bin/python3 tools/fidelity_table.py build/release/apps/fragscope/fragscope \\
        ../shared/snapshots/real/*
"""
import json
import os
import subprocess
import sys


def mib(n):
    return f"{n / 2**20:+.1f}" if n else "0"


def replay(binary, path, extra):
    """The report of one replay, or the error text."""
    proc = subprocess.run([binary, "replay", path, "--json", "--no-map", *extra],
                          capture_output=True, timeout=600)
    if proc.returncode not in (0, 1):
        return None, proc.stderr.decode().strip()[:80]
    return json.loads(proc.stdout), None


def main(binary, paths):
    print("| file | device | history | segments rec/sim | same layout | same layout, simulator's "
          "addresses | same size | end reserved sim−rec (MiB) | peak reserved sim−rec (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        name = os.path.basename(path)
        report, error = replay(binary, path, [])
        own, own_error = replay(binary, path, ["--addresses", "simulated"])
        if error or own_error:
            print(f"| {name} | | error: {error or own_error} | | | | | | |")
            continue
        rows = report.get("fidelity") or []
        at_own = {f["device"]: f for f in own.get("fidelity") or []}
        if not rows:
            print(f"| {name} | – | no history | | | | | | |")
        for f in rows:
            history = ("none" if f["history_entries"] == 0 else
                       "complete" if f["complete_history"] else "mid-run")
            o = at_own.get(f["device"])
            own_layout = f"{100 * o['segment_agreement']:.1f}%" if o else "–"
            print(f"| {name} | {f['device']} | {history} "
                  f"| {f['real_segments']}/{f['sim_segments']} "
                  f"| {100 * f['segment_agreement']:.1f}% | {own_layout} "
                  f"| {100 * f['size_agreement']:.1f}% "
                  f"| {mib(f['sim_reserved_bytes'] - f['real_reserved_bytes'])} "
                  f"| {mib(f['sim_peak_reserved_bytes'] - f['real_peak_reserved_bytes'])} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
