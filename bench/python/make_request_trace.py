#!/usr/bin/python3
"""Writes a synthetic request trace (JSON Lines) for benchmarks of `fragscope replay`.

The same stream as bench/sim_bench.cc's synthetic trace: a steady state of --live tensors
(sizes: 60% up to 256 KiB, 35% 1-9 MiB, 5% 8-72 MiB), 90% of frees hitting one of the 1,000
most recent allocations (activations die young), 10% any live tensor; a step marker every
--step-every request events.

  /usr/bin/python3 bench/python/make_request_trace.py /tmp/requests.jsonl --events 4000000
"""

import argparse
import json
import random


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--events", type=int, default=4_000_000)
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--step-every", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    def size():
        r = rng.randrange(100)
        if r < 60:
            return 1 + rng.randrange(256 << 10)
        if r < 95:
            return (1 << 20) + rng.randrange(8 << 20)
        return (8 << 20) + rng.randrange(64 << 20)

    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "producer": "bench/python/make_request_trace.py",
              "devices": [{"device": 0, "name": "virtual-gpu", "capacity_bytes": 1 << 40}]}
    next_id = 1
    live = []
    written = 0
    step = 0
    with open(args.out, "w") as f:
        f.write(json.dumps(header) + "\n")
        lines = []

        def emit(line):
            nonlocal written, step
            lines.append(line)
            written += 1
            if written % args.step_every == 0:
                step += 1
                lines.append('{"action":"step","step":%d}' % step)
            if len(lines) >= 100_000:
                f.write("\n".join(lines) + "\n")
                lines.clear()

        while len(live) < args.live and written < args.events:
            emit('{"action":"alloc","addr":%d,"size":%d}' % (next_id, size()))
            live.append(next_id)
            next_id += 1
        while written + 2 <= args.events:
            if rng.randrange(10) < 9:
                i = len(live) - 1 - rng.randrange(min(1000, len(live)))
            else:
                i = rng.randrange(len(live))
            emit('{"action":"free_requested","addr":%d}' % live[i])
            emit('{"action":"alloc","addr":%d,"size":%d}' % (next_id, size()))
            live[i] = next_id
            next_id += 1
        if lines:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
