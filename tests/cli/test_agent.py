"""The Python agent's allocator summary (python/fragscope_agent.py) against `fragscope analyze`.

summarize_segments() turns the segments of torch.cuda.memory_snapshot() into the sample fields
an agent sends to `fragscope serve`; `fragscope analyze` computes the same metrics from the same
segments in C++. Both read the snapshot fixtures (and, when ../shared is beside the checkout,
the 35 real snapshots): every device's final state must agree field by field.
send_torch_state() is tested with a stand-in for the torch module (Debian's PyTorch has no
CUDA), over a socket that records the frames it receives.
"""

import io
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import types

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
import fragscope_agent  # noqa: E402

FIXTURES = os.path.join(SOURCE_DIR, "tests", "data", "snapshots")
REAL = os.path.normpath(os.path.join(SOURCE_DIR, "..", "shared", "snapshots", "real"))
MiB = 1 << 20


class _NoGlobals(pickle.Unpickler):
    """Snapshots hold only dicts, lists, strings and numbers: refuse anything else."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def load_segments(path):
    with open(path, "rb") as f:
        raw = f.read()
    # By content, not name: one real ".json" snapshot is a pickle.
    data = _NoGlobals(io.BytesIO(raw)).load() if raw[:1] == b"\x80" else json.loads(raw)
    return data["segments"] if isinstance(data, dict) else data


def snapshot_files():
    kinds = (".pickle", ".pkl", ".json")
    files = sorted(os.path.join(FIXTURES, f) for f in os.listdir(FIXTURES)
                   if f.startswith(("g", "segments_list")) and f.endswith(kinds))
    if os.path.isdir(REAL):
        files += sorted(os.path.join(REAL, f) for f in os.listdir(REAL) if f.endswith(kinds))
    return files


@pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                    reason="FRAGSCOPE_BIN is not set to the built fragscope")
@pytest.mark.parametrize("path", snapshot_files(), ids=os.path.basename)
def test_summary_agrees_with_analyze(path):
    out = subprocess.run([BIN, "analyze", path, "--json", "--no-map"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    segments = load_segments(path)
    assert report["devices"] or not segments
    for dev in report["devices"]:
        got = fragscope_agent.summarize_segments(segments, device=dev["device"])
        final = dev["final"]["all"]
        where = f"{os.path.basename(path)} device {dev['device']}"
        for field in ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
                      "cached_free_bytes"):
            assert got[field] == final[field], (where, field)
        assert got["largest_free_block"] == final["largest_free_block_bytes"], where
        assert got["fragmentation_ratio"] == pytest.approx(final["fragmentation_ratio"]), where
        assert got["max_allocatable"] == dev["final"]["max_allocatable_cached_bytes"], where
        histogram = [(b["count"], b["total_bytes"]) for b in dev["free_block_histogram"]]
        mine = [(c, t) for c, t in zip(got["free_block_count"], got["free_block_bytes"]) if c]
        assert mine == histogram, where


STATES = {"allocated": "active_allocated", "pending_free": "active_pending_free",
          "free": "inactive"}


@pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                    reason="FRAGSCOPE_BIN is not set to the built fragscope")
@pytest.mark.parametrize("trace", ["allocator_basic.jsonl", "two_devices.jsonl"])
def test_max_allocatable_with_the_driver_agrees_with_analyze(trace):
    # Snapshots give no device size; these allocator traces do. Their final layout, rewritten
    # as memory_snapshot() segments, with analyze's device free memory, must give analyze's
    # max allocatable: the driver part and the releasable segments included.
    out = subprocess.run([BIN, "analyze", os.path.join(SOURCE_DIR, "tests/data/cli", trace),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    checked = 0
    for dev in json.loads(out.stdout)["devices"]:
        segments = [{"device": dev["device"], "segment_type": s["pool"], "total_size":
                     s["size_bytes"], "blocks": [
                         {"size": b["size_bytes"], "state": STATES[b["state"]],
                          "requested_size": b["requested_bytes"] or 0} for b in s["blocks"]]}
                    for s in dev["layout"]]
        final = dev["final"]
        got = fragscope_agent.summarize_segments(segments, device_free_bytes=final[
            "device_free_bytes"])
        assert got["max_allocatable"] == final["max_allocatable_bytes"], dev["device"]
        assert got["largest_free_block"] == final["all"]["largest_free_block_bytes"]
        checked += final["device_free_bytes"] is not None
    assert checked >= 1


def seg(device, kind, blocks, **extra):
    """A memory_snapshot() segment of (size, state[, requested]) blocks."""
    out = []
    for b in blocks:
        size, state = b[0], b[1]
        out.append({"size": size, "state": state, "requested_size": b[2] if len(b) > 2 else size})
    return {"device": device, "segment_type": kind, "total_size": sum(b[0] for b in blocks),
            "blocks": out, **extra}


SEGMENTS = [
    # device 0: a 20 MiB segment with a 6 MiB and a 4 MiB gap, a small segment with a 1.5 MiB
    # gap, a 4 MiB segment wholly free (releasable), a pending free.
    seg(0, "large", [(6 * MiB, "inactive"), (4 * MiB, "active_allocated", 4 * MiB - 100),
                     (4 * MiB, "inactive"), (6 * MiB, "active_pending_free")]),
    seg(0, "small", [(512 * 1024, "active_allocated", 1000), (1536 * 1024, "inactive")]),
    seg(0, "large", [(4 * MiB, "inactive")]),
    # device 1: must not count for device 0.
    seg(1, "large", [(64 * MiB, "inactive")]),
]


def test_summary_by_hand():
    s = fragscope_agent.summarize_segments(SEGMENTS, device=0)
    assert s["reserved_bytes"] == 26 * MiB
    assert s["allocated_bytes"] == 4 * MiB + 512 * 1024
    assert s["active_bytes"] == 10 * MiB + 512 * 1024
    assert s["requested_bytes"] == 4 * MiB - 100 + 1000
    assert s["cached_free_bytes"] == 26 * MiB - (4 * MiB + 512 * 1024)
    assert s["largest_free_block"] == 6 * MiB
    # From the cache alone: the 6 MiB large block (the 1.5 MiB small one serves <= 1 MiB).
    assert s["max_allocatable"] == 6 * MiB
    assert s["free_block_count"][20] == 1 and s["free_block_bytes"][20] == 1536 * 1024
    assert s["free_block_count"][22] == 3 and s["free_block_bytes"][22] == 14 * MiB
    assert sum(s["free_block_count"]) == 4
    # With the driver's free memory: 7 MiB free + the 4 MiB releasable segment = 11 MiB of
    # budget, which a new segment uses up to 10 MiB (2 MiB rounding).
    assert fragscope_agent.summarize_segments(
        SEGMENTS, device=0, device_free_bytes=7 * MiB)["max_allocatable"] == 10 * MiB
    # 3 MiB of budget fits only a small segment: the cache's 6 MiB stays the answer.
    assert fragscope_agent.summarize_segments(
        SEGMENTS[:2], device=0, device_free_bytes=3 * MiB)["max_allocatable"] == 6 * MiB
    assert fragscope_agent.summarize_segments(SEGMENTS, device=1)["largest_free_block"] == 64 * MiB
    # A 1 MiB gap in a large segment serves nothing: large-pool requests are > 1 MiB.
    gap = [seg(0, "large", [(MiB, "inactive"), (19 * MiB, "active_allocated")])]
    assert fragscope_agent.summarize_segments(gap)["largest_free_block"] == MiB
    assert fragscope_agent.summarize_segments(gap)["max_allocatable"] == 0
    assert fragscope_agent.summarize_segments([])["fragmentation_ratio"] == 0.0


@pytest.mark.parametrize("bad, words", [
    ([{"segment_type": "large", "blocks": []}], "segment 0: KeyError('total_size')"),
    ([seg(0, "large", [(MiB, "active_allocated")]), seg(0, "large", [(MiB, "allocated")])],
     "segment 1: ValueError(\"block state 'allocated'\")"),
    ([{"total_size": 1, "blocks": [{"state": "inactive"}]}], "segment 0: KeyError('size')"),
    ([None], "segment 0"),
])
def test_summary_refuses_malformed_segments(bad, words):
    with pytest.raises(ValueError) as e:
        fragscope_agent.summarize_segments(bad)
    assert words in str(e.value)


class Receiver:
    """A Unix socket that records the JSON payload of every frame it receives."""

    def __init__(self, path):
        self.path = path
        self.samples = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, _ = self.server.accept()
        data = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
            while len(data) >= 4:
                (length,) = struct.unpack_from("<I", data)
                if len(data) < 4 + length:
                    break
                assert data[4:8] == b"FSAG"
                self.samples.append(json.loads(data[12:4 + length]))
                data = data[4 + length:]
        conn.close()

    def close(self):
        self.thread.join(timeout=5)
        self.server.close()


def fake_torch(uuid="6c1d2b3a-0000-4000-8000-00000000beef", fail=None):
    """The parts of torch.cuda that send_torch_state reads, for a process on device 0 and 1."""
    def memory_stats(device):
        if fail:
            raise RuntimeError(fail)
        return {"reserved_bytes.all.current": 26 * MiB, "allocated_bytes.all.current":
                4 * MiB + 512 * 1024, "reserved_bytes.all.peak": 40 * MiB,
                "allocated_bytes.all.peak": 30 * MiB, "num_alloc_retries": 2, "num_ooms": 0}

    resets = []
    cuda = types.SimpleNamespace(
        resets=resets,
        reset_peak_memory_stats=resets.append,
        current_device=lambda: 0,
        mem_get_info=lambda device: (7 * MiB, 80 * 1024 * MiB),
        memory_stats=memory_stats,
        memory_snapshot=lambda: SEGMENTS,
        get_device_properties=lambda device: types.SimpleNamespace(uuid=uuid))
    def device(text):  # torch.device("cuda:N")
        kind, _, index = text.partition(":")
        return types.SimpleNamespace(type=kind, index=int(index) if index else None)

    return types.SimpleNamespace(cuda=cuda, device=device)


def test_send_torch_state(tmp_path):
    path = str(tmp_path / "agent.sock")
    receiver = Receiver(path)
    client = fragscope_agent.AgentClient(path, pid=4321, job="llm", rank=3)
    torch = fake_torch()
    assert client.send_torch_state(100, torch=torch)
    assert client.send_torch_state(150, torch=torch, snapshot=False, forecast_level="watch")
    assert torch.cuda.resets == []
    assert client.send_torch_state(200, types.SimpleNamespace(index=1), torch=torch,
                                   device_uuid="MIG-abc", reset_peaks=True)
    assert torch.cuda.resets == [1]
    assert client.send_torch_state(250, "cuda:1", torch=torch, device_uuid="GPU-x")
    client.close()
    receiver.close()
    first, second, third, fourth = receiver.samples
    assert first["device_uuid"] == "GPU-6c1d2b3a-0000-4000-8000-00000000beef"
    assert (first["pid"], first["job"], first["rank"], first["step"]) == (4321, "llm", 3, 100)
    assert first["device_index"] == 0 and first["device_free_bytes"] == 7 * MiB
    assert first["peak_reserved_bytes"] == 40 * MiB and first["num_alloc_retries"] == 2
    assert first["largest_free_block"] == 6 * MiB
    assert first["max_allocatable"] == 10 * MiB  # the driver's 7 MiB + 4 MiB releasable
    assert sum(first["free_block_count"]) == 4
    # Without the snapshot: memory_stats only, and the caller's fields.
    assert "largest_free_block" not in second and "max_allocatable" not in second
    assert second["cached_free_bytes"] == 26 * MiB - (4 * MiB + 512 * 1024)
    assert second["forecast_level"] == "watch"
    # Device 1 (a torch.device-like object), with the UUID given.
    assert third["device_index"] == 1 and third["device_uuid"] == "MIG-abc"
    # Its 64 MiB segment is wholly free: with the driver's 7 MiB a new 70 MiB segment fits.
    assert third["largest_free_block"] == 64 * MiB and third["max_allocatable"] == 70 * MiB
    # A device string, as torch.device takes it.
    assert fourth["device_index"] == 1 and fourth["step"] == 250


def test_send_torch_state_never_raises(tmp_path):
    client = fragscope_agent.AgentClient(str(tmp_path / "nobody.sock"))
    # No daemon: False.
    assert client.send_torch_state(1, torch=fake_torch()) is False
    assert isinstance(client.last_error, OSError)
    # torch fails: False, the reason kept, one warning only.
    with pytest.warns(RuntimeWarning, match="CUDA error: out of memory"):
        assert client.send_torch_state(2, torch=fake_torch(fail="CUDA error: out of memory")) \
            is False
    assert "out of memory" in str(client.last_error)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.send_torch_state(3, torch=fake_torch(fail="again")) is False
    # A PyTorch without device UUIDs asks for one.
    old = fake_torch()
    old.cuda.get_device_properties = lambda device: types.SimpleNamespace()
    assert client.send_torch_state(4, torch=old) is False
    assert "pass device_uuid=" in str(client.last_error)
