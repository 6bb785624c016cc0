"""A virtual GPU for real PyTorch on the CPU (docs/virtual-gpu.md).

While a virtual GPU is active, every tensor-storage allocation and free of this process, in
program order and from every thread, also goes through fragscope's model of PyTorch's CUDA
caching allocator (CachingAllocatorSim) for a GPU of the chosen size and
PYTORCH_CUDA_ALLOC_CONF.  The memory itself still comes from the CPU; the model decides what
the GPU would have done: its memory_stats(), its segments and blocks, and its out-of-memory
error at the very request that would fail::

    import fragscope.torch as fst
    with fst.virtual_gpu("16GiB", alloc_conf="expandable_segments:True") as gpu:
        for i, batch in enumerate(loader):
            gpu.step(i)
            train_step(batch)
        print(gpu.memory_stats()["reserved_bytes.all.peak"])
        gpu.dump_snapshot("run.pickle")      # fragscope analyze run.pickle

or, without changing the script::

    FRAGSCOPE_VIRTUAL_GPU=80GiB python -m fragscope.torch.run train.py --its-flags

Importing this module with FRAGSCOPE_VIRTUAL_GPU set starts a virtual GPU for the whole process
(see ``from_environment``).
"""
import atexit
import contextlib
import gzip
import io
import json
import os
import pickle
import sys

from fragscope import _native
from fragscope._safe_file import open_safely, write_file_safely

_n = _native.load()
import torch  # noqa: E402  (after the loader, which explains a missing torch)

__all__ = [
    "VirtualGpu", "virtual_gpu", "current", "from_environment", "memory_stats",
    "memory_snapshot", "mem_get_info", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "counters", "snapshot", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "empty_cache", "set_per_process_memory_fraction",
    "step", "ooms", "dump_snapshot", "dump_trace", "OutOfMemoryError",
]

#: What an OOM on the virtual GPU raises: torch.cuda.OutOfMemoryError where torch has it (a
#: RuntimeError subclass), else RuntimeError.
OutOfMemoryError = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)

PRODUCER = "fragscope.torch.virtual_gpu 1.0"

_ENV = "FRAGSCOPE_VIRTUAL_GPU"


def default_torch_version(version=None):
    """The allocator behaviour of the running torch: "1.13", "2" (2.0-2.8) or "newest"."""
    version = version or torch.__version__
    parts = version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return "newest"
    if major < 2:
        return "1.13"
    if major == 2 and minor < 9:
        return "2"
    return "newest"


def _parse_size(what, value):
    if isinstance(value, bool):
        raise TypeError("{}: expected a size such as '80GiB' or a number of bytes, got {!r}"
                        .format(what, value))
    if isinstance(value, int):
        if value < 0:
            raise ValueError("{}: {} is negative".format(what, value))
        return value
    if not isinstance(value, str):
        raise TypeError("{}: expected a size such as '80GiB' or a number of bytes, got {!r}"
                        .format(what, value))
    try:
        return _n.parse_size(value)
    except ValueError as e:
        raise ValueError("{}: {}".format(what, e)) from None


_current = None


class _RecordFunction(contextlib.ContextDecorator):
    """torch.autograd.profiler.record_function while a virtual GPU is active: the same range
    (profilers and the CPU-only rules see it: Optimizer.step#...), but no tensor.  In 1.13 the
    original allocates a tensor in __init__ and one in __enter__, which a GPU run makes on the
    CPU too."""

    def __init__(self, name, args=None):
        self.name = name
        self.args = args
        self._scope = _n.UserScope(name)

    def __enter__(self):
        self._scope.enter()
        return self

    def __exit__(self, *exc):
        self._scope.exit()
        return False


def _patch_record_function():
    saved = (torch.autograd.profiler.record_function, torch.profiler.record_function)
    torch.autograd.profiler.record_function = _RecordFunction
    torch.profiler.record_function = _RecordFunction
    return saved


def _restore_record_function(saved):
    torch.autograd.profiler.record_function, torch.profiler.record_function = saved


class VirtualGpu:
    """One virtual GPU.  Use as a context manager, or call start() and stop().

    capacity        total device memory: "80GiB", "40GB", or bytes
    alloc_conf      PYTORCH_CUDA_ALLOC_CONF string (default: $PYTORCH_CUDA_ALLOC_CONF, or
                    PyTorch's defaults), validated as that torch version validates it
    torch_version   whose allocator to model: "1.13", "2", "newest" (default: the running
                    torch's)
    used_by_others  memory the allocator cannot have (CUDA context, NCCL, other processes)
    on_oom          "raise": the request that would fail raises torch.cuda.OutOfMemoryError
                    with PyTorch's exact message; "record": it is recorded (ooms()) and the
                    tensor lives on outside the simulation, so the run goes on
    keep_cpu_only   also send the allocations a GPU run would make on the CPU (wrapped Python
                    scalars, optimizer step counters, record_function handles); by default
                    they stay outside, and record_function is swapped for a version that
                    allocates nothing while the virtual GPU is active
    record_trace    keep the request and allocator events (dump_trace, dump_snapshot's
                    device_traces); memory grows with the events (about 16 B + 64 B each)
    """

    def __init__(self, capacity="80GiB", alloc_conf=None, torch_version=None,
                 used_by_others=0, on_oom="raise", keep_cpu_only=False, record_trace=True):
        self.capacity = _parse_size("capacity", capacity)
        if self.capacity == 0:
            raise ValueError("capacity: must be more than 0 bytes")
        self.used_by_others = _parse_size("used_by_others", used_by_others)
        if self.used_by_others > self.capacity:
            raise ValueError("used_by_others: {} bytes is more than the capacity ({} bytes)"
                             .format(self.used_by_others, self.capacity))
        if torch_version is None:
            torch_version = default_torch_version()
        torch_version = str(torch_version)
        if torch_version not in ("1.13", "2", "newest"):
            raise ValueError("torch_version: {!r} is not one of '1.13', '2', 'newest'"
                             .format(torch_version))
        self.torch_version = torch_version
        if alloc_conf is None:
            alloc_conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if not isinstance(alloc_conf, str):
            raise TypeError("alloc_conf: expected a PYTORCH_CUDA_ALLOC_CONF string, got {!r}"
                            .format(alloc_conf))
        # Validated now, so that a bad string fails here and not at start().
        self.alloc_conf = _n.canonical_alloc_conf(alloc_conf, torch_version)
        if on_oom not in ("raise", "record"):
            raise ValueError("on_oom: {!r} is not one of 'raise', 'record'".format(on_oom))
        self.on_oom = on_oom
        self.keep_cpu_only = bool(keep_cpu_only)
        self.record_trace = bool(record_trace)
        self._started = False
        self._stopped = False
        self._step = -1

    # -- lifetime ---------------------------------------------------------------------------
    def start(self):
        global _current
        if self._started:
            raise RuntimeError("this virtual GPU was already started; make a new one")
        _n.vgpu_start(self.capacity, self.used_by_others, self.alloc_conf, self.torch_version,
                      self.on_oom == "raise", self.keep_cpu_only, self.record_trace)
        self._started = True
        _current = self
        self._saved_record_function = (None if self.keep_cpu_only
                                       else _patch_record_function())
        return self

    def stop(self):
        """Stops simulating; the figures stay readable until the next virtual GPU starts."""
        if self._started and not self._stopped:
            _n.vgpu_stop()
            self._stopped = True
            if self._saved_record_function is not None:
                _restore_record_function(self._saved_record_function)

    @property
    def active(self):
        return self._started and not self._stopped

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def _check(self):
        if not self._started:
            raise RuntimeError("this virtual GPU has not been started")
        if _current is not self:
            raise RuntimeError("a newer virtual GPU replaced this one's figures")

    # -- torch.cuda's figures ---------------------------------------------------------------
    def memory_stats(self):
        """torch.cuda.memory_stats(): PyTorch's key names, sorted."""
        self._check()
        return dict(sorted(_n.vgpu_memory_stats().items()))

    def memory_snapshot(self):
        """torch.cuda.memory_snapshot(): segments with their blocks."""
        self._check()
        return _n.vgpu_memory_snapshot()

    def mem_get_info(self):
        """torch.cuda.mem_get_info(): (free bytes, total bytes) of the device."""
        self._check()
        return tuple(_n.vgpu_mem_get_info())

    def memory_allocated(self):
        return self.memory_stats()["allocated_bytes.all.current"]

    def max_memory_allocated(self):
        return self.memory_stats()["allocated_bytes.all.peak"]

    def memory_reserved(self):
        return self.memory_stats()["reserved_bytes.all.current"]

    def max_memory_reserved(self):
        return self.memory_stats()["reserved_bytes.all.peak"]

    def reset_peak_memory_stats(self):
        self._check()
        _n.vgpu_reset_peak()

    def reset_accumulated_memory_stats(self):
        self._check()
        _n.vgpu_reset_accumulated()

    def empty_cache(self):
        """torch.cuda.empty_cache(): releases every wholly free cached segment."""
        self._check()
        _n.vgpu_empty_cache()

    def set_per_process_memory_fraction(self, fraction):
        self._check()
        _n.vgpu_set_memory_fraction(float(fraction))

    def step(self, step=None):
        """Step marker: what follows belongs to step `step` (default: the previous + 1)."""
        self._check()
        if step is not None and (not isinstance(step, int) or step < 0):
            raise ValueError("step: expected a non-negative int, got {!r}".format(step))
        _n.vgpu_step(-1 if step is None else step)

    def ooms(self):
        """Every OOM so far (one at most with on_oom="raise"): dicts with PyTorch's `message`,
        `requested_bytes`, `tried_to_allocate_bytes`, `step`, ..."""
        self._check()
        return _n.vgpu_ooms()

    def counters(self):
        """What the hook saw: allocations and frees sent to the model, zero-size ones, those
        left on the CPU per kind, threads."""
        self._check()
        return _n.vgpu_counters()

    # -- files ------------------------------------------------------------------------------
    def snapshot(self):
        """torch.cuda.memory._snapshot()'s shape: {"segments": [...], "device_traces": [[...]]}
        (the trace only with record_trace)."""
        self._check()
        return {"segments": _n.vgpu_memory_snapshot(),
                "device_traces": [_n.vgpu_allocator_trace()]}

    def dump_snapshot(self, path, named_by_user=True):
        """torch.cuda.memory._dump_snapshot(path): a pickle that `fragscope analyze` reads.
        Written through a new temporary renamed onto `path` (fragscope._safe_file): a link at
        `path` is followed to its existing file only when `named_by_user` (a path the caller
        chose, not one derived by the program); a link to nothing is refused (OSError)."""
        data = self.snapshot()
        write_file_safely(path, pickle.dumps(data), named_by_user=named_by_user)

    def dump_trace(self, path):
        """The run's requests as a fragscope request trace (docs/formats.md; gzip if `path`
        ends in .gz), which `fragscope replay` replays on any GPU size and settings."""
        self._check()
        head = {
            "format": "fragscope-trace", "version": 1, "kind": "request",
            "producer": "{} (torch {}, on_oom={}, cpu_only={})".format(
                PRODUCER, torch.__version__, self.on_oom,
                "kept" if self.keep_cpu_only else "dropped"),
            "devices": [{"device": 0, "name": "virtual-gpu", "capacity_bytes": self.capacity,
                         "used_by_others_bytes": self.used_by_others}],
            "labels": {"torch_version": self.torch_version},
            "allocator_settings": _n.vgpu_alloc_conf(),
        }
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        # Through a new temporary renamed onto `path` (fragscope._safe_file), as dump_snapshot.
        with open_safely(path, named_by_user=True) as raw:
            packed = gzip.GzipFile(fileobj=raw, mode="wb") if path.endswith(".gz") else None
            f = io.TextIOWrapper(packed if packed is not None else raw, encoding="utf-8")
            f.write(dumps(head) + "\n")
            for action, ident, size in _n.vgpu_request_trace():
                if action == "step":
                    f.write('{"action":"step","step":%d}\n' % size)
                else:
                    f.write('{"action":"%s","addr":%d,"size":%d}\n' % (action, ident, size))
            f.flush()
            f.detach()  # leaves raw open for open_safely
            if packed is not None:
                packed.close()  # the gzip trailer; raw stays open


def virtual_gpu(capacity="80GiB", alloc_conf=None, torch_version=None, **options):
    """A VirtualGpu (see there); `with virtual_gpu("80GiB") as gpu: ...`."""
    return VirtualGpu(capacity, alloc_conf, torch_version, **options)


def current():
    """The virtual GPU started last (active or stopped), or None."""
    return _current


def _cur():
    if _current is None:
        raise RuntimeError("no virtual GPU: start one with fragscope.torch.virtual_gpu(...) or "
                           "set FRAGSCOPE_VIRTUAL_GPU")
    return _current


def memory_stats():
    return _cur().memory_stats()


def memory_snapshot():
    return _cur().memory_snapshot()


def mem_get_info():
    return _cur().mem_get_info()


def memory_allocated():
    return _cur().memory_allocated()


def max_memory_allocated():
    return _cur().max_memory_allocated()


def memory_reserved():
    return _cur().memory_reserved()


def max_memory_reserved():
    return _cur().max_memory_reserved()


def counters():
    return _cur().counters()


def snapshot():
    return _cur().snapshot()


def reset_peak_memory_stats():
    _cur().reset_peak_memory_stats()


def reset_accumulated_memory_stats():
    _cur().reset_accumulated_memory_stats()


def empty_cache():
    _cur().empty_cache()


def set_per_process_memory_fraction(fraction):
    _cur().set_per_process_memory_fraction(fraction)


def step(n=None):
    _cur().step(n)


def ooms():
    return _cur().ooms()


def dump_snapshot(path):
    _cur().dump_snapshot(path)


def dump_trace(path):
    _cur().dump_trace(path)


def from_environment(environ=None):
    """Starts a virtual GPU from the environment, or returns None if FRAGSCOPE_VIRTUAL_GPU is
    unset or empty:

    FRAGSCOPE_VIRTUAL_GPU                  capacity ("80GiB")
    FRAGSCOPE_VIRTUAL_GPU_ALLOC_CONF       settings (default: $PYTORCH_CUDA_ALLOC_CONF)
    FRAGSCOPE_VIRTUAL_GPU_TORCH_VERSION    "1.13", "2", "newest" (default: the running torch's)
    FRAGSCOPE_VIRTUAL_GPU_USED_BY_OTHERS   e.g. "600MiB"
    FRAGSCOPE_VIRTUAL_GPU_ON_OOM           "raise" (default) or "record"
    FRAGSCOPE_VIRTUAL_GPU_SNAPSHOT         write dump_snapshot() here at exit
    FRAGSCOPE_VIRTUAL_GPU_TRACE            write dump_trace() here at exit

    A bad value raises ValueError naming the variable."""
    env = os.environ if environ is None else environ
    capacity = env.get(_ENV, "")
    if not capacity:
        return None
    kwargs = {}
    if env.get(_ENV + "_ALLOC_CONF") is not None:
        kwargs["alloc_conf"] = env[_ENV + "_ALLOC_CONF"]
    if env.get(_ENV + "_TORCH_VERSION"):
        kwargs["torch_version"] = env[_ENV + "_TORCH_VERSION"]
    if env.get(_ENV + "_USED_BY_OTHERS"):
        kwargs["used_by_others"] = env[_ENV + "_USED_BY_OTHERS"]
    if env.get(_ENV + "_ON_OOM"):
        kwargs["on_oom"] = env[_ENV + "_ON_OOM"]
    try:
        gpu = VirtualGpu(capacity, **kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError("{} and friends: {}".format(_ENV, e)) from None
    snapshot_path = env.get(_ENV + "_SNAPSHOT")
    trace_path = env.get(_ENV + "_TRACE")
    gpu.start()

    def finish():
        gpu.stop()
        for path, dump in ((snapshot_path, gpu.dump_snapshot), (trace_path, gpu.dump_trace)):
            if path:
                try:
                    dump(path)
                except OSError as e:
                    print("fragscope.torch: cannot write {}: {}".format(path, e),
                          file=sys.stderr)
    atexit.register(finish)
    return gpu


from fragscope.torch.monitor import Monitor  # noqa: E402  (docs/live-monitoring.md)

# Python sets sys.argv[0] to "-m" while it imports the parent packages of a module run with
# `python -m`: that is `python -m fragscope.torch.run`, which applies its own options first and
# then calls from_environment() itself.
if not (sys.argv and sys.argv[0] == "-m"):
    from_environment()
