#!/usr/bin/python3
"""What the in-process agent's summary costs the training process: summarize_segments()
(python/fragscope_agent.py) over the segment lists of the real snapshots with the most blocks.

    /usr/bin/python3 bench/python/agent_summary_bench.py [DIR] [--top 3] [--repeat 50]

DIR defaults to ../shared/snapshots/real. Prints, per file, segments, blocks and the median
time of one summary. torch.cuda.memory_snapshot() itself, which builds the list on a GPU host,
is not measured (no GPU here).
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "cli"))
import fragscope_agent  # noqa: E402
from test_agent import load_segments  # noqa: E402  (globals refused: snapshots are data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?",
                        default=os.path.join(HERE, "..", "..", "..", "shared", "snapshots", "real"))
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    files = []
    for name in sorted(os.listdir(args.dir)):
        segments = load_segments(os.path.join(args.dir, name))
        blocks = sum(len(s.get("blocks") or []) for s in segments)
        files.append((blocks, name, segments))
    files.sort(key=lambda f: -f[0])
    for blocks, name, segments in files[:args.top]:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fragscope_agent.summarize_segments(segments)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        print(f"{name}: {len(segments)} segments, {blocks} blocks: {median * 1e3:.2f} ms "
              f"({median / max(blocks, 1) * 1e9:.0f} ns per block)")


if __name__ == "__main__":
    main()
