#!/usr/bin/python3
"""The Python side of the snapshot benchmark: what a user would write to get the summary
`fragscope analyze snapshot.pickle` prints, with nothing but the standard library.

    /usr/bin/python3 bench/python/snapshot_summary.py FILE            # load + summarize
    /usr/bin/python3 bench/python/snapshot_summary.py --load-only FILE

It loads the pickle with pickle.load (the C unpickler; a restricted find_class keeps code from
running), then per device: the final reserved/allocated/free figures from the segments, and a
walk over the recorded history that tracks reserved and allocated bytes with per-address dicts
(sizes of allocs from the trace; segment sizes from segment events) to find their peaks, the
largest request, and the OOM count. That is less than fragscope computes (no block layout, no
largest-free-block or stranding per event), so the comparison favours Python.
"""
import json
import pickle
import sys
import time


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def summarize(snapshot):
    segments = snapshot if isinstance(snapshot, list) else snapshot["segments"]
    traces = [] if isinstance(snapshot, list) else snapshot.get("device_traces", [])
    out = {}
    for seg in segments:
        d = out.setdefault(seg.get("device", 0), {"segments": 0, "reserved": 0, "allocated": 0,
                                                  "free_blocks": 0, "largest_free": 0})
        d["segments"] += 1
        d["reserved"] += seg["total_size"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                d["allocated"] += b["size"]
            elif b["state"] == "inactive":
                d["free_blocks"] += 1
                d["largest_free"] = max(d["largest_free"], b["size"])
    for device, trace in enumerate(traces):
        d = out.setdefault(device, {"segments": 0, "reserved": 0, "allocated": 0,
                                    "free_blocks": 0, "largest_free": 0})
        live, segs = {}, {}
        reserved = allocated = peak_reserved = peak_allocated = largest = ooms = 0
        for e in trace:
            a = e["action"]
            if a == "alloc":
                live[e["addr"]] = e["size"]
                allocated += e["size"]
                largest = max(largest, e["size"])
            elif a == "free_completed":
                allocated -= live.pop(e["addr"], 0)
            elif a in ("segment_alloc", "segment_map"):
                segs[e["addr"]] = e["size"]
                reserved += e["size"]
            elif a in ("segment_free", "segment_unmap"):
                reserved -= segs.pop(e["addr"], e["size"])
            elif a == "oom":
                ooms += 1
            peak_reserved = max(peak_reserved, reserved)
            peak_allocated = max(peak_allocated, allocated)
        d.update(events=len(trace), peak_reserved_delta=peak_reserved,
                 peak_allocated_delta=peak_allocated, largest_request=largest, ooms=ooms)
    return out


def main(argv):
    load_only = "--load-only" in argv
    path = [a for a in argv if not a.startswith("--")][0]
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        snapshot = DataOnly(f).load()
    t1 = time.perf_counter()
    if load_only:
        print(json.dumps({"load_s": round(t1 - t0, 3)}))
        return
    summary = summarize(snapshot)
    t2 = time.perf_counter()
    print(json.dumps({"load_s": round(t1 - t0, 3), "summary_s": round(t2 - t1, 3),
                      "devices": {str(k): v for k, v in sorted(summary.items())}}))


if __name__ == "__main__":
    main(sys.argv[1:])
