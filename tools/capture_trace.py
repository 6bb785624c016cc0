#!/usr/bin/python3
"""Capture a real fragscope request trace from a small GPT trained on the CPU.

The tool trains a small GPT-style decoder with torch.optim.Adam on a synthetic
token corpus, with a sequence length that changes from step to step, while
PyTorch's profiler records every allocation and free that goes through c10's
CPU allocator (profile_memory=True).  The allocation records are read
straight from the profiler's result tree (no Kineto needed), flattened in
program order, paired by address, cut into steps with non-allocating marker
ops, and written as a fragscope trace v1 (JSON Lines, ``kind: request``).

Run it with Debian's interpreter, which has python3-torch:

    /usr/bin/python3 tools/capture_trace.py -o trace.jsonl.gz

See docs/capturing-traces.md for what the trace contains and how it differs
from what the CUDA caching allocator sees on a GPU.
"""

import argparse
import bisect
import contextlib
import gc
import gzip
import json
import math
import os
import random
import sys
import tempfile
import time
import types

from workloads import WORKLOADS, make_corpus, make_workload

TOOL_VERSION = "1.0"
PRODUCER = "tools/capture_trace.py"

# Marker ops.  Calling aten::alias on a tensor made before the capture
# starts records an op in the profiler's tree but allocates nothing (an
# alias is a view), so markers cost nothing in the allocation sequence.  The
# tensors' shapes are unusual so that a marker cannot be confused with a real
# aten::alias call of the model; the shape tells which marker it is.
MARKERS = {
    (1, 1, 1, 1, 1, 1, 1, 1, 7): "step",
    (1, 1, 1, 1, 1, 1, 1, 1, 8): "optimizer_begin",
    (1, 1, 1, 1, 1, 1, 1, 1, 9): "optimizer_end",
}
MARKER_SHAPE = {kind: shape for shape, kind in MARKERS.items()}

# Ops that only allocate on behalf of the op that encloses them; the frame of
# an allocation names the nearest enclosing op that is not one of these.
ALLOC_HELPER_OPS = frozenset([
    "aten::empty",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::resize_",
    "aten::zeros",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::full",
    "aten::full_like",
    "aten::new_zeros",
    "aten::clone",
    "aten::contiguous",
    "aten::to",
    "aten::_to_copy",
    "aten::copy_",
    "aten::lift_fresh",
])

# Ops that create tensors from Scalar arguments as their real output.
FACTORY_OPS = frozenset([
    "aten::arange", "aten::scalar_tensor", "aten::full", "aten::linspace",
    "aten::ones", "aten::zeros", "aten::tensor", "aten::randint",
])

AUTOGRAD_PREFIX = "autograd::engine::evaluate_function: "


def log(msg):
    print("capture_trace: " + msg, file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="capture_trace.py",
        description=(
            "Train a small GPT-style decoder on the CPU with torch.optim.Adam "
            "and record every tensor-storage allocation and free it makes, "
            "as a fragscope request trace (trace format v1, JSON Lines). "
            "The sequence length changes every step (drawn from "
            "[--min-seq-len, --max-seq-len] with --seed), the batch size is "
            "fixed. Run with /usr/bin/python3 (Debian's python3-torch)."),
        epilog=(
            "Example: /usr/bin/python3 tools/capture_trace.py --steps 50 "
            "-o tests/data/sample/gpt_tiny_50steps.jsonl.gz"),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(
        "-o", "--output", required=True, metavar="PATH",
        default=argparse.SUPPRESS,
        help="trace file to write; gzip-compressed if PATH ends in .gz")
    train = parser.add_argument_group("training run")
    train.add_argument("--workload", choices=WORKLOADS, default="gpt",
                       help="the program to run (tools/workloads.py): gpt "
                            "decoder, cnn classifier, moe decoder with "
                            "routed experts, kv-server inference with "
                            "growing key/value caches, detect dense "
                            "prediction on variable image sizes")
    train.add_argument("--steps", type=int, default=50,
                       help="number of training steps to capture")
    train.add_argument("--seed", type=int, default=0,
                       help="seed for weights, data and sequence lengths")
    train.add_argument("--batch-size", type=int, default=8,
                       help="sequences per batch (fixed for all steps)")
    train.add_argument("--min-seq-len", type=int, default=32,
                       help="shortest sequence length drawn for a step")
    train.add_argument("--max-seq-len", type=int, default=256,
                       help="longest sequence length drawn for a step; also "
                            "the model's context size (positional table)")
    train.add_argument("--lr", type=float, default=3e-4,
                       help="Adam learning rate")
    train.add_argument("--foreach", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="use Adam's multi-tensor (foreach) "
                            "implementation, the default on CUDA in recent "
                            "PyTorch")
    other = parser.add_argument_group(
        "other workloads (cnn, moe, kv-server, detect)")
    other.add_argument("--min-batch", type=int, default=32,
                       help="cnn: smallest batch drawn for a step")
    other.add_argument("--max-batch", type=int, default=32,
                       help="cnn: largest batch drawn for a step (equal to "
                            "--min-batch: a fixed batch)")
    other.add_argument("--image-size", type=int, default=32,
                       help="cnn: input images are 3 x SIZE x SIZE")
    other.add_argument("--min-image", type=int, default=64,
                       help="detect: smallest image side (rounded up to a "
                            "multiple of 32 by the draw)")
    other.add_argument("--max-image", type=int, default=192,
                       help="detect: largest image side")
    other.add_argument("--cnn-width", type=int, default=16,
                       help="cnn: channels of the stem (doubled per stage)")
    other.add_argument("--n-experts", type=int, default=8,
                       help="moe: experts per layer (top-1 routing)")
    other.add_argument("--arrival-rate", type=float, default=0.5,
                       help="kv-server: mean requests arriving per step")
    other.add_argument("--max-arrivals", type=int, default=4,
                       help="kv-server: most requests arriving in one step")
    model = parser.add_argument_group("model")
    model.add_argument("--vocab-size", type=int, default=4096,
                       help="vocabulary size (LM head width)")
    model.add_argument("--n-layer", type=int, default=6,
                       help="number of transformer blocks")
    model.add_argument("--n-head", type=int, default=8,
                       help="attention heads per block")
    model.add_argument("--d-model", type=int, default=256,
                       help="embedding width")
    model.add_argument("--mlp-ratio", type=int, default=4,
                       help="MLP hidden width as a multiple of --d-model")
    model.add_argument("--tie-weights", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="tie the LM head weight to the token embedding "
                            "(GPT-2 style)")
    meta = parser.add_argument_group("trace metadata")
    meta.add_argument("--model-name", default="gpt-tiny",
                      help="labels.model in the trace header")
    meta.add_argument("--run", default=argparse.SUPPRESS,
                      help="labels.run in the trace header (default: "
                           "cpu-capture-<steps>steps-seed<seed>)")
    meta.add_argument("--no-frames", action="store_true",
                      help="do not attach the enclosing op as a call-site "
                           "frame to each alloc")
    meta.add_argument("--keep-cpu-only", action="store_true",
                      help="keep allocations that a GPU run would make on "
                           "the CPU (wrapped Python/Scalar numbers, their "
                           "dtype-promotion copies, Adam's step counters); "
                           "by default they are dropped")
    meta.add_argument("--threads", type=int, default=1,
                      help="intra-op threads; more than 1 makes some CPU "
                           "kernels add per-thread buffers")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if not 1 <= args.min_seq_len <= args.max_seq_len:
        parser.error("need 1 <= --min-seq-len <= --max-seq-len")
    if args.d_model % args.n_head:
        parser.error("--d-model must be divisible by --n-head")
    if not 1 <= args.min_batch <= args.max_batch:
        parser.error("need 1 <= --min-batch <= --max-batch")
    if args.image_size < 16 or args.cnn_width < 1 or args.n_experts < 1:
        parser.error("--image-size must be at least 16, --cnn-width and "
                     "--n-experts at least 1")
    if not 32 <= args.min_image <= args.max_image:
        parser.error("need 32 <= --min-image <= --max-image")
    args.min_image = -(-args.min_image // 32) * 32
    if args.min_image > args.max_image:
        parser.error("--min-image..--max-image holds no multiple of 32")
    if not 0 <= args.arrival_rate <= args.max_arrivals:
        parser.error("need 0 <= --arrival-rate <= --max-arrivals")
    if args.workload == "kv-server" and args.max_seq_len < 2:
        parser.error("kv-server needs --max-seq-len of at least 2")
    if args.batch_size < 1 or args.vocab_size < 2 or args.n_layer < 1:
        parser.error("--batch-size, --vocab-size and --n-layer must be "
                     "positive (vocab at least 2)")
    if getattr(args, "run", None) is None:
        args.run = "cpu-capture-{}steps-seed{}".format(args.steps, args.seed)
    return args


def build_model_classes(torch):
    """Define the GPT modules (kept inside a function: torch is imported late
    so that --help works without it).  Returns a namespace with GPT and the
    CausalSelfAttention other workloads reuse."""
    nn = torch.nn
    F = torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self, d_model, n_head, max_len):
            super().__init__()
            self.n_head = n_head
            self.c_attn = nn.Linear(d_model, 3 * d_model)
            self.c_proj = nn.Linear(d_model, d_model)
            # nanoGPT-style causal mask buffer (the non-flash path).
            self.register_buffer(
                "mask",
                torch.tril(torch.ones(max_len, max_len))
                .view(1, 1, max_len, max_len))

        def forward(self, x):
            b, t, c = x.size()
            hs = c // self.n_head
            q, k, v = self.c_attn(x).split(c, dim=2)
            q = q.view(b, t, self.n_head, hs).transpose(1, 2)
            k = k.view(b, t, self.n_head, hs).transpose(1, 2)
            v = v.view(b, t, self.n_head, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(self.mask[:, :, :t, :t] == 0,
                                  float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
            y = y.transpose(1, 2).contiguous().view(b, t, c)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self, d_model, ratio):
            super().__init__()
            self.c_fc = nn.Linear(d_model, ratio * d_model)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(ratio * d_model, d_model)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, d_model, n_head, ratio, max_len):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d_model)
            self.attn = CausalSelfAttention(d_model, n_head, max_len)
            self.ln_2 = nn.LayerNorm(d_model)
            self.mlp = MLP(d_model, ratio)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class GPT(nn.Module):
        def __init__(self, vocab_size, max_len, n_layer, n_head, d_model,
                     ratio, tie_weights):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, d_model)
            self.wpe = nn.Embedding(max_len, d_model)
            self.h = nn.ModuleList(
                [Block(d_model, n_head, ratio, max_len)
                 for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(d_model)
            self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
            if tie_weights:
                self.lm_head.weight = self.wte.weight
            self.apply(self._init_weights)

        @staticmethod
        def _init_weights(module):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)),
                                   targets.view(-1))
            return logits, loss

    return types.SimpleNamespace(GPT=GPT,
                                 CausalSelfAttention=CausalSelfAttention)


class _NoOpRecordFunction:
    """Stand-in for torch.autograd.profiler.record_function, which in 1.13
    allocates two small tensors per use (Optimizer.step and zero_grad use
    it)."""

    def __init__(self, name, args=None):
        self.name = name

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def no_record_function(torch):
    saved = torch.autograd.profiler.record_function
    torch.autograd.profiler.record_function = _NoOpRecordFunction
    try:
        yield
    finally:
        torch.autograd.profiler.record_function = saved


def move_to_device(model):
    """Mimic model.cuda(): Module._apply in the same order, one new storage
    per distinct parameter/buffer (a tied weight moves once)."""
    moved = set()

    def fn(t):
        if id(t) in moved:
            return t
        moved.add(id(t))
        return t.clone()

    return model._apply(fn)


def run_capture(args):
    """Run the workload under the profiler.  Returns (profiler result, step
    boundary times in ns, capture start in ns, [(description, figure)] per
    step, wall seconds, parameter count, architecture label)."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    # Host-side setup, outside the capture (like building a model and
    # loading data on the host before moving to the GPU).
    workload = make_workload(torch, args, build_model_classes(torch))
    n_params = sum(p.numel() for p in workload.model.parameters())
    markers = {kind: torch.zeros(shape)
               for kind, shape in MARKER_SHAPE.items()}
    gc.collect()

    def optimizer_step(optimizer):
        torch.ops.aten.alias(markers["optimizer_begin"])
        optimizer.step()
        torch.ops.aten.alias(markers["optimizer_end"])

    prof = torch.autograd.profiler.profile(profile_memory=True,
                                           record_shapes=True)
    boundaries = []
    steps = []
    wall0 = time.perf_counter()
    start_ns = time.time_ns()
    prof.__enter__()  # prepare + enable; __exit__ is NOT used (see below)
    try:
        with no_record_function(torch):
            workload.start(move_to_device(workload.model))
            for step in range(args.steps):
                boundaries.append(time.time_ns())
                torch.ops.aten.alias(markers["step"])  # no allocation
                what, figure = workload.step(step, optimizer_step)
                steps.append((what, figure))
                log("step {:3d}  {}  {} {:.4f}".format(
                    step, what,
                    "loss" if workload.architecture != "kv-server"
                    else "cached tokens", figure))
            # Teardown: free everything the run allocated, so that allocs
            # get their frees.
            workload.teardown()
            gc.collect()
    finally:
        # torch.autograd.profiler.profile.__exit__ would parse every record
        # on the Python side (slow, memory hungry); take the raw result.
        result = torch.autograd._disable_profiler()
    wall = time.perf_counter() - wall0
    return (result, boundaries, start_ns, steps, wall, n_params,
            workload.architecture)


def _input_info(node):
    """(shapes, dtypes) recorded for an op node (record_shapes=True)."""
    inputs = getattr(node.extra_fields, "inputs", None)
    if inputs is None:
        return [], []
    return list(inputs.shapes), list(inputs.dtypes)


def cpu_only_kind(size, ancestors, in_optimizer):
    """Classify an allocation that would not reach the CUDA caching
    allocator in a GPU run of the same program, or return None.

    * python_scalar: a Python number wrapped into a 0-dim tensor by the
      Python argument parser (no enclosing op), e.g. ``att * 0.125``.
    * op_scalar: a Scalar argument wrapped into a 0-dim tensor inside an op,
      e.g. ``exp_avg.mul_(beta1)`` inside ``_foreach_mul_``.
    * scalar_promotion: the dtype-promotion copy (``aten::to``) of such a
      0-dim wrapped scalar, made inside a binary op.
    * adam_step_counter: Adam's per-parameter ``state['step'] =
      torch.tensor(0.)`` (a CPU tensor on a GPU run too, unless
      capturable/fused).
    On a GPU all of these are CPU tensors (CUDA kernels take CPU scalars by
    value)."""
    if size > 16:
        return None
    if not ancestors:
        return "python_scalar"
    names = [a.name for a in ancestors]
    parent = ancestors[-1]
    if (in_optimizer and len(ancestors) == 1 and names[0] == "aten::empty"):
        return "adam_step_counter"
    if size in (1, 8, 16) and parent.name not in ALLOC_HELPER_OPS \
            and parent.name not in FACTORY_OPS:
        shapes, dtypes = _input_info(parent)
        if any(d == "Scalar" and not list(sh)
               for sh, d in zip(shapes, dtypes)):
            return "op_scalar"
    for i in range(1, len(names)):
        if names[i] == "aten::to" and names[i - 1] not in ALLOC_HELPER_OPS:
            shapes, _ = _input_info(ancestors[i])
            if shapes and not list(shapes[0]):
                return "scalar_promotion"
    return None


def flatten(result, keep_cpu_only):
    """Walk the profiler's event tree depth-first (program order on one
    thread).  Returns (records, notes).  A record is ("mark", ts_ns, kind)
    or ("mem", ts_ns, ptr, alloc_size, frame_name, cpu_only_kind)."""
    roots = result.experimental_event_tree()
    out = []
    rf_nodes = 0
    in_optimizer = False
    stack = [(node, ()) for node in reversed(roots)]
    while stack:
        node, ancestors = stack.pop()
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            size = fields.alloc_size
            kind = None
            if size > 0 and not keep_cpu_only:
                kind = cpu_only_kind(size, ancestors, in_optimizer)
            out.append(("mem", node.start_time_ns, fields.ptr, size,
                        frame_name([a.name for a in ancestors]), kind))
            continue
        name = node.name
        if name == "aten::alias" and not ancestors:
            shapes, _ = _input_info(node)
            mark = MARKERS.get(tuple(shapes[0])) if shapes else None
            if mark is not None:
                if mark == "step":
                    out.append(("mark", node.start_time_ns, mark))
                in_optimizer = mark == "optimizer_begin"
                continue
        if name.startswith("Optimizer.") or "record_function" in name:
            rf_nodes += 1
        children = node.children
        if children:
            path = ancestors + (node,)
            for child in reversed(children):
                stack.append((child, path))
    return out, rf_nodes


def frame_name(names):
    """Call-site of an allocation, from the names of its enclosing ops
    (outermost first): the outermost op -- the call made by Python code or
    the autograd node being run -- and the nearest enclosing op that is not
    a pure allocation helper, as "outer/nearest" when they differ, e.g.
    "aten::linear/aten::addmm", "AddmmBackward0/aten::mm"."""
    if not names:
        return "<python>"
    root = names[0]
    if root.startswith(AUTOGRAD_PREFIX):
        root = root[len(AUTOGRAD_PREFIX):]
        names = [root] + list(names[2:] if len(names) > 1
                              and names[1] == root else names[1:])
        if root.startswith("torch::autograd::"):
            root = root[len("torch::autograd::"):]
            names[0] = root
    nearest = None
    for name in reversed(names):
        if name not in ALLOC_HELPER_OPS:
            nearest = name
            break
    if nearest is None or nearest == root:
        return root
    return root + "/" + nearest


def build_events(records, boundaries, start_ns, use_frames):
    """Pair frees with allocs and produce the trace event dicts."""
    stats = {
        "alloc": 0, "free": 0, "steps": 0,
        "dropped_unmatched_free": 0, "dropped_zero_size": 0,
        "alloc_over_live_addr": 0, "free_size_mismatch": 0,
        "time_clamped": 0, "step_ts_disagree": 0,
        "live_at_end": 0, "live_at_end_bytes": 0,
        "peak_live_bytes": 0, "cpu_only_dropped": {},
        "cpu_only_freed": 0, "cpu_only_live_at_end": 0,
    }
    first_ts = min([r[1] for r in records] + [start_ns])
    t0 = min(start_ns, first_ts)
    live = {}      # ptr -> (addr id, size)
    dropped_live = set()   # ptrs of live allocations dropped as CPU-only
    next_id = 1
    frames = {}
    events = []
    live_bytes = 0
    last_us = 0
    step = -1
    bi = 0         # boundary index for the timestamp cross-check
    for rec in records:
        ts = rec[1]
        us = (ts - t0) // 1000
        if us < last_us:
            stats["time_clamped"] += 1
            us = last_us
        last_us = us
        if rec[0] == "mark":
            step += 1
            events.append({"action": "step", "step": step})
            stats["steps"] += 1
            continue
        # Timestamp cross-check: the step this record falls in according to
        # the time.time_ns() boundaries must equal the marker-based step.
        while bi < len(boundaries) and boundaries[bi] <= ts:
            bi += 1
        if bi - 1 != step:
            stats["step_ts_disagree"] += 1
        _, _, ptr, size, fname, cpu_only = rec
        if size > 0 and cpu_only is not None:
            counts = stats["cpu_only_dropped"]
            counts[cpu_only] = counts.get(cpu_only, 0) + 1
            if ptr in live or ptr in dropped_live:
                stats["alloc_over_live_addr"] += 1
                if ptr in live:
                    live_bytes -= live.pop(ptr)[1]
            dropped_live.add(ptr)
            continue
        if size < 0 and ptr in dropped_live:
            dropped_live.discard(ptr)
            stats["cpu_only_freed"] += 1
            continue
        if size > 0:
            if ptr in dropped_live:
                stats["alloc_over_live_addr"] += 1
                dropped_live.discard(ptr)
            if ptr in live:
                # A free was missed: the old block can no longer be paired.
                stats["alloc_over_live_addr"] += 1
                live_bytes -= live.pop(ptr)[1]
            ev = {"action": "alloc", "addr": next_id, "size": size,
                  "time_us": us}
            if use_frames:
                fid = frames.get(fname)
                if fid is None:
                    fid = len(frames)
                    frames[fname] = fid
                    events.append({"action": "frame", "id": fid,
                                   "name": fname})
                ev["frame"] = fid
            events.append(ev)
            live[ptr] = (next_id, size)
            next_id += 1
            live_bytes += size
            stats["alloc"] += 1
            if live_bytes > stats["peak_live_bytes"]:
                stats["peak_live_bytes"] = live_bytes
        elif size < 0:
            entry = live.pop(ptr, None)
            if entry is None:
                stats["dropped_unmatched_free"] += 1
                continue
            addr, asize = entry
            if -size != asize:
                stats["free_size_mismatch"] += 1
            events.append({"action": "free_requested", "addr": addr,
                           "size": asize, "time_us": us})
            live_bytes -= asize
            stats["free"] += 1
        else:
            stats["dropped_zero_size"] += 1
    stats["live_at_end"] = len(live)
    stats["live_at_end_bytes"] = live_bytes
    stats["frames"] = len(frames)
    stats["cpu_only_live_at_end"] = len(dropped_live)
    return events, stats


def clock_margin(records, boundaries):
    """Check that time.time_ns() and the profiler's timestamps use the same
    clock.  Returns the smallest distance between a step boundary (taken
    with time.time_ns() just before the marker op) and the allocation
    records just before and just after it, and the smallest and largest lag
    from a boundary to the profiler timestamp of its marker op."""
    ts = sorted(r[1] for r in records if r[0] == "mem")
    before = after = None
    for b in boundaries:
        i = bisect.bisect_left(ts, b)
        if i > 0:
            d = b - ts[i - 1]
            before = d if before is None else min(before, d)
        if i < len(ts):
            d = ts[i] - b
            after = d if after is None else min(after, d)
    marks = [r[1] for r in records if r[0] == "mark"]
    lags = [m - b for m, b in zip(marks, boundaries)]
    if before is None or after is None or not lags:
        return None
    return before, after, min(lags), max(lags)


def header(args, torch_version, architecture="gpt"):
    workload = ""
    if args.workload != "gpt":
        workload = (
            "workload={}, batch={}..{}, image={}, images={}..{}, "
            "cnn_width={}, experts={}, "
            "arrival_rate={}, max_arrivals={}, ").format(
                args.workload, args.min_batch, args.max_batch,
                args.image_size, args.min_image, args.max_image,
                args.cnn_width, args.n_experts,
                args.arrival_rate, args.max_arrivals)
    producer = (
        "{} {} (torch {}, {}steps={}, seed={}, batch={}, seq={}..{}, "
        "vocab={}, layers={}, heads={}, d_model={}, mlp_ratio={}, "
        "tied={}, adam_foreach={}, lr={}, threads={}, cpu_only={})").format(
            PRODUCER, TOOL_VERSION, torch_version, workload, args.steps,
            args.seed,
            args.batch_size, args.min_seq_len, args.max_seq_len,
            args.vocab_size, args.n_layer, args.n_head, args.d_model,
            args.mlp_ratio, args.tie_weights, args.foreach, args.lr,
            args.threads, "kept" if args.keep_cpu_only else "dropped")
    return {
        "format": "fragscope-trace",
        "version": 1,
        "kind": "request",
        "producer": producer,
        "devices": [{"device": 0, "name": "cpu-virtual-gpu"}],
        "labels": {"model": args.model_name, "architecture": architecture,
                   "run": args.run, "dtype": "float32"},
        "allocator_settings": {},
    }


def write_trace(path, head, events):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    # A new temporary next to the output (mkstemp: O_EXCL, a random dot name), renamed into
    # place: never a fixed PATH.tmp where a planted link would be written through (issue 24
    # item 4, docs/user-guide.md "Files and links").
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    os.fchmod(fd, 0o644)
    raw = os.fdopen(fd, "wb")
    try:
        if path.endswith(".gz"):
            # mtime=0 keeps the gzip bytes reproducible for identical content.
            text = _TextWriter(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0))
        else:
            text = _TextWriter(raw)
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        text.write(dumps(head) + "\n")
        for ev in events:
            text.write(dumps(ev) + "\n")
        text.close()
        raw.close()
        os.replace(tmp, path)
    except BaseException:
        raw.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class _TextWriter:
    def __init__(self, binary):
        self._b = binary

    def write(self, s):
        self._b.write(s.encode("utf-8"))

    def close(self):
        self._b.close()


def main(argv=None):
    args = parse_args(argv)
    import torch

    log("torch {}; kineto available: {}".format(
        torch.__version__, torch.autograd.kineto_available()))
    (result, boundaries, start_ns, steps, wall, n_params,
     architecture) = run_capture(args)
    log("captured {} steps in {:.1f} s ({} parameters)".format(
        len(steps), wall, n_params))
    records, rf_nodes = flatten(result, args.keep_cpu_only)
    del result
    ts = [r[1] for r in records]
    out_of_order = sum(1 for a, b in zip(ts, ts[1:]) if b < a)
    margin = clock_margin(records, boundaries)
    events, stats = build_events(records, boundaries, start_ns,
                                 not args.no_frames)
    write_trace(args.output,
                header(args, torch.__version__, architecture), events)

    log("wrote {} ({} bytes)".format(args.output,
                                     os.path.getsize(args.output)))
    log("events: {alloc} alloc, {free} free_requested, {steps} steps, "
        "{frames} frames; peak live {peak_live_bytes} bytes".format(**stats))
    log("dropped: {} unmatched frees, {} zero-size records".format(
        stats["dropped_unmatched_free"], stats["dropped_zero_size"]))
    log("unpaired: {} allocs still live at end ({} bytes); {} allocs over a "
        "live address; {} free size mismatches".format(
            stats["live_at_end"], stats["live_at_end_bytes"],
            stats["alloc_over_live_addr"], stats["free_size_mismatch"]))
    log("checks: {} records out of time order, {} clamped times, {} records "
        "whose time-based step differs from the marker step, {} "
        "record_function nodes".format(
            out_of_order, stats["time_clamped"], stats["step_ts_disagree"],
            rf_nodes))
    if margin is not None:
        log("clock check: the closest allocation record lies {} ns before "
            "/ {} ns after a time.time_ns() step boundary; the marker op "
            "follows its boundary by {}..{} ns".format(*margin))
    dropped = stats["cpu_only_dropped"]
    log("CPU-only allocations dropped: {} ({}); their frees dropped: {}, "
        "still live at end: {}".format(
            sum(dropped.values()),
            ", ".join("{} {}".format(v, k) for k, v in sorted(dropped.items()))
            or "none", stats["cpu_only_freed"],
            stats["cpu_only_live_at_end"]))
    if stats["steps"] != args.steps:
        log("ERROR: found {} step markers, expected {}".format(
            stats["steps"], args.steps))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
