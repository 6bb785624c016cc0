"""fragscope_agent: send allocator samples from a training process to `fragscope serve`.

Standard library only. The wire format is docs/formats.md, "Agent protocol": each message is
a 4-byte little-endian length, the header b"FSAG" + version (u16 LE) + type (u16 LE), then
one JSON object.

    from fragscope_agent import AgentClient
    agent = AgentClient("/run/fragscope/agent.sock", job="llm-7b", rank=0)
    # every N steps: memory_stats() and the block-level view from memory_snapshot()
    agent.send_torch_state(step)
    # or hand-made samples:
    agent.send_memory_stats(torch.cuda.memory_stats(dev), device_uuid=uuid, step=step)
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
import warnings

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


BFC_ROUNDING = 256  # the BFC allocator rounds every request up to a multiple of 256 bytes


def sample_from_bfc_stats(stats: dict, **fields) -> dict:
    """A sample dict from the statistics of a BFC allocator under the names JAX's
    Device.memory_stats() uses (TensorFlow/XLA's AllocatorStats): bytes_in_use → allocated,
    pool_bytes (else bytes_reserved, what cuda_malloc_async reports) → reserved, their peaks,
    largest_free_block_bytes → largest_free_block, and with bytes_limit the capacity
    (device_free_bytes = limit − pool) and max_allocatable = the larger of the largest free
    chunk and what a new region can still get (limit − pool, in 256-byte units): BFC extends
    its pool by a region at least as large as the request while the limit allows. Missing
    statistics are left out; num_allocs and largest_alloc_size are kept under their own names
    (the daemon ignores them)."""
    def get(*keys):
        for key in keys:
            value = stats.get(key)
            if value is not None:
                return int(value)
        return None

    sample = {}
    pairs = (("allocated_bytes", ("bytes_in_use",)),
             ("peak_allocated_bytes", ("peak_bytes_in_use",)),
             ("reserved_bytes", ("pool_bytes", "bytes_reserved")),
             ("peak_reserved_bytes", ("peak_pool_bytes", "peak_bytes_reserved")),
             ("largest_free_block", ("largest_free_block_bytes",)),
             ("num_allocs", ("num_allocs",)),
             ("largest_alloc_size", ("largest_alloc_size",)))
    for field, keys in pairs:
        value = get(*keys)
        if value is not None:
            sample[field] = max(0, value)
    if "reserved_bytes" in sample and "allocated_bytes" in sample:
        sample["cached_free_bytes"] = max(0, sample["reserved_bytes"] - sample["allocated_bytes"])
    limit = get("bytes_limit")
    if limit is not None and "reserved_bytes" in sample:
        growth = max(0, limit - sample["reserved_bytes"])
        sample["device_free_bytes"] = growth
        if "largest_free_block" in sample:
            sample["max_allocatable"] = max(sample["largest_free_block"],
                                            growth // BFC_ROUNDING * BFC_ROUNDING)
    sample.update(fields)
    return sample


# PyTorch's caching-allocator constants (shared/spec/pytorch-caching-allocator.md §4; the same
# as src/model/allocator_rules.h).
SMALL_SIZE = 1 << 20  # requests of at most 1 MiB go to the small pool
SMALL_BUFFER = 2 << 20  # a small-pool segment
MIN_LARGE_ALLOC = 10 << 20  # below this a large request takes a 20 MiB segment
ROUND_LARGE = 2 << 20  # larger segments are the request rounded up to 2 MiB


def largest_request_for_new_segment(budget: int) -> int:
    """The largest request a new segment of at most `budget` bytes of device memory serves."""
    if budget >= MIN_LARGE_ALLOC:
        return budget // ROUND_LARGE * ROUND_LARGE
    if budget >= SMALL_BUFFER:
        return SMALL_SIZE
    return 0


def summarize_segments(segments, device=None, device_free_bytes=None) -> dict:
    """The block-level sample fields from the segments of torch.cuda.memory_snapshot() (or of
    a snapshot file's "segments"): reserved/allocated/active/requested/cached-free bytes,
    fragmentation_ratio, largest_free_block, max_allocatable and the free-block histogram, by
    the formulas of docs/metrics.md (`fragscope analyze` reports the same numbers for the same
    segments). `device`: keep only that device's segments (memory_snapshot() lists every
    device's). `device_free_bytes`: the driver's free memory (torch.cuda.mem_get_info()[0]);
    without it max_allocatable counts cached blocks only. Raises ValueError on a malformed
    segment or block."""
    reserved = allocated = active = requested = releasable = 0
    largest = {"small": 0, "large": 0}
    free_sizes = []
    for i, seg in enumerate(segments):
        try:
            if device is not None and seg.get("device", device) != device:
                continue
            pool = "small" if seg.get("segment_type") == "small" else "large"
            total = int(seg["total_size"])
            blocks = seg.get("blocks") or []
            reserved += total
            if len(blocks) == 1 and blocks[0].get("state") == "inactive":
                releasable += total
            for b in blocks:
                size = int(b["size"])
                state = b.get("state")
                if state == "active_allocated":
                    allocated += size
                    active += size
                    requested += int(b.get("requested_size", size))
                elif state == "active_pending_free":
                    active += size
                elif state == "inactive":
                    free_sizes.append(size)
                    largest[pool] = max(largest[pool], size)
                else:
                    raise ValueError(f"block state {state!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"segment {i}: {e!r}") from None
    cached_free = reserved - allocated
    # A large-pool block serves requests > 1 MiB up to its size; a small-pool one <= 1 MiB.
    max_allocatable = max(largest["large"] if largest["large"] > SMALL_SIZE else 0,
                          min(largest["small"], SMALL_SIZE))
    if device_free_bytes is not None:
        # After a failed cudaMalloc the allocator frees its wholly free segments and retries.
        max_allocatable = max(max_allocatable, largest_request_for_new_segment(
            max(0, int(device_free_bytes)) + releasable))
    counts, totals = free_block_histogram(free_sizes)
    return {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "active_bytes": active,
        "requested_bytes": requested,
        "cached_free_bytes": cached_free,
        "fragmentation_ratio": cached_free / reserved if reserved else 0.0,
        "largest_free_block": max(largest.values()),
        "max_allocatable": max_allocatable,
        "free_block_count": counts,
        "free_block_bytes": totals,
    }


def torch_device_uuid(torch, device: int):
    """NVML's UUID ("GPU-...") of a CUDA device as PyTorch knows it (device properties have a
    uuid since PyTorch 2.3), or None. Under MIG pass the instance's "MIG-..." UUID yourself."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text


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
        self._warned = False

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


    def send_torch_state(self, step: int, device=None, *, torch=None, snapshot=True,
                         reset_peaks=False, device_uuid=None, **fields) -> bool:
        """Reads what PyTorch's caching allocator holds on `device` (an int, a torch.device or
        "cuda:N"; default the current device) and sends it: memory_stats() (current and peak bytes,
        retries, OOMs), the driver's free memory, and with snapshot=True the block-level fields
        from torch.cuda.memory_snapshot() (summarize_segments: largest free block, max
        allocatable, free-block histogram). The snapshot walks every block of every device, and
        with memory history recording on it converts the history too: send every N steps, not
        every step. reset_peaks=True calls torch.cuda.reset_peak_memory_stats() after reading,
        so each sample's peaks cover the steps since the previous one (what the daemon's
        forecaster reads best), at the price of the program's own max_memory_allocated().
        Returns False, never raises, when the daemon is down or torch fails (the reason in
        `last_error`; a warning the first time)."""
        try:
            if torch is None:
                import torch
            if isinstance(device, str):  # "cuda:1"
                device = torch.device(device)
            index = device if isinstance(device, int) else getattr(device, "index", None)
            if index is None:
                index = torch.cuda.current_device()
            free, _total = torch.cuda.mem_get_info(index)
            sample = sample_from_memory_stats(torch.cuda.memory_stats(index))
            if snapshot:
                sample.update(summarize_segments(torch.cuda.memory_snapshot(), device=index,
                                                 device_free_bytes=free))
            if reset_peaks:
                torch.cuda.reset_peak_memory_stats(index)
            uuid = device_uuid or torch_device_uuid(torch, index)
            if uuid is None:
                raise ValueError("this PyTorch gives no device UUID: pass device_uuid='GPU-...' "
                                 "(nvidia-smi -L)")
        except Exception as e:  # monitoring never stops training
            self.last_error = e
            if not self._warned:
                self._warned = True
                warnings.warn(f"fragscope_agent: cannot read the allocator state: {e!r}",
                              RuntimeWarning, stacklevel=2)
            return False
        sample.update(device_uuid=uuid, device_index=index, step=step, device_free_bytes=free)
        sample.update(fields)
        return self.send_sample(sample)


def send_sample(sample: dict, path=None) -> bool:
    """One-shot send (opens and closes a connection: the series then expires at once; use an
    AgentClient in a training loop)."""
    with AgentClient(path) as client:
        return client.send_sample(sample)
