#!/usr/bin/python3
"""Write small synthetic PyTorch CUDA memory snapshots for fragscope's tests.

Each fixture follows one layout of shared/spec/memory-snapshot-format.md (generations G0-G5,
a bare list of segments, an empty snapshot, JSON, pickle protocols 2/4/5, expandable segments,
three devices and two streams, an OOM after segment_free retries) and is internally consistent:
blocks tile their segments, and the trace, replayed forward from the state at its start, ends in
the segments dumped. A tiny allocator model below produces both. Frames are shared the way
PyTorch shares them: one dict per distinct frame and one list per distinct stack, reused, so
pickle memoises them (and some entries get a fresh list with equal contents, as real files do).

Also written: a malicious pickle (it would run os.system if Python loaded it; its bytes are put
together by hand and never loaded), a truncated and a corrupted pickle.

    /usr/bin/python3 tools/make_snapshot_fixtures.py                 # -> tests/data/snapshots/
    /usr/bin/python3 tools/make_snapshot_fixtures.py --out DIR
    /usr/bin/python3 tools/make_snapshot_fixtures.py --big OUT --entries 2000000

--big writes one large snapshot (about 200 bytes per trace entry on disk, frames shared) for
benchmarks. It streams protocol-4 opcodes itself, so memory stays flat whatever --entries is;
do not commit its output.

Only the standard library is used.
"""

import argparse
import gzip
import json
import os
import pickle
import pickletools
import random
import struct
import sys

KIB = 1024
MIB = 1024 * KIB
SMALL_SIZE = 1 * MIB            # requests up to this go to the small pool
SMALL_SEGMENT = 2 * MIB
MIN_LARGE_SEGMENT = 20 * MIB
ROUND = 512

# ---- Frames -------------------------------------------------------------------------------


class Frames:
    """A pool of frame dicts and stack lists shared across entries (same Python objects)."""

    def __init__(self, rng, gen):
        self.rng = rng
        names = ["forward", "backward", "step", "_call_impl", "matmul", "linear",
                 "<module>", "train", "zero_grad", "empty_cache"]
        files = ["model.py", "torch/nn/modules/module.py", "train.py",
                 "torch/optim/adamw.py", "CUDACachingAllocator.cpp", "??"]
        self.frames = []
        for i in range(24):
            name, filename = names[i % len(names)], files[i % len(files)]
            line = 0 if filename in ("??", "CUDACachingAllocator.cpp") else 10 + 7 * i
            if gen == 0:  # G0 key order: filename, name, line
                self.frames.append({"filename": filename, "name": name, "line": line})
            else:
                self.frames.append({"name": name, "filename": filename, "line": line})
        self.stacks = []
        for i in range(8):
            depth = rng.randint(2, 6)
            self.stacks.append([self.frames[(i * 3 + k) % len(self.frames)]
                                for k in range(depth)])

    def stack(self):
        """A shared stack list, or now and then a fresh list with the same frames."""
        s = self.rng.choice(self.stacks)
        return list(s) if self.rng.random() < 0.3 else s


# ---- A tiny caching allocator ---------------------------------------------------------------


class Block:
    def __init__(self, addr, size):
        self.addr = addr
        self.size = size
        self.requested = 0
        self.state = "inactive"
        self.frames = []
        self.history = []  # G0: past occupants, newest first


class Segment:
    def __init__(self, device, addr, size, stream, kind, expandable):
        self.device = device
        self.addr = addr
        self.size = size
        self.stream = stream
        self.kind = kind
        self.expandable = expandable
        self.frames = []
        self.blocks = [Block(addr, size)]

    def check(self):
        at = self.addr
        for b in self.blocks:
            assert b.addr == at, "blocks must tile the segment"
            at += b.size
        assert at == self.addr + self.size


class Allocator:
    """First-fit over free blocks of the same device, stream and pool; splits and merges.
    Not PyTorch's policy, but every event it records is one PyTorch could record."""

    def __init__(self, rng, frames, gen, devices=1, capacity=None, expandable=False):
        self.rng = rng
        self.frames = frames
        self.gen = gen
        self.segments = []
        self.traces = [[] for _ in range(devices)]
        self.recording = False
        self.next_addr = {d: 0x7F0000000000 + d * 0x10000000000 for d in range(devices)}
        self.capacity = capacity  # bytes per device, for OOMs
        self.expandable = expandable
        self.time_us = 1708187029490966

    # -- trace entries
    def record(self, device, action, addr, size, stream, frames=None, **extra):
        if not self.recording:
            return
        entry = {"action": action}
        if addr is not None:
            entry["addr"] = addr
        entry.update(extra)
        entry["size"] = size
        entry["stream"] = stream
        if self.gen >= 2:
            self.time_us += self.rng.randint(1, 500)
            entry["time_us"] = self.time_us
        entry["frames"] = frames if frames is not None else self.frames.stack()
        if self.gen >= 4:
            entry["compile_context"] = "N/A"
        if self.gen >= 5:
            entry["user_metadata"] = ""
        self.traces[device].append(entry)

    # -- segments
    def reserved(self, device):
        return sum(s.size for s in self.segments if s.device == device)

    def new_segment(self, device, size, stream, kind):
        addr = self.next_addr[device]
        expandable = self.expandable and kind == "large"
        # Leave gaps between segments; an expandable one gets room to grow (grow_expandable maps
        # pages behind its end), as its virtual address reservation would.
        self.next_addr[device] += size + (256 * MIB if expandable else 2 * MIB)
        seg = Segment(device, addr, size, stream, kind, expandable)
        self.segments.append(seg)
        action = "segment_map" if expandable else "segment_alloc"
        self.record(device, action, addr, size, stream)
        return seg

    def free_segment(self, seg):
        assert all(b.state == "inactive" for b in seg.blocks)
        self.segments.remove(seg)
        action = "segment_unmap" if seg.expandable else "segment_free"
        self.record(seg.device, action, seg.addr, seg.size, seg.stream)

    def empty_cache(self, device):
        for seg in list(self.segments):
            if seg.device == device and len(seg.blocks) == 1 and \
                    seg.blocks[0].state == "inactive":
                self.free_segment(seg)

    # -- blocks
    def alloc(self, device, size, stream):
        rounded = max(ROUND, (size + ROUND - 1) // ROUND * ROUND)
        kind = "small" if rounded <= SMALL_SIZE else "large"
        best = None
        for seg in self.segments:
            if seg.device != device or seg.stream != stream or seg.kind != kind:
                continue
            for i, b in enumerate(seg.blocks):
                if b.state == "inactive" and b.size >= rounded:
                    if best is None or b.size < best[1].blocks[best[2]].size:
                        best = (seg, seg, i)
        if best is None:
            seg_size = SMALL_SEGMENT if kind == "small" else \
                max(MIN_LARGE_SEGMENT, (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB))
            if self.capacity is not None and \
                    self.reserved(device) + seg_size > self.capacity:
                # Free cached segments and retry, as the allocator does before an OOM.
                self.empty_cache(device)
                if self.reserved(device) + seg_size > self.capacity:
                    self.record(device, "oom", None, size, stream,
                                device_free=self.capacity - self.reserved(device))
                    return None
            seg = self.new_segment(device, seg_size, stream, kind)
            best = (seg, seg, 0)
        seg, _, i = best
        b = seg.blocks[i]
        if b.size - rounded >= ROUND:
            rest = Block(b.addr + rounded, b.size - rounded)
            rest.requested = b.requested  # stale, as in real snapshots
            b.size = rounded
            seg.blocks.insert(i + 1, rest)
        b.state = "active_allocated"
        b.requested = size
        b.frames = self.frames.stack()
        b.history = [{"addr": b.addr, "real_size": size, "frames": b.frames}] + b.history[:1]
        self.record(device, "alloc", b.addr, size, stream, frames=b.frames)
        seg.check()
        return b

    def free(self, block):
        seg = next(s for s in self.segments if block in s.blocks)
        self.record(seg.device, "free_requested", block.addr, block.requested, seg.stream)
        block.state = "inactive"
        block.frames = []
        self.record(seg.device, "free_completed", block.addr, block.requested, seg.stream)
        i = seg.blocks.index(block)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            prev = seg.blocks[i - 1]
            prev.size += seg.blocks.pop(i).size
            prev.requested = block.requested
        seg.check()

    def grow_expandable(self, device, stream, size):
        """Map more pages behind the first expandable segment: segment_map of the new range."""
        seg = next(s for s in self.segments if s.expandable and s.device == device)
        addr = seg.addr + seg.size
        if seg.blocks[-1].state == "inactive":
            seg.blocks[-1].size += size
        else:
            seg.blocks.append(Block(addr, size))
        seg.size += size
        self.record(device, "segment_map", addr, size, stream)
        seg.check()

    def shrink_expandable(self, device, stream):
        """Unmap the free tail of an expandable segment (2 MiB pages): segment_unmap."""
        for seg in self.segments:
            if not seg.expandable or seg.device != device:
                continue
            last = seg.blocks[-1]
            pages = last.size // (2 * MIB) * (2 * MIB)
            if last.state == "inactive" and 0 < pages < seg.size:
                addr = seg.addr + seg.size - pages
                last.size -= pages
                if last.size == 0:
                    seg.blocks.pop()
                seg.size -= pages
                self.record(device, "segment_unmap", addr, pages, stream)
                seg.check()
                return

    # -- dump
    def dump_segments(self):
        out = []
        for seg in sorted(self.segments, key=lambda s: (s.device, s.addr)):
            seg.check()
            alloc = [b for b in seg.blocks if b.state == "active_allocated"]
            d = {"device": seg.device, "address": seg.addr, "total_size": seg.size,
                 "allocated_size": sum(b.size for b in alloc),
                 "active_size": sum(b.size for b in alloc),
                 "requested_size": sum(b.requested for b in alloc),
                 "stream": seg.stream, "segment_type": seg.kind}
            if self.gen >= 1:
                d["segment_pool_id"] = (0, 0)
                d["is_expandable"] = seg.expandable
                d["frames"] = seg.frames
            blocks = []
            for b in seg.blocks:
                if self.gen == 0:
                    blocks.append({"size": b.size, "requested_size": b.requested,
                                   "state": b.state, "history": b.history})
                else:
                    blocks.append({"address": b.addr, "size": b.size,
                                   "requested_size": b.requested, "state": b.state,
                                   "frames": b.frames})
            d["blocks"] = blocks
            out.append(d)
        return out


def workload(a, rng, device, stream, steps, live_cap=12):
    """Random allocations and frees; returns the blocks still live."""
    live = []
    for _ in range(steps):
        if live and (len(live) >= live_cap or rng.random() < 0.45):
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([4, 512, 3000, 65536, 700 * KIB, 3 * MIB, 12 * MIB])
            size += rng.randrange(0, 512) if size > 4 else 0
            b = a.alloc(device, size, stream)
            if b is not None:
                live.append(b)
    return live


def snapshot(gen, seed=1, devices=1, streams=(0,), steps=60, pre_steps=20,
             expandable=False, capacity=None, device_lists=None, empty_cache_at_end=False):
    rng = random.Random(seed)
    frames = Frames(rng, gen)
    a = Allocator(rng, frames, gen, devices=device_lists or devices, capacity=capacity,
                  expandable=expandable)
    # Before recording starts: state the trace does not show (the decoder must infer it).
    for d in range(devices):
        for s in streams:
            workload(a, rng, d, s, pre_steps)
    a.recording = True
    for d in range(devices):
        for s in streams:
            workload(a, rng, d, s, steps)
            if expandable:
                a.grow_expandable(d, s, 4 * MIB)
                a.shrink_expandable(d, s)
        if empty_cache_at_end:
            a.empty_cache(d)
    snap = {"segments": a.dump_segments(), "device_traces": a.traces}
    if gen >= 3:
        snap["allocator_settings"] = {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable else "",
            "max_split_size": -1, "garbage_collection_threshold": 0.0,
            "expandable_segments": expandable, "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False, "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
        if gen >= 5:
            snap["allocator_settings"]["graph_capture_record_stream_reuse"] = False
        snap["external_annotations"] = [
            {"stage": "START", "name": "Optimizer.step#AdamW.step", "device": 0,
             "time_us": 1708187029490966},
            {"stage": "END", "name": "Optimizer.step#AdamW.step", "device": 0,
             "time_us": 1708187029491966}]
    return snap


def oom_snapshot():
    """A history that ends in an OOM, right after segment_free retries (G2 layout)."""
    rng = random.Random(7)
    frames = Frames(rng, 2)
    a = Allocator(rng, frames, 2, capacity=200 * MIB)
    a.recording = True
    live = []
    for size in [30 * MIB, 30 * MIB, 40 * MIB, 50 * MIB]:
        live.append(a.alloc(0, size, 0))
    for b in live[:3]:
        a.free(b)  # three cached, fully free segments
    assert a.alloc(0, 180 * MIB, 0) is None  # frees them (segment_free x3), then oom
    actions = [e["action"] for e in a.traces[0]]
    assert actions[-4:] == ["segment_free"] * 3 + ["oom"], actions
    return {"segments": a.dump_segments(), "device_traces": a.traces}


# ---- Writing --------------------------------------------------------------------------------


def to_json(value):
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def malicious_pickle():
    """Bytes that would call os.system('touch /tmp/fragscope_pwned') under pickle.load.
    Put together opcode by opcode; never load it."""
    cmd = b"touch /tmp/fragscope_pwned"
    return (b"\x80\x02"                          # PROTO 2
            b"cos\nsystem\n"                     # GLOBAL os.system
            b"X" + struct.pack("<I", len(cmd)) + cmd +  # BINUNICODE
            b"\x85"                              # TUPLE1
            b"R"                                 # REDUCE: os.system(cmd)
            b".")                                # STOP


def corrupt(data):
    """An unknown opcode (0xff) in place of the 40th opcode."""
    ops = list(pickletools.genops(data))
    pos = ops[40][2]
    return data[:pos] + b"\xff" + data[pos + 1:]


FIXTURES = {
    # name: (builder, protocol or "json")
    "g0_history.pickle": (lambda: snapshot(0, seed=10), 4),
    "g1_blocks_with_address.pickle": (lambda: snapshot(1, seed=11, device_lists=4), 4),
    "g2_time_us.pickle": (lambda: snapshot(2, seed=12), 4),
    "g3_settings_annotations.pickle": (lambda: snapshot(3, seed=13), 4),
    "g4_compile_context.pickle": (lambda: snapshot(4, seed=14), 4),
    "g5_user_metadata.pickle": (lambda: snapshot(5, seed=15), 4),
    "segments_list.pickle": (lambda: snapshot(1, seed=16)["segments"], 4),
    "empty.pickle": (lambda: {"segments": [], "device_traces": [[]],
                              "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
                              "external_annotations": []}, 4),
    "g3_snapshot.json": (lambda: snapshot(3, seed=17), "json"),
    "g2_protocol2.pickle": (lambda: snapshot(2, seed=18), 2),
    "g5_protocol5.pickle": (lambda: snapshot(5, seed=19), 5),
    "g4_expandable.pickle": (lambda: snapshot(4, seed=20, expandable=True), 4),
    "g5_three_devices_two_streams.pickle":
        (lambda: snapshot(5, seed=21, devices=3, streams=(0, 123323568)), 4),
    "g2_oom.pickle": (oom_snapshot, 4),
}
BROKEN = ["malicious.pickle", "truncated.pickle", "corrupted.pickle"]


def write_fixtures(out):
    os.makedirs(out, exist_ok=True)
    written = {}
    for name, (build, protocol) in FIXTURES.items():
        value = build()
        if protocol == "json":
            data = json.dumps(to_json(value), indent=1).encode()
        else:
            data = pickle.dumps(value, protocol=protocol)
        written[name] = data
    written["g2_time_us.pickle.gz"] = gzip.compress(written["g2_time_us.pickle"], mtime=0)
    base = written["g2_time_us.pickle"]
    written["malicious.pickle"] = malicious_pickle()
    written["truncated.pickle"] = base[:len(base) // 2]
    written["corrupted.pickle"] = corrupt(base)
    for name, data in written.items():
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(data)
    return sorted(written)


# ---- --big: a streamed protocol-4 writer ---------------------------------------------------


class StreamPickler:
    """Writes protocol-4 opcodes as CPython's pickler would for dicts, lists, str and int
    (MEMOIZE after every container and string, FRAMEs of about 64 KiB), straight to a file."""

    def __init__(self, fh):
        self.fh = fh
        self.buf = bytearray()
        self.memo = 0
        self.strings = {}  # interned() strings -> memo index
        fh.write(b"\x80\x04")

    def _flush(self, force=False):
        if len(self.buf) >= 64 * KIB or (force and self.buf):
            self.fh.write(b"\x95" + struct.pack("<Q", len(self.buf)) + self.buf)
            self.buf = bytearray()

    def op(self, b):
        self.buf += b
        self._flush()

    def memoize(self):
        self.buf += b"\x94"
        self.memo += 1
        return self.memo - 1

    def get(self, i):
        self.op(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i))

    def interned(self, s):
        """A string written once and referenced through the memo afterwards, as CPython does for
        a string object that recurs (dict keys, action names)."""
        if s in self.strings:
            self.get(self.strings[s])
        else:
            self.strings[s] = self.str(s)

    def str(self, s):
        b = s.encode()
        self.op(b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else
                b"X" + struct.pack("<I", len(b)) + b)
        return self.memoize()

    def int(self, v):
        if 0 <= v < 256:
            self.op(b"K" + bytes([v]))
        elif 0 <= v < 65536:
            self.op(b"M" + struct.pack("<H", v))
        elif -2**31 <= v < 2**31:
            self.op(b"J" + struct.pack("<i", v))
        else:
            n = (v.bit_length() + 8) // 8
            self.op(b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True))

    def stop(self):
        self.buf += b"."
        self._flush(force=True)


class StackWriter:
    """Writes the `frames` of trace entries as real files share them: the same stack list
    object now and then (a memo reference), more often a fresh list with the frames of a known
    stack, sometimes a new stack of 30-90 frames; at most 300 frame dicts and 2,000 stacks, each
    memoised once. `key(k)` writes a dict key (StreamPickler.interned)."""

    def __init__(self, p, rng, key):
        self.p, self.rng, self.key = p, rng, key
        self.frames = []  # memo index of each frame dict
        self.stacks = []  # (memo index of the list, its frames)

    def write(self):
        p, rng, key, frames, stacks = self.p, self.rng, self.key, self.frames, self.stacks
        r = rng.random()
        if stacks and r < 0.25:
            p.get(rng.choice(stacks)[0])
            return
        if stacks and r < 0.9:
            content = list(rng.choice(stacks)[1])
        else:
            content = [None if len(frames) < 300 and (not frames or rng.random() < 0.3)
                       else rng.choice(frames) for _ in range(rng.randint(30, 90))]
        p.op(b"]")
        list_memo = p.memoize()
        p.op(b"(")
        for k, frame in enumerate(content):
            if frame is None:  # a new frame dict
                p.op(b"}")
                frame = p.memoize()
                p.op(b"(")
                key("name")
                p.str("fn_%d" % len(frames))
                key("filename")
                p.str("/src/module_%d.py" % (len(frames) % 40))
                key("line")
                p.int(len(frames) * 3)
                p.op(b"u")
                frames.append(frame)
                content[k] = frame
            else:
                p.get(frame)
        p.op(b"e")
        if len(stacks) < 2000:
            stacks.append((list_memo, content))


def write_big(path, entries, seed=3):
    rng = random.Random(seed)
    with open(path, "wb") as fh:
        p = StreamPickler(fh)
        key = p.interned
        stack_writer = StackWriter(p, rng, key)
        # {"segments": [one segment], "device_traces": [[entries...]]}
        p.op(b"}")
        p.memoize()
        p.op(b"(")
        key("device_traces")
        p.op(b"]")
        p.memoize()
        p.op(b"]")
        p.memoize()
        base = 0x7F3A00000000
        live = []
        for i in range(entries):
            if i % 1000 == 0:
                if i:
                    p.op(b"e")  # APPENDS
                p.op(b"(")
            if live and rng.random() < 0.5:
                addr, size = live.pop(rng.randrange(len(live)))
                action = "free_completed"
            else:
                addr = base + rng.randrange(0, 1 << 34) // 512 * 512
                size = rng.choice([512, 4096, 1 << 20, 3 << 20]) + rng.randrange(0, 512)
                live.append((addr, size))
                action = "alloc"
                if len(live) > 4096:
                    live.pop(0)
            p.op(b"}")
            p.memoize()
            p.op(b"(")
            key("action")
            p.interned(action)
            key("addr")
            p.int(addr)
            key("size")
            p.int(size)
            key("stream")
            p.int(0)
            key("time_us")
            p.int(1708187029490966 + i * 37)
            key("frames")
            stack_writer.write()
            p.op(b"u")  # SETITEMS
        p.op(b"e")
        p.op(b"a")  # APPEND the device list to device_traces
        key("segments")
        p.op(b"]")
        p.memoize()
        p.op(b"u")
        p.stop()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.normpath(
        os.path.join(here, "..", "tests", "data", "snapshots")))
    parser.add_argument("--big", metavar="OUT", help="write one large snapshot to OUT")
    parser.add_argument("--entries", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    if args.big:
        write_big(args.big, args.entries)
        print("wrote %s (%d bytes, %d entries)" % (args.big, os.path.getsize(args.big),
                                                   args.entries))
        return 0
    for name in write_fixtures(args.out):
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
