#!/usr/bin/python3
"""Figures PyTorch's own tool computes for memory snapshots, for fragscope's parity test.

For each file: torch.cuda._memory_viz.stats() over its segment list (Debian's torch 1.13:
segments, total_size and bytes per block state, all devices together), plus the trace-entry
count. Files are loaded with an Unpickler that refuses every global, so nothing in them runs.

    /usr/bin/python3 tools/snapshot_parity.py ../shared/snapshots/real/*

prints one JSON object per line; tests/cli/test_snapshots.py holds the numbers it printed.
"""
import json
import pickle
import sys

from torch.cuda import _memory_viz


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def load(path):
    with open(path, "rb") as f:
        head = f.read(1)
        f.seek(0)
        if head in (b"{", b"["):
            return json.load(f)
        return DataOnly(f).load()


def main(paths):
    for path in paths:
        snapshot = load(path)
        segments = snapshot if isinstance(snapshot, list) else snapshot["segments"]
        traces = [] if isinstance(snapshot, list) else snapshot.get("device_traces", [])
        stats = _memory_viz.stats(segments)
        row = {
            "file": path.rsplit("/", 1)[-1],
            "segments": stats["segments"],
            "total_size": stats["total_size"].value,
            "active_allocated": stats.get("active_allocated", _memory_viz.Bytes(0)).value,
            "inactive": stats.get("inactive", _memory_viz.Bytes(0)).value,
            "trace_entries": sum(len(t) for t in traces),
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main(sys.argv[1:])
