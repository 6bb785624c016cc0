"""Call sites a user can act on (issue 29 item 9; docs/metrics.md, "Which frame is the call site").

A stack's call site is its innermost Python frame outside torch's package, else its innermost
Python frame; a stack of C++ frames only (autograd's backward threads) is named by a label with
the operator, never by the unwinder or allocator frame innermost in every stack. Checked on the
real snapshots in ../shared/snapshots/real (read in place, skipped when absent), through
`analyze` (text and JSON) and `report`, and on traces whose events carry PyTorch's `frames`.
"""

import json
import os
import re
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
REAL = os.path.normpath(os.path.join(SOURCE_DIR, "..", "shared", "snapshots", "real"))
NOTHANMIN = os.path.join(REAL, "nothanmin_memory_snapshot.pickle")
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")
needs_nothanmin = pytest.mark.skipif(not os.path.exists(NOTHANMIN),
                                     reason=f"{NOTHANMIN} is absent")

# What no call site may be named after: the frames of the unwinder that captured the stack and
# of the caching allocator, which stand innermost in every stack PyTorch records.
MACHINERY = re.compile(r"torch::unwind|CapturedTraceback|gather_with_cpp|CUDACachingAllocator")
LABEL = re.compile(r"^C\+\+ only( \([a-z ]+\))?(: .+)?$")


def run(*args):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr
    return p


def sites(path):
    out = json.loads(run("analyze", path, "--json", "--no-map").stdout)
    return [s for d in out["devices"] for s in d["stranding_sites"] or []]


@needs_nothanmin
def test_nothanmin_top_site_is_the_operator_of_a_backward_thread_not_the_unwinder():
    found = sites(NOTHANMIN)
    assert found, "no stranding sites"
    for s in found:
        assert not MACHINERY.search(s["site"]), s
        assert not s["site"].startswith("??"), s
    top = found[0]["site"]
    # The stranding the unwinder's frame was credited with belongs to autograd's backward
    # thread; its label names the operator, at::_ops::<op>, and the node that ran it.
    assert LABEL.match(top), top
    assert top.startswith("C++ only (autograd backward thread): at::_ops::"), top
    # The text report shows it whole (its start is what says the most).
    text = run("analyze", NOTHANMIN, "--no-map").stdout
    section = text[text.index("Call sites stranding free gaps"):]
    assert "torch::unwind" not in section
    assert "  C++ only (autograd backward thread): at::_ops::" in section


@needs_nothanmin
def test_nothanmin_report_page_names_no_unwinder_site(tmp_path):
    out = tmp_path / "r.html"
    r = run("report", NOTHANMIN, "-o", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="fragscope-data">(.*?)</script>', html,
                  re.S)
    assert m, "no embedded data"
    data = json.loads(m.group(1))
    names = list(data["sites"].values())
    assert names
    assert not [n for n in names if MACHINERY.search(n)]
    assert any(n.startswith("C++ only (autograd backward thread): at::_ops::") for n in names)
    for d in data["devices"]:
        for s in d["stranding_sites"]:
            assert not MACHINERY.search(s["site"]), s


REAL_SNAPSHOTS = sorted(os.listdir(REAL)) if os.path.isdir(REAL) else []


@pytest.mark.parametrize("name", REAL_SNAPSHOTS)
def test_no_real_snapshot_names_a_site_after_the_unwinder_or_allocator(name):
    for s in sites(os.path.join(REAL, name)):
        assert not MACHINERY.search(s["site"]), s
        assert s["site"] == "(no stack recorded)" or re.search(r"\.py:\d+ in ", s["site"]) \
            or LABEL.match(s["site"]), s


# ---- Traces whose events carry PyTorch's frames --------------------------------------------

def frame(name, filename="??", line=0):
    return {"name": name, "filename": filename, "line": line}


UNWIND = [frame("torch::unwind::unwind()"),
          frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
                "signed char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp")]
BACKWARD = UNWIND + [
    frame("at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
    frame("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
    frame("torch::autograd::Engine::thread_main(std::shared_ptr<GraphTask> const&)"),
    frame("clone")]
PYTHON = UNWIND + [
    frame("_PyEval_EvalFrameDefault"),
    frame("linear", "/venv/lib/python3.11/site-packages/torch/nn/functional.py", 7),
    frame("forward", "/home/u/model.py", 33),
    frame("main", "/home/u/train.py", 5)]


def write_trace(path):
    """One 20 MiB segment: 4 MiB allocated on the backward thread, then 2 MiB from the user's
    forward, 14 MiB free after them (stranded by both)."""
    base = 0x7f0000000000
    lines = [{"format": "fragscope-trace", "version": 1, "kind": "allocator"},
             {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "pool": "large",
              "frames": BACKWARD},
             {"action": "alloc", "addr": base, "size": 4 * MiB, "frames": BACKWARD},
             {"action": "alloc", "addr": base + 4 * MiB, "size": 2 * MiB, "frames": PYTHON}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_trace_frames_go_through_the_same_choice(tmp_path):
    trace = tmp_path / "frames.jsonl"
    write_trace(trace)
    found = {s["site"]: s for s in sites(trace)}
    assert set(found) == {"C++ only (autograd backward thread): at::_ops::mm in MmBackward0",
                          "/home/u/model.py:33 in forward"}, found
    assert found["/home/u/model.py:33 in forward"]["live_bytes"] == 2 * MiB
    # convert writes the chosen sites as frame lines: the trace it writes names the same sites.
    out = tmp_path / "out.jsonl"
    r = run("convert", trace, "--to", "trace", "-o", out)
    assert r.returncode == 0, r.stderr
    frames = [json.loads(x) for x in out.read_text().splitlines()
              if '"action":"frame"' in x.replace(" ", "")]
    assert sorted(f["name"] for f in frames) == [
        "C++ only (autograd backward thread): at::_ops::mm in MmBackward0", "forward"]
    assert {s["site"] for s in sites(out)} == set(found)
