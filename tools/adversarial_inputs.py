#!/usr/bin/env python3
"""The long adversarial run of issue 24 (make fuzz runs it after the libFuzzer targets).

For --seconds, it writes random hostile inputs — pickles built from memo references to shared
lists and dicts (each reference costs two bytes and may stand for millions of objects), deep
nesting, long strings, many small objects, traces with huge or endless event streams and long
call sites, one string shared by thousands of frames, settings or annotations, devices of
absurd capacity, many devices each running out of memory (issue 30) — compressed or not, and
runs `fragscope analyze` and `fragscope convert --to json` on each (and `replay` on the
capacity shape, `report` on the OOM one) under the default budgets (plus
a --max-memory cap). Every run must:

* end with exit 0 (the input happened to be valid) or 2 (refused), never a signal or another
  code, within --timeout seconds;
* keep its peak RSS under the memory cap plus a fixed allowance;
* leave no file behind in the output directory but the finished output, and write no more than
  the output budget.

A failing input is kept under --keep (default build/adversarial/failures) with a line saying
what broke; the exit code is 1 if any input failed. The fast, fixed cases are in make test
(tests/cli/test_input_budgets.py, test_files_and_inputs.py, test_terminal_safety.py,
tests/integration/test_serve_hostile.py); this run looks for the shapes those do not name.

    /usr/bin/python3 tools/adversarial_inputs.py --bin build/dev/apps/fragscope/fragscope \\
        --seconds 300
"""
import argparse
import gzip
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MEMORY_CAP = 512 << 20       # --max-memory for every run
RSS_ALLOWANCE = 256 << 20    # the binary, its buffers and what the budgets do not count
OUTPUT_CAP = 64 << 20        # --max-output for convert


SCALE = 2  # --scale: how many of each shape's sizes (small to huge) may be picked, minus 1


def pick(rng, sizes):
    """One of `sizes` (ascending), the first SCALE + 1 of them only."""
    return rng.choice(sizes[:SCALE + 1])


# ---- pickles (protocol 4), written opcode by opcode ----------------------------------------

def short_str(text):
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b if len(b) < 256 else (
        b"\x8d" + struct.pack("<Q", len(b)) + b)


def memo_get(i):
    return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)


def random_value(rng, memo, depth):
    """Pickle opcodes for one random value; appends to `memo` the ids it memoizes."""
    roll = rng.random()
    if memo and roll < 0.35:
        return memo_get(rng.choice(memo))
    if depth > rng.randint(3, 40) or roll < 0.5:
        kind = rng.randrange(4)
        if kind == 0:
            return b"J" + struct.pack("<i", rng.randrange(-2**31, 2**31))
        if kind == 1:
            return short_str(rng.choice(["alloc", "free_completed", "segment_alloc", "addr",
                                         "size", "action", "frames", "\x1b]0;x\x07"]))
        if kind == 2:
            return b"G" + struct.pack(">d", rng.random() * 1e12)
        return b"N"
    if rng.random() < 0.5:
        out = b"]("
        for _ in range(rng.randint(0, 6)):
            out += random_value(rng, memo, depth + 1)
        out += b"e"
    else:
        out = b"}("
        for _ in range(rng.randint(0, 4)):
            out += short_str(rng.choice(["segments", "device_traces", "blocks", "frames",
                                         "action", "addr", "size", "stream"]))
            out += random_value(rng, memo, depth + 1)
        out += b"u"
    out += b"\x94"  # MEMOIZE
    memo.append(len(memo))
    return out


def shared_reference_pickle(rng):
    """A snapshot-shaped dict whose lists are memo references to one another, many times."""
    memo = []
    body = b"}(" + short_str("segments") + b"]" + short_str("device_traces") + b"]("
    shared = random_value(rng, memo, 0)
    body += b"]" + b"\x94" + b"(" + shared
    memo.append(len(memo))
    fan = pick(rng, [10, 1000, 100000])
    body += memo_get(memo[-1]) * fan + b"e" + memo_get(memo[-1]) * rng.randint(1, 64) + b"eu."
    return b"\x80\x04" + body


def deep_pickle(rng):
    depth = pick(rng, [1000, 20000, 200000])
    return b"\x80\x04" + b"]" * depth + b"." if rng.random() < 0.5 else (
        b"\x80\x04" + b"(" * depth + b"N" + b"t" * depth + b".")


def long_strings_pickle(rng):
    """Two strings of n bytes each, as chunks (the input is written as it is made, so this
    process never holds it: its memory would count in the next child's peak RSS)."""
    n = pick(rng, [1 << 20, 64 << 20, 600 << 20])
    yield b"\x80\x04]("
    for _ in range(2):
        yield b"\x8d" + struct.pack("<Q", n)
        for _ in range(n >> 20):
            yield b"x" * (1 << 20)
    yield b"e."


def random_pickle(rng):
    memo = []
    return b"\x80\x04" + random_value(rng, memo, 0) + b"."


# ---- traces ------------------------------------------------------------------------------

HEADER = ('{"format":"fragscope-trace","version":1,"kind":"request","producer":"adversarial",'
          '"devices":[{"device":0}],"labels":{},"allocator_settings":{}}\n')


def many_events_trace(rng):
    n = pick(rng, [10**5, 10**6, 5 * 10**6])
    yield HEADER.encode()
    for start in range(0, n, 10000):
        yield "".join('{"action":"alloc","addr":%d,"size":512,"time_us":%d}\n'
                      '{"action":"free_requested","addr":%d,"size":512,"time_us":%d}\n'
                      % (i + 1, 2 * i, i + 1, 2 * i + 1)
                      for i in range(start, min(n, start + 10000))).encode()


def long_call_sites_trace(rng):
    site = "x" * pick(rng, [1 << 10, 1 << 20, 8 << 20])
    yield HEADER.encode()
    for i in range(pick(rng, [10, 200, 2000])):
        yield ('{"action":"frame","id":%d,"name":"%s%d"}\n' % (i, site, i)).encode()


def shared_string_pickle(rng):
    """Issue 30 item 4: one long string that thousands of distinct frames, allocator settings or
    annotations name through a memo reference (each reference costs ~40 bytes)."""
    size = pick(rng, [1 << 16, 1 << 20, 4 << 20])
    count = pick(rng, [1000, 10000, 50000])
    part = rng.choice(["frames", "settings", "annotations"])
    keys = ["action", "alloc", "addr", "size", "frames", "name", "filename", "line", "stage",
            "START", "device", "time_us"]
    out = bytearray(b"\x80\x04")
    for k in keys:
        out += short_str(k) + b"\x94" + b"0"
    out += short_str("x" * size) + b"\x94" + b"0"
    big = memo_get(len(keys))
    key = {k: memo_get(i) for i, k in enumerate(keys)}

    def i32(v):
        return b"J" + struct.pack("<i", v)

    out += b"}(" + short_str("segments") + b"]"
    if part == "frames":
        out += short_str("device_traces") + b"](]("
        for i in range(count):
            out += (b"}(" + key["action"] + key["alloc"] + key["addr"] + i32(4096 + 512 * i) +
                    key["size"] + i32(512) + key["frames"] + b"]}(" + key["name"] + big +
                    key["filename"] + (big if rng.random() < 0.5 else short_str("a.py")) +
                    key["line"] + i32(i) + b"ua" + b"u")
        out += b"ee"
    elif part == "settings":
        out += short_str("allocator_settings") + b"}("
        for i in range(count):
            out += short_str("k%d" % i) + big
        out += b"u"
    else:
        out += short_str("external_annotations") + b"]("
        for i in range(count):
            out += (b"}(" + key["stage"] + key["START"] + key["name"] + big + key["device"] +
                    b"K\x00" + key["time_us"] + i32(i) + b"u")
        out += b"e"
    return bytes(out + b"u.")


def huge_capacity_trace(rng):
    """Issue 30 item 5: devices of absurd capacity (up to 2^63) with allocations of terabytes,
    and many devices; replayed (check_one runs `replay` on traces with a capacity)."""
    devices = pick(rng, [1, 16, 4096])
    capacity = rng.choice([1 << 45, 1 << 50, 1 << 60, (1 << 63) - 1])
    size = rng.choice([1 << 30, 4 << 40, 1 << 50])
    yield ('{"format":"fragscope-trace","version":1,"kind":"request","devices":[%s]}\n' % ",".join(
        '{"device":%d,"capacity_bytes":%d}' % (d, capacity) for d in range(devices))).encode()
    for d in range(devices):
        lines = []
        for i in range(rng.randint(1, 12)):
            lines.append('{"action":"alloc","addr":%d,"size":%d,"device":%d}\n' % (i + 1, size, d))
            if rng.random() < 0.3:
                lines.append('{"action":"free_requested","addr":%d,"device":%d}\n' % (i + 1, d))
        yield "".join(lines).encode()


def device_ooms_trace(rng):
    """Issue 30 item 7: many devices, each filling a segment with many blocks and running out of
    memory up to 16 times (each OOM keeps a map of every block in the report); `report` runs
    on it (check_one)."""
    devices = pick(rng, [16, 256, 1024])
    blocks = pick(rng, [100, 1000, 4000])
    mib = 1 << 20
    yield ('{"format":"fragscope-trace","version":1,"kind":"allocator","devices":[%s]}\n' %
           ",".join('{"device":%d,"capacity_bytes":%d}' % (d, blocks * 2 * mib)
                    for d in range(devices))).encode()
    base = 1 << 40
    for d in range(devices):
        lines = ['{"action":"segment_alloc","addr":%d,"size":%d,"pool":"large","device":%d}\n' %
                 (base, blocks * 2 * mib, d)]
        for b in range(blocks):
            lines.append('{"action":"alloc","addr":%d,"size":%d,"device":%d}\n' %
                         (base + b * 2 * mib, 2 * mib, d))
        for _ in range(rng.randint(1, 16)):
            lines.append('{"action":"oom","size":%d,"device_free":0,"device":%d}\n' %
                         (4 * mib, d))
        yield "".join(lines).encode()


SHAPES = [("shared", shared_reference_pickle), ("deep", deep_pickle),
          ("strings", long_strings_pickle), ("random", random_pickle),
          ("events", many_events_trace), ("call_sites", long_call_sites_trace),
          ("shared_strings", shared_string_pickle), ("capacity", huge_capacity_trace),
          ("device_ooms", device_ooms_trace)]


def write_input(rng, shape, path):
    """Writes the shape's bytes (one bytes object or an iterator of chunks) to `path`, plain,
    gzip or zstd, chunk by chunk; returns the path written."""
    data = shape(rng)
    chunks = [data] if isinstance(data, bytes) else data
    kind = rng.choice(["none", "gzip", "zstd"])
    if kind == "zstd" and not shutil.which("zstd"):
        kind = "none"
    if kind == "gzip":
        path += ".gz"
        with gzip.open(path, "wb", compresslevel=1) as f:
            for chunk in chunks:
                f.write(chunk)
    elif kind == "zstd":
        path += ".zst"
        with open(path, "wb") as out:
            proc = subprocess.Popen(["zstd", "-q", "-1", "-c"], stdin=subprocess.PIPE,
                                    stdout=out)
            for chunk in chunks:
                proc.stdin.write(chunk)
            proc.stdin.close()
            if proc.wait() != 0:
                raise SystemExit("adversarial: zstd failed")
    else:
        with open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
    return path


def run(binary, args, timeout):
    """(exit code or -signal, peak RSS bytes, seconds, stderr tail); None on a timeout."""
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=err)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - start > timeout:
                proc.kill()
                os.wait4(proc.pid, 0)
                return None
            time.sleep(0.02)
        err.seek(0)
        tail = err.read()[-400:].decode(errors="replace").strip()
        return (os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024,
                time.monotonic() - start, tail)


def check_one(binary, path, out_dir, timeout):
    """Problems (strings) of analyze and convert on `path`."""
    problems = []
    out = os.path.join(out_dir, "out.json")
    runs = [["analyze", path, "--max-memory", str(MEMORY_CAP)],
            ["convert", path, "--to", "json", "-o", out, "--max-memory", str(MEMORY_CAP),
             "--max-output", str(OUTPUT_CAP)]]
    if "capacity" in os.path.basename(path):  # the simulator's own memory (issue 30 item 5)
        runs.append(["replay", path, "--max-memory", str(MEMORY_CAP)])
    page = os.path.join(out_dir, "out.html")
    if os.path.exists(page):
        os.remove(page)
    if "device_ooms" in os.path.basename(path):  # the report's maps (issue 30 item 7)
        runs.append(["report", path, "-o", page, "--max-memory", str(MEMORY_CAP),
                     "--max-map-blocks", str(random.Random(path).choice([1000, 400000]))])
    for args in runs:
        got = run(binary, args, timeout)
        what = " ".join(args[:1])
        if got is None:
            problems.append("{}: still running after {} s".format(what, timeout))
            continue
        code, rss, _, tail = got
        if code not in ((0, 1, 2) if args[0] == "replay" else (0, 2)):  # replay: 1 = an OOM
            problems.append("{}: exit {} ({})".format(what, code, tail))
        if rss > MEMORY_CAP + RSS_ALLOWANCE:
            problems.append("{}: peak RSS {} MiB above {} MiB".format(
                what, rss >> 20, (MEMORY_CAP + RSS_ALLOWANCE) >> 20))
    left = sorted(f for f in os.listdir(out_dir) if f not in ("out.json", "out.html"))
    if left:
        problems.append("convert left {}".format(left))
    if os.path.exists(out) and os.path.getsize(out) > OUTPUT_CAP:
        problems.append("convert wrote {} bytes, above --max-output".format(
            os.path.getsize(out)))
    if os.path.exists(page) and os.path.getsize(page) > 64 << 20:
        problems.append("report wrote {} bytes, above --max-size".format(os.path.getsize(page)))
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/dev/apps/fragscope/fragscope")
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--iterations", type=int, default=0, help="stop after N inputs (0: none)")
    p.add_argument("--timeout", type=float, default=60, help="seconds one run may take")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", default="build/adversarial/failures")
    p.add_argument("--scale", type=int, choices=(0, 1, 2), default=2,
                   help="0: only each shape's smallest size (a quick smoke run); 2: up to huge")
    args = p.parse_args()
    global SCALE
    SCALE = args.scale
    if not os.path.exists(args.bin):
        raise SystemExit("adversarial: no fragscope binary at {}".format(args.bin))
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    print("adversarial: seed {}, {} s".format(seed, args.seconds), flush=True)
    failures = 0
    done = 0
    deadline = time.monotonic() + args.seconds
    work = tempfile.mkdtemp(prefix="fragscope-adversarial-")
    try:
        while time.monotonic() < deadline and not (args.iterations and done >= args.iterations):
            name, shape = rng.choice(SHAPES)
            in_dir = os.path.join(work, "in")
            out_dir = os.path.join(work, "out")
            for d in (in_dir, out_dir):
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d)
            path = write_input(rng, shape, os.path.join(in_dir, name))
            problems = check_one(args.bin, path, out_dir, args.timeout)
            done += 1
            if problems:
                failures += 1
                os.makedirs(args.keep, exist_ok=True)
                kept = os.path.join(args.keep, "{}-{}-{}".format(seed, done, os.path.basename(path)))
                shutil.copy(path, kept)
                print("FAIL {}: {}".format(kept, "; ".join(problems)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("adversarial: {} inputs, {} failed (seed {})".format(done, failures, seed))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
