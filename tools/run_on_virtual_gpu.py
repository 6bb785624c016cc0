#!/usr/bin/python3
"""Run a workload of tools/workloads.py live on a virtual GPU (fragscope.torch).

The program is exactly the one tools/capture_trace.py captures (same flags, seeds, host-side
setup, move to the device, steps and teardown), but instead of recording a trace under the
profiler it runs with a virtual GPU active, so the caching-allocator model sees every
allocation as it happens.  It prints (or writes with --json) what the virtual GPU reported:
memory_stats(), memory_snapshot() and the OOM (taken at the failed request).  The same run
captured with capture_trace.py and replayed with `fragscope replay` gives the same figures
(tests/python/test_agreement.py; docs/virtual-gpu.md, "Agreement with the offline path").

    PYTHONPATH=python /usr/bin/python3 tools/run_on_virtual_gpu.py --capacity 1GiB \\
        --workload cnn --steps 3 --json out.json

Options not listed below are capture_trace.py's workload options (--workload, --steps,
--seed, --batch-size, ...); see `tools/capture_trace.py --help`.
"""
import argparse
import gc
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))

import capture_trace  # noqa: E402
from workloads import make_workload  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="run_on_virtual_gpu.py", description=__doc__.split("\n\n")[0],
        epilog="Other options are tools/capture_trace.py's workload options.")
    parser.add_argument("--capacity", required=True, help="virtual GPU memory, e.g. 1GiB")
    parser.add_argument("--alloc-conf", default="", help="PYTORCH_CUDA_ALLOC_CONF to model")
    parser.add_argument("--torch-version", default=None, choices=("1.13", "2", "newest"))
    parser.add_argument("--on-oom", default="raise", choices=("raise", "record"))
    parser.add_argument("--json", metavar="PATH", help="write the figures here as JSON")
    parser.add_argument("--trace", metavar="PATH", help="also write the live request trace")
    parser.add_argument("--snapshot", metavar="PATH", help="also write a snapshot pickle")
    parser.add_argument("--no-record-function", action="store_true",
                        help="replace record_function by a no-op, as capture_trace.py does "
                             "(by default the program runs as is)")
    args, rest = parser.parse_known_args(argv)
    workload_args = capture_trace.parse_args(rest + ["-o", os.devnull])
    return args, workload_args


def run(args, wargs):
    import torch
    import fragscope.torch as fst

    torch.set_num_threads(wargs.threads)
    torch.manual_seed(wargs.seed)
    random.seed(wargs.seed)
    workload = make_workload(torch, wargs, capture_trace.build_model_classes(torch))
    gc.collect()

    def optimizer_step(optimizer):
        optimizer.step()

    gpu = fst.virtual_gpu(args.capacity, alloc_conf=args.alloc_conf,
                          torch_version=args.torch_version, on_oom=args.on_oom)
    oom_step = None
    t0 = time.perf_counter()
    steps_done = 0
    with gpu:
        ctx = (capture_trace.no_record_function(torch) if args.no_record_function
               else _nullcontext())
        try:
            with ctx:
                workload.start(capture_trace.move_to_device(workload.model))
                for step in range(wargs.steps):
                    gpu.step(step)
                    workload.step(step, optimizer_step)
                    steps_done += 1
                workload.teardown()
                gc.collect()
        except fst.OutOfMemoryError as e:
            oom_step = steps_done
            print("run_on_virtual_gpu: OOM in step {}: {}".format(oom_step, e),
                  file=sys.stderr)
    wall = time.perf_counter() - t0
    ooms = gpu.ooms()
    if ooms:
        # The figures at the failed request (what the job dies with).
        stats, segments = ooms[0]["memory_stats"], ooms[0]["segments"]
    else:
        stats, segments = gpu.memory_stats(), gpu.memory_snapshot()
    if args.trace:
        gpu.dump_trace(args.trace)
    if args.snapshot:
        gpu.dump_snapshot(args.snapshot)
    return {
        "capacity_bytes": gpu.capacity, "alloc_conf": gpu.alloc_conf,
        "torch_version": gpu.torch_version, "steps_done": steps_done,
        "wall_seconds": wall, "memory_stats": stats, "segments": segments,
        "ooms": [{k: v for k, v in o.items() if k not in ("memory_stats", "segments")}
                 for o in ooms],
        "counters": gpu.counters(),
    }


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None):
    args, wargs = parse_args(argv)
    try:
        result = run(args, wargs)
    except (ImportError, ValueError) as e:
        print("run_on_virtual_gpu: {}".format(e), file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    s = result["memory_stats"]
    print("run_on_virtual_gpu: {} steps in {:.1f} s; reserved peak {}, allocated peak {}, "
          "OOMs {}; hook: {}".format(result["steps_done"], result["wall_seconds"],
                                     s["reserved_bytes.all.peak"],
                                     s["allocated_bytes.all.peak"], s["num_ooms"],
                                     result["counters"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
