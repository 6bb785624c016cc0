#!/usr/bin/env python3
"""Writes the hand-made traces of the `fragscope analyze` CLI tests (tests/cli/).

Run from anywhere: python3 tests/data/cli/make_fixtures.py. The outputs are committed; this
script says how each one was made (see README.md beside it for what each one shows).
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB

S1 = 0x7F0000000000  # large pool, 20 MiB
S2 = 0x7F0002000000  # small pool, 2 MiB
S3 = 0x7F0004000000  # large pool, 32 MiB


def header(kind, devices, **extra):
    h = {"format": "fragscope-trace", "version": 1, "kind": kind, "devices": devices}
    h.update(extra)
    return h


def write(name, lines):
    with open(os.path.join(HERE, name), "w") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line, separators=(",", ":")))
            f.write("\n")


def ev(action, **fields):
    e = {"action": action}
    e.update(fields)
    return e


def allocator_basic():
    """Three steps on one 1 GiB device: a 20 MiB large segment that ends with two stranded
    gaps, a pending free on the way, a small-pool segment with a stranded 1 KiB hole and a
    32 MiB segment that ends fully free (releasable)."""
    t = 1_000_000
    lines = [header("allocator", [{"device": 0, "name": "test", "capacity_bytes": GIB}],
                    producer="tests/data/cli/make_fixtures.py", labels={"model": "toy"})]

    def add(action, **fields):
        nonlocal t
        t += 1000
        lines.append(ev(action, time_us=t, **fields))

    # Setup, before the first step marker.
    add("segment_alloc", addr=S1, size=20 * MIB, pool="large")
    add("alloc", addr=S1, size=4 * MIB)
    lines.append(ev("step", step=0))
    add("alloc", addr=S1 + 4 * MIB, size=2 * MIB)
    add("alloc", addr=S1 + 6 * MIB, size=3 * MIB // 2)
    add("alloc", addr=S1 + 15 * MIB // 2, size=6 * MIB)
    add("segment_alloc", addr=S2, size=2 * MIB, pool="small")
    add("alloc", addr=S2, size=1000)
    add("alloc", addr=S2 + 1 * KIB, size=4 * KIB)
    for i in range(3):
        add("alloc", addr=S2 + 5 * KIB + i * 8 * KIB, size=8 * KIB)
    lines.append(ev("step", step=1))
    add("free_requested", addr=S1 + 4 * MIB, size=2 * MIB)
    add("free_completed", addr=S1 + 4 * MIB)
    add("free_requested", addr=S1 + 6 * MIB, size=3 * MIB // 2)
    add("alloc", addr=S1 + 27 * MIB // 2, size=5 * MIB)
    add("segment_alloc", addr=S3, size=32 * MIB, pool="large")
    add("alloc", addr=S3, size=30 * MIB)
    lines.append(ev("step", step=2))
    add("free_completed", addr=S1 + 6 * MIB)
    add("free_requested", addr=S2, size=1000)
    add("free_completed", addr=S2)
    add("free_requested", addr=S3, size=30 * MIB)
    add("free_completed", addr=S3)
    return lines


def allocator_no_steps():
    """No step markers: the timeline falls back to event windows (--every)."""
    lines = [header("allocator", [{"device": 0, "name": "test", "capacity_bytes": 256 * MIB}])]
    lines.append(ev("segment_alloc", addr=S1, size=20 * MIB, pool="large"))
    for i in range(8):
        lines.append(ev("alloc", addr=S1 + i * 2 * MIB, size=2 * MIB))
    for i in range(0, 8, 2):
        lines.append(ev("free_completed", addr=S1 + i * 2 * MIB))
    return lines


def two_devices():
    """Two devices, the second one without a known capacity."""
    lines = [header("allocator", [{"device": 0, "name": "gpu0", "capacity_bytes": 4 * GIB},
                                  {"device": 1, "name": "gpu1"}])]
    lines.append(ev("step", step=0))
    for dev in (0, 1):
        lines.append(ev("segment_alloc", device=dev, addr=S1, size=20 * MIB, pool="large"))
        lines.append(ev("alloc", device=dev, addr=S1, size=(dev + 2) * MIB))
    lines.append(ev("step", step=1))
    lines.append(ev("free_completed", device=1, addr=S1))
    return lines


def request_basic():
    """A request trace: the program's allocs and frees (ids, not addresses), three steps."""
    lines = [header("request", [{"device": 0, "name": "virtual"}],
                    producer="tests/data/cli/make_fixtures.py")]
    next_id = 1
    t = 0
    for step in range(3):
        lines.append(ev("step", step=step))
        ids = []
        for size in (1 * MIB, 1 * MIB, 4 * MIB, 512, 3000 + step, 16 * MIB):
            t += 10
            lines.append(ev("alloc", addr=next_id, size=size, time_us=t))
            ids.append((next_id, size))
            next_id += 1
        for i, size in ids[:-1]:  # the last one lives on into the next step
            t += 10
            lines.append(ev("free_requested", addr=i, size=size, time_us=t))
    return lines


def bad(name, lines):
    write(name, lines)


def main():
    write("allocator_basic.jsonl", allocator_basic())
    write("allocator_no_steps.jsonl", allocator_no_steps())
    write("two_devices.jsonl", two_devices())
    write("request_basic.jsonl", request_basic())

    h = header("allocator", [{"device": 0, "name": "test", "capacity_bytes": GIB}])
    # Each bad file breaks on a known line (the tests check "file:line").
    bad("bad_unknown_action.jsonl", [
        h, ev("segment_alloc", addr=S1, size=20 * MIB), ev("allocate", addr=S1, size=MIB)])
    bad("bad_free_unknown_address.jsonl", [
        h, ev("segment_alloc", addr=S1, size=20 * MIB), ev("alloc", addr=S1, size=MIB),
        ev("free_completed", addr=S1 + 4096)])
    bad("bad_overlapping_segments.jsonl", [
        h, ev("segment_alloc", addr=S1, size=20 * MIB),
        ev("segment_alloc", addr=S1 + 10 * MIB, size=20 * MIB)])
    bad("bad_negative_size.jsonl", [
        h, ev("segment_alloc", addr=S1, size=20 * MIB), ev("alloc", addr=S1, size=-5)])
    bad("bad_absurd_size.jsonl", [
        h, ev("segment_alloc", addr=S1, size=20 * MIB),
        ev("segment_alloc", addr=S2, size=1 << 62)])
    bad("bad_empty.jsonl", [])


if __name__ == "__main__":
    main()
