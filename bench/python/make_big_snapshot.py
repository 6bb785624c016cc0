#!/usr/bin/python3
"""A large, internally consistent memory snapshot for the load + analyze benchmark.

    /usr/bin/python3 bench/python/make_big_snapshot.py OUT [--entries 2700000]

A complete history (the recording starts on an empty device): segment_alloc of 200 large
segments (64 MiB, eight 8 MiB slots) and 200 small ones (2 MiB, thirty-two 64 KiB slots), then
allocs and frees (free_requested + free_completed) of whole slots. An alloc takes the first
slot of a free run, with a request that PyTorch rounds to exactly one slot, so the allocator
would split the run there: replayed, the history ends in exactly the segments dumped. Frames
are shared as in real files (tools/make_snapshot_fixtures.py's StreamPickler and stack mix:
300 frame dicts, 2,000 stacks of 30-90 frames, reused by reference or by content). About 190
bytes per entry on disk, like the real corpus's median.

    /usr/bin/python3 bench/python/make_big_snapshot.py OUT --factor 340

The issue-34 shape ("factor 340: 339,660 segments, 6.6 M events" in 447 MB): per unit of the
factor 999 segments (500 large, 499 small) and 19,400 history entries, whose frames are one of
64 short stacks (1-4 frames) written once and referenced through the memo ever after, so an
entry takes about 50 bytes on disk; three allocs for each free, so the final state is large
(factor 20 is 26.4 MB; the issue had 28.6 MB for factor 20 and 447 MB for factor 340). Same
history rules as above.
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from make_snapshot_fixtures import StackWriter, StreamPickler  # noqa: E402

MIB = 1 << 20


class SharedStacks:
    """The factor shape's frames: 64 stacks of 1-4 frames (of 100 frame dicts), each list
    written once and named by a memo reference ever after."""

    def __init__(self, p, rng, key):
        self.p, self.rng, self.key = p, rng, key
        self.frames = []  # memo index of each frame dict
        self.stacks = []  # memo index of each list

    def write(self):
        p, rng, key = self.p, self.rng, self.key
        if len(self.stacks) == 64:
            p.get(rng.choice(self.stacks))
            return
        p.op(b"]")
        self.stacks.append(p.memoize())
        p.op(b"(")
        for _ in range(rng.randint(1, 4)):
            if len(self.frames) < 100 and (not self.frames or rng.random() < 0.5):
                p.op(b"}")
                self.frames.append(p.memoize())
                p.op(b"(")
                key("name")
                p.str("fn_%d" % len(self.frames))
                key("filename")
                p.str("/src/module_%d.py" % (len(self.frames) % 40))
                key("line")
                p.int(len(self.frames) * 3)
                p.op(b"u")
            else:
                p.get(rng.choice(self.frames))
        p.op(b"e")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--entries", type=int, default=2_700_000)
    parser.add_argument("--factor", type=int, default=0,
                        help="the issue-34 shape: 999 segments and 19,400 entries per unit")
    args = parser.parse_args(argv)
    rng = random.Random(11)
    large, small, max_live, free_p = 200, 200, 3000, 0.5
    if args.factor > 0:
        large, small = 500 * args.factor, 499 * args.factor
        args.entries = 19_400 * args.factor
        max_live, free_p = 16 * (large + small), 0.25
    segments = []  # [addr, size, slot, states]
    addr = 0x7F0000000000
    for _ in range(large):
        segments.append([addr, 64 * MIB, 8 * MIB, [None] * 8])
        addr += 66 * MIB
    for _ in range(small):
        segments.append([addr, 2 * MIB, 64 * 1024, [None] * 32])
        addr += 2 * MIB
    live = []  # (segment index, slot index)
    t = 1_708_187_029_490_966
    with open(args.out, "wb") as fh:
        p = StreamPickler(fh)
        key = string = p.interned
        stack_writer = StackWriter(p, rng, key) if args.factor <= 0 else SharedStacks(p, rng, key)

        count = 0

        def entry(action, a, size):
            nonlocal count, t
            if count % 1000 == 0:
                if count:
                    p.op(b"e")
                p.op(b"(")
            count += 1
            t += 37
            p.op(b"}")
            p.memoize()
            p.op(b"(")
            key("action")
            string(action)
            key("addr")
            p.int(a)
            key("size")
            p.int(size)
            key("stream")
            p.int(0)
            key("time_us")
            p.int(t)
            key("frames")
            stack_writer.write()
            p.op(b"u")

        p.op(b"}")
        p.memoize()
        p.op(b"(")
        key("device_traces")
        p.op(b"]")
        p.memoize()
        p.op(b"]")
        p.memoize()
        for seg in segments:
            entry("segment_alloc", seg[0], seg[1])
        while count < args.entries:
            if live and (rng.random() < free_p or len(live) > max_live):
                si, k = live.pop(rng.randrange(len(live)))
                seg = segments[si]
                size = seg[3][k]
                entry("free_requested", seg[0] + k * seg[2], size)
                entry("free_completed", seg[0] + k * seg[2], size)
                seg[3][k] = None
                continue
            si = rng.randrange(len(segments))
            seg = segments[si]
            starts = [k for k in range(len(seg[3])) if seg[3][k] is None and
                      (k == 0 or seg[3][k - 1] is not None)]
            if not starts:
                continue
            k = rng.choice(starts)
            size = seg[2] - rng.randrange(0, 512)  # rounds to exactly one slot
            seg[3][k] = size
            live.append((si, k))
            entry("alloc", seg[0] + k * seg[2], size)
        p.op(b"e")
        p.op(b"a")  # the device's list into device_traces
        p.op(b"u")
        # segments, from the final slot states: runs of free slots are one block.
        p.op(b"(")
        key("segments")
        p.op(b"]")
        p.memoize()
        p.op(b"(")
        for seg in segments:
            p.op(b"}")
            p.memoize()
            p.op(b"(")
            for k, v in (("device", 0), ("address", seg[0]), ("total_size", seg[1]),
                         ("stream", 0)):
                key(k)
                p.int(v)
            key("segment_type")
            string("large" if seg[1] > 2 * MIB else "small")
            key("blocks")
            p.op(b"]")
            p.memoize()
            p.op(b"(")
            k = 0
            while k < len(seg[3]):
                start = k
                if seg[3][k] is None:
                    while k < len(seg[3]) and seg[3][k] is None:
                        k += 1
                    state, req = "inactive", 0
                else:
                    req = seg[3][k]
                    k += 1
                    state = "active_allocated"
                p.op(b"}")
                p.memoize()
                p.op(b"(")
                for kk, v in (("address", seg[0] + start * seg[2]),
                              ("size", (k - start) * seg[2]), ("requested_size", req)):
                    key(kk)
                    p.int(v)
                key("state")
                string(state)
                p.op(b"u")
            p.op(b"e")
            p.op(b"u")
        p.op(b"e")
        p.op(b"u")
        p.stop()
    print("wrote %s (%d bytes, %d entries)" % (args.out, os.path.getsize(args.out), count))


if __name__ == "__main__":
    main(sys.argv[1:])
