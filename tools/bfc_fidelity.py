#!/usr/bin/env python3
"""The BFC model against the real TensorFlow BFC allocator (issue 32 item 3).

TensorFlow's CPU allocator is a BFC allocator with a limit when TF_CPU_ALLOCATOR_USE_BFC=true
and TF_CPU_BFC_MEM_LIMIT_IN_MB=<n>. For each recorded sequence below, a child Python (one with
tensorflow) creates and drops uint8 tensors in the recorded order with tf.raw_ops.Empty, with
TF_CPP_VMODULE=bfc_allocator=3 so the allocator logs every AllocateRaw (size and address) and
DeallocateRaw (requested size). Every sequence ends in an out-of-memory error (its own, or a
request larger than the limit), after which TensorFlow logs its chunk map ("InUse at ... of
size ...", "Free  at ..."). From the log this tool writes the exact request trace the allocator
saw (TensorFlow's own small allocations included: the 4-byte shape tensor of each op), replays
it with `fragscope replay --allocator bfc --bfc-conf memory_limit:<n>MiB --json`, and compares:

  * the request that ran out of memory (its index among the allocator's requests);
  * the chunk map at that moment: per region (matched by size; TensorFlow's regions are
    malloc'd, so their addresses differ), each chunk's offset in the region, size and whether
    it is in use.

    tools/bfc_fidelity.py --python PY_WITH_TF --fragscope build/dev/apps/fragscope/fragscope \\
        [--write docs/benchmarks.md] [--only NAME]

A free is matched to the live allocation with the same requested size (the log gives no
address): sequences use distinct sizes, and TensorFlow's own 4-byte tensors are live one at a
time; a free that matches several live allocations is reported as ambiguous (the newest is
taken).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

MiB = 1 << 20

# name -> (limit MiB, description, ops). An op is ("a", key, bytes) or ("f", key). Every
# sequence ends with a request larger than the limit unless it runs out of memory earlier.
SEQUENCES = {
    "growth": (64, "regions doubling from 2 MiB; frees in the middle coalesce",
               [("a", f"t{i}", (i + 1) * 100_003) for i in range(24)]
               + [("f", f"t{i}") for i in range(1, 24, 3)]
               + [("a", f"u{i}", 150_001 + 997 * i) for i in range(8)]),
    "split-rule": (64, "chunks under twice the request are not split; remainders stay free",
                   [("a", "a", 3 * MiB + 17), ("a", "pin1", 1000), ("a", "b", 5 * MiB + 3),
                    ("a", "pin2", 1001), ("f", "a"), ("a", "c", 2 * MiB - 1),
                    ("f", "b"), ("a", "d", 2 * MiB + 5), ("a", "e", 1 * MiB + 7)]),
    "best-fit": (32, "best fit by size, then lowest address, across regions",
                 [("a", f"p{i}", s) for i, s in enumerate(
                     [40_000, 300, 70_000, 301, 40_001, 302, 70_001, 303, 40_002, 304])]
                 + [("f", "p0"), ("f", "p4"), ("f", "p2"), ("f", "p6")]
                 + [("a", "q0", 39_000), ("a", "q1", 39_001), ("a", "q2", 69_000),
                    ("a", "q3", 35_000)]),
    "fragmentation-oom": (16, "a fragmentation OOM: free bytes enough, no chunk large enough",
                          [("a", f"s{i}", 1 * MiB - 1000 + i) for i in range(13)]
                          + [("f", f"s{i}") for i in range(0, 13, 2)]
                          + [("a", "big", 3 * MiB)]),
    "limit-tail": (20, "the last region is what is left under the limit",
                   [("a", "x0", 2 * MiB - 300), ("a", "x1", 3 * MiB), ("a", "x2", 7 * MiB),
                    ("a", "x3", 6 * MiB), ("a", "x4", 1 * MiB)]),
}

CHILD = r"""
import os, sys, json
import tensorflow as tf
ops = json.loads(sys.argv[1])
live = {}
for i, op in enumerate(ops):
    try:
        if op[0] == "a":
            live[op[1]] = tf.raw_ops.Empty(shape=[op[2]], dtype=tf.uint8)
        else:
            del live[op[1]]
    except tf.errors.ResourceExhaustedError:
        print("FRAGSCOPE-OOM", i, file=sys.stderr, flush=True)
        sys.exit(0)
print("FRAGSCOPE-NO-OOM", file=sys.stderr, flush=True)
"""

ALLOC_RE = re.compile(r"\] AllocateRaw \S+\s+(\d+)(?: (0x[0-9a-f]+|0|\(nil\)))?\s*$")
FREE_RE = re.compile(r"\] DeallocateRaw \S+ (\d+)\s*$")
REGION_RE = re.compile(r"\] Next region of size (\d+)")
CHUNK_RE = re.compile(r"\] (InUse|Free ) at ([0-9a-f]+) of size (\d+)")
OOM_RE = re.compile(r"ran out of memory trying to allocate .*\(rounded to (\d+)\)")


def run_tensorflow(python, limit_mib, ops):
    """TensorFlow's log of running `ops` (stderr text)."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true",
               TF_CPU_BFC_MEM_LIMIT_IN_MB=str(limit_mib), TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="bfc_allocator=3", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS="1", TF_NUM_INTEROP_THREADS="1", TF_NUM_INTRAOP_THREADS="1")
    proc = subprocess.run([python, "-c", CHILD, json.dumps(ops)], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"tensorflow run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stderr


def parse_log(log):
    """The allocator's requests as a request trace, the index of the failing request, and the
    chunk map TensorFlow dumped at the failure: [(region size, [(offset, size, in_use)])]."""
    events, live, notes = [], [], []  # live: [id, requested size]
    next_id, pending, oom_index, regions = 1, None, None, []
    started = False  # the allocator's log starts once it was created
    for line in log.splitlines():
        if "Creating new BFCAllocator" in line:
            started = True
        if not started:
            continue
        m = ALLOC_RE.search(line)
        if m and regions == []:
            size = int(m.group(1))
            if m.group(2) is None:  # the request, before its outcome
                pending = size
                continue
            pending = None
            if m.group(2) in ("0", "(nil)"):
                continue  # the failure: counted below at the OOM line
            events.append({"action": "alloc", "addr": next_id, "size": size})
            live.append([next_id, size])
            next_id += 1
            continue
        m = FREE_RE.search(line)
        if m and regions == []:
            size = int(m.group(1))
            matches = [x for x in live if x[1] == size]
            if not matches:
                raise RuntimeError(f"a free of {size} bytes matches no live allocation")
            if len(matches) > 1:
                notes.append(f"ambiguous free of {size} bytes ({len(matches)} live)")
            victim = matches[-1]
            live.remove(victim)
            events.append({"action": "free_requested", "addr": victim[0]})
            continue
        m = OOM_RE.search(line)
        if m and oom_index is None:
            if pending is None:
                raise RuntimeError("an OOM line without a pending request")
            oom_index = len(events)
            events.append({"action": "alloc", "addr": next_id, "size": pending})
            next_id += 1
            continue
        m = REGION_RE.search(line)
        if m and oom_index is not None:
            regions.append([int(m.group(1)), []])
            continue
        m = CHUNK_RE.search(line)
        if m and regions:
            regions[-1][1].append([int(m.group(2), 16), int(m.group(3)), m.group(1) == "InUse"])
    chunk_map = []
    for size, chunks in regions:
        base = chunks[0][0] if chunks else 0
        chunk_map.append((size, [(a - base, s, u) for a, s, u in chunks]))
    return events, oom_index, chunk_map, notes


def run_model(fragscope, events, limit_mib, workdir, name):
    """The model's failing request index and chunk map for the same requests."""
    path = os.path.join(workdir, f"{name}.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"format": "fragscope-trace", "version": 1, "kind": "request",
                            "producer": "tools/bfc_fidelity.py"}) + "\n")
        for e in events:
            f.write(json.dumps(e) + "\n")
    proc = subprocess.run([fragscope, "replay", path, "--allocator", "bfc", "--bfc-conf",
                           f"memory_limit:{limit_mib}MiB,regions:descending", "--json", "--no-map"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"fragscope replay failed: {proc.stderr.strip()}")
    report = json.loads(proc.stdout)
    oom = report["oom"]["event_index"] if report["oom"] else None
    chunk_map = []
    for device in report["devices"]:
        for seg in device["segments"]:
            chunk_map.append((seg["total_size"],
                              [(b["address"] - seg["address"], b["size"],
                                b["state"] == "active_allocated") for b in seg["blocks"]]))
    return oom, chunk_map, path


def compare(name, python, fragscope, workdir):
    limit, what, ops = SEQUENCES[name]
    ops = list(ops) + [("a", "over-the-limit", (limit + 1) * MiB)]
    log = run_tensorflow(python, limit, ops)
    events, tf_oom, tf_map, notes = parse_log(log)
    model_oom, model_map, trace = run_model(fragscope, events, limit, workdir, name)
    tf_sorted, model_sorted = sorted(tf_map), sorted(model_map)
    chunks_tf = sum(len(c) for _, c in tf_map)
    same_chunks = sum(1 for a, b in zip(tf_sorted, model_sorted) if a == b)
    return {
        "name": name, "what": what, "limit_mib": limit, "requests": len(events),
        "tf_oom": tf_oom, "model_oom": model_oom, "tf_regions": len(tf_map),
        "model_regions": len(model_map), "tf_chunks": chunks_tf,
        "same_regions": same_chunks, "same_map": tf_sorted == model_sorted,
        "notes": notes, "tf_map": tf_sorted, "model_map": model_sorted, "trace": trace,
    }


def table(results, tf_version):
    lines = [
        f"| sequence | limit | allocator requests | OOM at request (TF / model) | regions "
        f"(TF / model) | chunks at the OOM | same chunk map |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['name']}: {r['what']} | {r['limit_mib']} MiB | {r['requests']} "
            f"| {r['tf_oom']} / {r['model_oom']} | {r['tf_regions']} / {r['model_regions']} "
            f"| {r['tf_chunks']} | {'yes' if r['same_map'] else 'NO'} |")
    lines.append("")
    lines.append(f"Measured with tensorflow_cpu {tf_version} (`TF_CPU_ALLOCATOR_USE_BFC=true`), "
                 "`tools/bfc_fidelity.py`; requests include TensorFlow's own 4-byte shape "
                 "tensors, as its allocator saw them.")
    return "\n".join(lines)


BEGIN = "<!-- bfc-fidelity:begin (tools/bfc_fidelity.py --write) -->"
END = "<!-- bfc-fidelity:end -->"


def write_docs(path, text):
    with open(path) as f:
        doc = f.read()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in doc and END in doc:
        doc = doc[:doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n## The BFC model against real TensorFlow\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="a Python with tensorflow")
    ap.add_argument("--fragscope", required=True)
    ap.add_argument("--only", action="append", help="run only these sequences")
    ap.add_argument("--write", help="replace the table in this Markdown file")
    ap.add_argument("--verbose", action="store_true", help="print both chunk maps")
    args = ap.parse_args()
    tf_version = subprocess.run([args.python, "-c", "import tensorflow as tf; "
                                 "print(tf.__version__)"], capture_output=True, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                                check=True).stdout.strip()
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.only or SEQUENCES:
            r = compare(name, args.python, args.fragscope, workdir)
            results.append(r)
            if args.verbose or not r["same_map"] or r["tf_oom"] != r["model_oom"]:
                print(f"{name}: TF {r['tf_map']}\n{name}: model {r['model_map']}",
                      file=sys.stderr)
            for note in r["notes"]:
                print(f"{name}: {note}", file=sys.stderr)
    text = table(results, tf_version)
    print(text)
    if args.write:
        write_docs(args.write, text)
    ok = all(r["same_map"] and r["tf_oom"] == r["model_oom"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
