"""fragscope_agent: send allocator samples from a training process to `fragscope serve`.

Standard library only. The wire format is docs/formats.md, "Agent protocol": each message is
a 4-byte little-endian length, the header b"FSAG" + version (u16 LE) + type (u16 LE), then
one JSON object.

    from fragscope_agent import AgentClient
    agent = AgentClient("/run/fragscope/agent.sock", job="llm-7b", rank=0)
    # every N steps:
    agent.send_memory_stats(torch.cuda.memory_stats(dev), device_uuid=uuid, step=step)
    # or any dict of AgentSample fields:
    agent.send_sample({"device_uuid": uuid, "reserved_bytes": 1 << 30, "step": step})

The client keeps one connection open (the daemon drops a process's series when its
connection closes) and reconnects once on the next send after an error. send_* never raise
on a daemon that is down: they return False, so monitoring cannot stop training. Limits the
daemon enforces (defaults): 64 KiB per message, 50 samples/s per connection (burst 100);
an offending connection is closed.
"""

import json
import os
import socket
import struct
import time

MAGIC = b"FSAG"
VERSION = 1
TYPE_SAMPLE = 1
DEFAULT_SOCKET = "/run/fragscope/agent.sock"
FREE_BLOCK_BUCKETS = 64
LEVELS = ("unknown", "ok", "watch", "warning", "critical")

# torch.cuda.memory_stats() key -> AgentSample field.
MEMORY_STATS_FIELDS = {
    "reserved_bytes.all.current": "reserved_bytes",
    "allocated_bytes.all.current": "allocated_bytes",
    "active_bytes.all.current": "active_bytes",
    "requested_bytes.all.current": "requested_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
    "allocated_bytes.all.peak": "peak_allocated_bytes",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


def encode_frame(payload: bytes, version: int = VERSION, msg_type: int = TYPE_SAMPLE) -> bytes:
    """One frame around `payload` (bytes of a JSON object)."""
    return struct.pack("<I4sHH", 8 + len(payload), MAGIC, version, msg_type) + payload


def encode_sample(sample: dict) -> bytes:
    """The frame for a dict of AgentSample fields (docs/formats.md lists them)."""
    payload = json.dumps(sample, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return encode_frame(payload)


def free_block_histogram(block_sizes):
    """Power-of-two buckets (bucket b: 2**b <= size < 2**(b+1)) of free-block sizes: returns
    (counts, bytes), each a list of 64 ints, for the free_block_count/free_block_bytes fields."""
    counts = [0] * FREE_BLOCK_BUCKETS
    total = [0] * FREE_BLOCK_BUCKETS
    for size in block_sizes:
        b = max(0, int(size).bit_length() - 1)
        counts[b] += 1
        total[b] += int(size)
    return counts, total


def sample_from_memory_stats(stats: dict, **fields) -> dict:
    """A sample dict from a torch.cuda.memory_stats()-shaped dict plus explicit fields
    (device_uuid, step, largest_free_block, forecast_level, ...). Missing stats are left out."""
    sample = {}
    for key, field in MEMORY_STATS_FIELDS.items():
        if key in stats:
            sample[field] = int(stats[key])
    if "reserved_bytes" in sample and "allocated_bytes" in sample:
        sample.setdefault(
            "cached_free_bytes", max(0, sample["reserved_bytes"] - sample["allocated_bytes"]))
    sample.update(fields)
    return sample


class AgentClient:
    """One process's connection to the daemon. Not thread-safe: one per sending thread."""

    def __init__(self, path=None, *, job="", run="", rank=None, architecture="", pid=None,
                 timeout=1.0):
        self.path = path or os.environ.get("FRAGSCOPE_AGENT_SOCKET", DEFAULT_SOCKET)
        self.defaults = {"pid": pid if pid is not None else os.getpid(), "job": job, "run": run,
                         "architecture": architecture}
        if rank is None:
            rank = int(os.environ.get("RANK", "-1"))
        self.defaults["rank"] = rank
        self.timeout = timeout
        self.sock = None
        self.last_error = None

    def connect(self):
        if self.sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except OSError:
                s.close()
                raise
            self.sock = s
        return self.sock

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_raw(self, data: bytes) -> bool:
        """Writes bytes as they are (tests use it for partial and malformed frames)."""
        for attempt in (0, 1):
            try:
                self.connect().sendall(data)
                return True
            except OSError as e:  # daemon down or our connection was closed: retry once
                self.last_error = e
                self.close()
                if attempt == 1:
                    return False
        return False

    def send_sample(self, sample: dict) -> bool:
        """Sends a dict of AgentSample fields; pid/job/run/rank/architecture default to the
        client's, time_us to now. Returns False (never raises) if the daemon is unreachable."""
        full = dict(self.defaults)
        full["time_us"] = int(time.time() * 1e6)
        full.update(sample)
        level = full.get("forecast_level")
        if level is not None and level not in LEVELS:
            raise ValueError(f"forecast_level {level!r} is not one of {LEVELS}")
        if "device_uuid" not in full:
            raise ValueError("device_uuid is required (NVML's 'GPU-...' UUID of the device)")
        return self.send_raw(encode_sample(full))

    def send_memory_stats(self, stats: dict, **fields) -> bool:
        """Sends torch.cuda.memory_stats(device) plus fields (device_uuid=... is required)."""
        return self.send_sample(sample_from_memory_stats(stats, **fields))


def send_sample(sample: dict, path=None) -> bool:
    """One-shot send (opens and closes a connection: the series then expires at once; use an
    AgentClient in a training loop)."""
    with AgentClient(path) as client:
        return client.send_sample(sample)
