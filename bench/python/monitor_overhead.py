"""What fragscope.torch.Monitor costs a training loop (docs/benchmarks.md, "Live monitor").

Measures, on this machine:
  * step() between samples (the cost every step pays), ns per call;
  * one sample on a virtual GPU running the bundled GPT (tools/workloads.py): reading
    memory_stats/mem_get_info/memory_snapshot, summarizing the blocks, the bound forecaster;
  * the agreement collective: one all_reduce(MAX) of 2 x world int32 over gloo, 2 processes;
  * the share of the GPT's step time at every=50;
  * summarize_segments on snapshots of 10k and 100k blocks (the Python part of a sample that
    grows with the block count; on a real GPU, memory_snapshot() itself adds its own walk,
    which this machine cannot measure).

    /usr/bin/python3 bench/python/monitor_overhead.py [--steps 40] [--json out.json]
"""
import argparse
import json
import os
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tools")]


def bench_fast_path(mon):
    m = mon.Monitor(every=50, run_dir=tempfile.mkdtemp(), socket="/nonexistent",
                    request_signal=None)
    m._next = 50
    n = 2_000_000
    best = min(timeit.repeat(lambda: m.step(1), number=n, repeat=5)) / n
    empty = min(timeit.repeat(lambda: None, number=n, repeat=5)) / n
    return {"step_call_ns": best * 1e9, "empty_lambda_call_ns": empty * 1e9}


def bench_gpt(mon, steps):
    import torch
    import capture_trace
    import fragscope.torch as fst
    from workloads import make_workload
    torch.set_num_threads(1)
    wargs = capture_trace.parse_args(["--workload", "gpt", "--steps", str(steps), "-o",
                                      os.devnull])
    workload = make_workload(torch, wargs, capture_trace.build_model_classes(torch))
    gpu = fst.virtual_gpu("80GiB").start()
    try:
        workload.start(capture_trace.move_to_device(workload.model))
        m = mon.Monitor(every=1, run_dir=tempfile.mkdtemp(), socket="/nonexistent",
                        request_signal=None, action="stop")
        step_s, sample_s = [], []
        for step in range(steps):
            gpu.step(step)
            t0 = time.perf_counter()
            workload.step(step, lambda opt: opt.step())
            t1 = time.perf_counter()
            m.step(step)
            t2 = time.perf_counter()
            if step >= 3:  # warm-up
                step_s.append(t1 - t0)
                sample_s.append(t2 - t1)
        blocks = sum(len(s["blocks"]) for s in gpu.memory_snapshot())
        workload.teardown()
    finally:
        gpu.stop()
    step_s.sort()
    sample_s.sort()
    med_step = step_s[len(step_s) // 2]
    med_sample = sample_s[len(sample_s) // 2]
    return {"gpt_step_ms_median": med_step * 1e3, "sample_ms_median": med_sample * 1e3,
            "gpt_blocks": blocks, "steps_timed": len(step_s),
            "share_at_every_50_percent": 100 * (med_sample / 50) / med_step}


def bench_summarize(blocks_list):
    from fragscope_agent import summarize_segments
    out = {}
    for n in blocks_list:
        segs = []
        per = 100
        for s in range(n // per):
            segs.append({"device": 0, "segment_type": "large", "total_size": per * (4 << 20),
                         "blocks": [{"size": 4 << 20, "requested_size": 4 << 20,
                                     "state": "active_allocated" if i % 3 else "inactive"}
                                    for i in range(per)]})
        t = min(timeit.repeat(lambda: summarize_segments(segs, device=0,
                                                         device_free_bytes=1 << 30),
                              number=3, repeat=3)) / 3
        out["summarize_{}_blocks_ms".format(n)] = t * 1e3
    return out


COLLECTIVE = r"""
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
w, r = dist.get_world_size(), dist.get_rank()
t = torch.zeros(2 * w, dtype=torch.int32)
for _ in range(50):
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
dist.barrier()
n = 2000
t0 = time.perf_counter()
for _ in range(n):
    t[r] = 1
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    t.tolist()
dt = (time.perf_counter() - t0) / n
if r == 0:
    print(dt * 1e6)
dist.destroy_process_group()
"""


def bench_collective():
    import subprocess
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(COLLECTIVE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--redirects", "2",
                          "--tee", "2", "--log_dir", tempfile.mkdtemp(), "--nproc_per_node",
                          "2", "--master_port", str(29700 + os.getpid() % 200), f.name],
                         env=env, capture_output=True, text=True, timeout=300)
    os.unlink(f.name)
    lines = [x for x in out.stdout.split() if x.replace(".", "", 1).isdigit()]
    return {"all_reduce_2_ranks_gloo_us": float(lines[-1]) if lines else None}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--json")
    args = p.parse_args()
    from fragscope.torch import monitor as mon
    result = {}
    result.update(bench_fast_path(mon))
    result.update(bench_gpt(mon, args.steps))
    result.update(bench_summarize([10_000, 100_000]))
    result.update(bench_collective())
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
