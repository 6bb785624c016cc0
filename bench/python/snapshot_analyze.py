#!/usr/bin/python3
"""The Python side of the load + analyze benchmark: the summary `fragscope analyze` prints for
a snapshot, computed the way a Python user would, with the standard library only.

    /usr/bin/python3 bench/python/snapshot_analyze.py FILE

pickle.load (the C unpickler; find_class refuses globals), then per device: the start state
rebuilt by walking the history backwards from the final segments (as fragscope does), the
history replayed forwards over segments and blocks (split on alloc with PyTorch's 512-byte
rounding, merged on free), peak reserved/allocated with their event index, a timeline sample
every 1,000 events (reserved, allocated, fragmentation ratio, largest free block) with the worst
fragmentation and the smallest largest-free-block, the request-size quantiles, and the final
per-pool state. Blocks live in a dict per segment keyed by address; a sample scans the free
blocks (fragscope keeps indexes instead). It handles consistent histories; it does not model
expandable segments or rounding options, which fragscope does.
"""
import bisect
import json
import pickle
import sys
import time

SMALL = 1 << 20


class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def round_size(n):
    return max(512, (n + 511) // 512 * 512)


class Device:
    def __init__(self):
        self.seg_addrs = []  # sorted segment starts
        self.segs = {}       # start -> [size, {block addr: [size, state, requested]}]
        self.block_seg = {}  # block addr -> segment start
        self.reserved = self.allocated = self.requested = 0

    def add_segment(self, addr, size):
        bisect.insort(self.seg_addrs, addr)
        self.segs[addr] = [size, {addr: [size, "free", 0]}]
        self.block_seg[addr] = addr
        self.reserved += size

    def remove_segment(self, addr):
        size, blocks = self.segs.pop(addr)
        self.seg_addrs.remove(addr)
        for b in blocks:
            del self.block_seg[b]
        self.reserved -= size

    def place(self, addr, block_size, requested, pending=False):
        i = bisect.bisect_right(self.seg_addrs, addr) - 1
        seg = self.seg_addrs[i]
        blocks = self.segs[seg][1]
        start = max(b for b in blocks if b <= addr)  # the free block that holds it
        size = blocks[start][0]
        del blocks[start]
        if start < addr:
            blocks[start] = [addr - start, "free", 0]
        blocks[addr] = [block_size, "pending" if pending else "alloc", requested]
        self.block_seg[addr] = seg
        if start + size > addr + block_size:
            blocks[addr + block_size] = [start + size - addr - block_size, "free", 0]
            self.block_seg[addr + block_size] = seg
        if not pending:
            self.allocated += block_size
            self.requested += requested

    def alloc(self, addr, requested):
        seg = self.block_seg[addr]
        blocks = self.segs[seg][1]
        size = blocks[addr][0]
        want = round_size(requested)
        small = self.segs[seg][0] == 2 * SMALL
        take = want if size - want >= (512 if small else SMALL + 1) else size
        blocks[addr] = [take, "alloc", requested]
        if take < size:
            blocks[addr + take] = [size - take, "free", 0]
            self.block_seg[addr + take] = seg
        self.allocated += take
        self.requested += requested

    def free_requested(self, addr):
        b = self.segs[self.block_seg[addr]][1][addr]
        if b[1] == "alloc":
            b[1] = "pending"
            self.allocated -= b[0]
            self.requested -= b[2]

    def free_completed(self, addr):
        self.free_requested(addr)
        seg = self.block_seg[addr]
        blocks = self.segs[seg][1]
        blocks[addr][1] = "free"
        # merge with the free neighbours
        after = addr + blocks[addr][0]
        if after in blocks and blocks[after][1] == "free":
            blocks[addr][0] += blocks.pop(after)[0]
            del self.block_seg[after]
        before = [b for b in blocks if b < addr and b + blocks[b][0] == addr]
        if before and blocks[before[0]][1] == "free":
            blocks[before[0]][0] += blocks.pop(addr)[0]
            del self.block_seg[addr]

    def largest_free(self):
        return max((b[0] for s in self.segs.values() for b in s[1].values() if b[1] == "free"),
                   default=0)


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] \
        if sorted_values else 0


def analyze(snapshot):
    segments = snapshot if isinstance(snapshot, list) else snapshot["segments"]
    traces = [] if isinstance(snapshot, list) else snapshot.get("device_traces", [])
    devices = sorted({s.get("device", 0) for s in segments} |
                     {d for d, t in enumerate(traces) if t})
    report = {}
    for d in devices:
        trace = traces[d] if d < len(traces) else []
        # Backwards: the state at the first recorded event.
        segs = {s["address"]: s["total_size"] for s in segments if s.get("device", 0) == d}
        live = {}
        for s in segments:
            if s.get("device", 0) != d:
                continue
            addr = s["address"]
            for b in s["blocks"]:
                a = b.get("address", addr)
                if b["state"] != "inactive":
                    live[a] = (b["size"], b.get("requested_size", b["size"]))
                addr = a + b["size"]
        for e in reversed(trace):
            a = e["action"]
            if a == "alloc":
                live.pop(e["addr"], None)
            elif a == "free_completed":
                live[e["addr"]] = (round_size(e["size"]), e["size"])
            elif a == "segment_alloc":
                segs.pop(e["addr"], None)
            elif a == "segment_free":
                segs[e["addr"]] = e["size"]
        dev = Device()
        for addr in sorted(segs):
            dev.add_segment(addr, segs[addr])
        for addr in sorted(live):
            dev.place(addr, live[addr][0], live[addr][1])
        # Forwards.
        peak_reserved = peak_allocated = (0, -1)
        worst = (0.0, -1)
        min_largest = (None, -1)
        timeline = []
        requests = []
        for i, e in enumerate(trace):
            a = e["action"]
            if a == "alloc":
                dev.alloc(e["addr"], e["size"])
                requests.append(e["size"])
            elif a == "free_requested":
                dev.free_requested(e["addr"])
            elif a == "free_completed":
                dev.free_completed(e["addr"])
            elif a == "segment_alloc":
                dev.add_segment(e["addr"], e["size"])
            elif a == "segment_free":
                dev.remove_segment(e["addr"])
            if dev.reserved > peak_reserved[0]:
                peak_reserved = (dev.reserved, i)
            if dev.allocated > peak_allocated[0]:
                peak_allocated = (dev.allocated, i)
            if i % 1000 == 999 or i == len(trace) - 1:
                largest = dev.largest_free()
                ratio = (dev.reserved - dev.allocated) / dev.reserved if dev.reserved else 0.0
                timeline.append((i, dev.reserved, dev.allocated, ratio, largest))
                if ratio > worst[0]:
                    worst = (ratio, i)
                if dev.reserved and (min_largest[0] is None or largest < min_largest[0]):
                    min_largest = (largest, i)
        requests.sort()
        pools = {"small": [0, 0, 0, 0, 0], "large": [0, 0, 0, 0, 0]}
        for size, blocks in dev.segs.values():
            p = pools["small" if size == 2 * SMALL else "large"]
            p[0] += size
            for b in blocks.values():
                if b[1] == "alloc":
                    p[1] += b[0]
                    p[2] += b[2]
                elif b[1] == "free":
                    p[3] = max(p[3], b[0])
            p[4] += 1
        report[d] = {
            "events": len(trace), "peak_reserved": peak_reserved, "peak_allocated": peak_allocated,
            "worst_fragmentation": worst, "min_largest_free_block": min_largest,
            "requests": {"count": len(requests), "p50": quantile(requests, 0.5),
                         "p90": quantile(requests, 0.9), "p99": quantile(requests, 0.99)},
            "final": {k: dict(zip(["reserved", "allocated", "requested", "largest_free",
                                   "segments"], v)) for k, v in pools.items()},
            "timeline_rows": len(timeline)}
    return report


def main(argv):
    t0 = time.perf_counter()
    with open(argv[0], "rb") as f:
        snapshot = DataOnly(f).load()
    t1 = time.perf_counter()
    report = analyze(snapshot)
    t2 = time.perf_counter()
    print(json.dumps({"load_s": round(t1 - t0, 3), "analyze_s": round(t2 - t1, 3),
                      "devices": {str(k): v for k, v in report.items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
