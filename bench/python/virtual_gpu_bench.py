#!/usr/bin/python3
"""What the virtual GPU (fragscope.torch) costs: docs/benchmarks.md, "Virtual GPU".

1. Per allocation: a Python loop of torch.empty(n) + del (one allocation and one free each),
   without a virtual GPU and with one (record_trace on and off); the difference per pair.
2. Step time of the bundled GPT (tools/capture_trace.py's default model, fixed sequence length
   so that steps are comparable), plain and virtual-GPU steps interleaved (each virtual-GPU
   step in a session of its own, with the CPU-only rules on); wall and CPU time (the machine
   may be shared: CPU time and the minimum are the steadier figures).
   Also per op that allocates nothing: the scope-tracking callback's cost.
3. Memory: malloc's bytes in use (mallinfo2) for N live one-element tensors with and without
   the virtual GPU (the hook's cost per live block), and the growth per alloc/free pair of the
   recorded trace (record_trace=True).

Run with the release build's module (the dev build checks the model's invariants after every
event):
    cmake --preset release && cmake --build --preset release --target fragscope_core fragscope_torch_hook
    PYTHONPATH=python:tools \\
        /usr/bin/python3 bench/python/virtual_gpu_bench.py
"""
import argparse
import ctypes
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tools")]

import torch  # noqa: E402

import fragscope.torch as fst  # noqa: E402


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _Mallinfo2


def malloc_in_use():
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def alloc_loop(n_pairs, numel):
    t0 = time.perf_counter()
    for _ in range(n_pairs):
        t = torch.empty(numel)
        del t
    return time.perf_counter() - t0


def op_loop(n_ops, x):
    alias = torch.ops.aten.alias
    t0 = time.perf_counter()
    for _ in range(n_ops):
        alias(x)
    return time.perf_counter() - t0


def per_op(n_ops, repeats):
    """Ops that allocate nothing still pay for the scope-tracking RecordFunction callback."""
    x = torch.ones(4)
    plain = min(op_loop(n_ops, x) for _ in range(repeats))
    with fst.virtual_gpu("80GiB"):
        hooked = min(op_loop(n_ops, x) for _ in range(repeats))
    print("per op that allocates nothing (aten::alias, {} calls, best of {}): plain {:.0f} ns, "
          "virtual GPU {:.0f} ns, overhead {:+.0f} ns".format(
              n_ops, repeats, plain / n_ops * 1e9, hooked / n_ops * 1e9,
              (hooked - plain) / n_ops * 1e9))


def per_allocation(n_pairs, repeats):
    rows = []
    for label, make in (("plain", None),
                        ("virtual GPU, record_trace=False",
                         lambda: fst.virtual_gpu("80GiB", record_trace=False)),
                        ("virtual GPU, record_trace=True",
                         lambda: fst.virtual_gpu("80GiB", record_trace=True))):
        times = []
        for _ in range(repeats):
            if make is None:
                times.append(alloc_loop(n_pairs, 256))
            else:
                with make():
                    times.append(alloc_loop(n_pairs, 256))
        rows.append((label, min(times) / n_pairs * 1e9))
    base = rows[0][1]
    print("per alloc+free pair (torch.empty(256) + del, {} pairs, best of {}):".format(
        n_pairs, repeats))
    for label, ns in rows:
        print("  {:34s} {:8.0f} ns   overhead {:+6.0f} ns".format(label, ns, ns - base))


def gpt_steps(rounds, steps_per_round, seq_len, keep_cpu_only=False):
    import capture_trace
    from workloads import make_workload
    args = capture_trace.parse_args(["-o", os.devnull, "--steps",
                                     str(rounds * steps_per_round * 2 + 2),
                                     "--min-seq-len", str(seq_len),
                                     "--max-seq-len", str(max(seq_len, 256))])
    args.min_seq_len = args.max_seq_len = seq_len
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = make_workload(torch, args, capture_trace.build_model_classes(torch))
    # A fixed length for every step.
    w.plan = [(seq_len, offs[:args.batch_size]) for _, offs in w.plan]
    w.plan = [(t, [o % (len(w.corpus) - t - 1) for o in offs]) for t, offs in w.plan]
    w.start(w.model)

    def opt_step(opt):
        opt.step()

    i = 0
    for _ in range(2):  # warm-up
        w.step(i, opt_step)
        i += 1
    plain, hooked = [], []  # (wall, CPU) seconds per step
    counters = None
    scopes = 0
    for r in range(rounds):
        # Alternate which comes first, so that drifts of a shared machine cancel out.
        for hook in ((False, True) if r % 2 == 0 else (True, False)):
            for _ in range(steps_per_round):
                if hook:
                    with fst.virtual_gpu("80GiB", keep_cpu_only=keep_cpu_only) as gpu:
                        gpu.step()
                        w0, c0 = time.perf_counter(), time.process_time()
                        w.step(i, opt_step)
                        hooked.append((time.perf_counter() - w0, time.process_time() - c0))
                        counters = gpu.counters()
                        scopes = fst.hook().scopes_entered_on_this_thread()
                        # The step's tensors (loss, logits) die in the next step: outside.
                else:
                    w0, c0 = time.perf_counter(), time.process_time()
                    w.step(i, opt_step)
                    plain.append((time.perf_counter() - w0, time.process_time() - c0))
                i += 1
    print("GPT step (bundled model, batch 8, seq {}, 1 thread; {} rounds of {} plain + {} "
          "virtual-GPU steps, order alternating{}):".format(
              seq_len, rounds, steps_per_round, steps_per_round,
              "; keep_cpu_only: no scope tracking" if keep_cpu_only else ""))
    for what, k in (("wall", 0), ("CPU", 1)):
        p = [x[k] for x in plain]
        h = [x[k] for x in hooked]
        print("  {:4s} time: plain median {:7.1f} ms, min {:7.1f} | virtual GPU median {:7.1f} "
              "ms, min {:7.1f} | slowdown: median {:+.2f} %, min {:+.2f} %".format(
                  what, statistics.median(p) * 1e3, min(p) * 1e3, statistics.median(h) * 1e3,
                  min(h) * 1e3, (statistics.median(h) / statistics.median(p) - 1) * 100,
                  (min(h) / min(p) - 1) * 100))
    print("  per step through the hook: {} allocations, {} CPU-only; {} op/autograd scopes "
          "tracked".format(counters["allocs"], sum(counters["cpu_only"].values()), scopes))


def memory(n_live, n_pairs):
    def live_cost(make):
        gc.collect()
        ctx = make() if make else None
        if ctx:
            ctx.start()
        before = malloc_in_use()
        keep = [torch.empty(1) for _ in range(n_live)]
        after = malloc_in_use()
        del keep
        gc.collect()
        if ctx:
            ctx.stop()
        return (after - before) / n_live

    plain = live_cost(None)
    hooked = live_cost(lambda: fst.virtual_gpu("80GiB", record_trace=False))
    print("memory per live block ({} live one-element tensors, malloc bytes in use):".format(
        n_live))
    print("  plain {:.0f} B, virtual GPU {:.0f} B: the hook adds {:.0f} B per live block".format(
        plain, hooked, hooked - plain))
    with fst.virtual_gpu("80GiB", record_trace=True):
        gc.collect()
        before = malloc_in_use()
        alloc_loop(n_pairs, 1)
        after = malloc_in_use()
    print("  record_trace=True: {:.0f} B per alloc/free pair kept ({} pairs)".format(
        (after - before) / n_pairs, n_pairs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps-per-round", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--live", type=int, default=100000)
    parser.add_argument("--keep-cpu-only", action="store_true",
                        help="GPT steps without the CPU-only rules (no RecordFunction callback)")
    args = parser.parse_args()
    print("torch {}, native core {}, hook {}".format(
        torch.__version__, sys.modules["fragscope._core"].__file__, fst.hook().path))
    if args.pairs:
        per_allocation(args.pairs, args.repeats)
        per_op(args.pairs, args.repeats)
        memory(args.live, args.pairs)
    if args.rounds:
        gpt_steps(args.rounds, args.steps_per_round, args.seq_len, args.keep_cpu_only)


if __name__ == "__main__":
    main()
