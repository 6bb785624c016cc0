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
import time

from fragscope import _native
from fragscope import alloc_conf as _conf
from fragscope._safe_file import open_safely, write_file_safely

_n = _native.load()
try:
    import torch
except ImportError as _e:
    raise ImportError("fragscope.torch needs PyTorch, which this interpreter ({}) cannot import: "
                      "{}".format(sys.executable, _e)) from None
from fragscope.torch import _hook as _hook_module  # noqa: E402

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
    return _conf.modelled_version(version or torch.__version__)


_loaded_hook = None


def hook():
    """The c10 hook for this torch (fragscope/torch/_hook.py: built once per torch version)."""
    global _loaded_hook
    if _loaded_hook is None:
        _loaded_hook = _hook_module.load(torch)
    return _loaded_hook


def _parse_size(what, value, capacity=False):
    """A size argument: a string as the CLI reads it ("80GiB"; fragscope._core's grammar), or an
    int of bytes. For a capacity, a number below 1 MiB is refused (no GPU is that small: 80 was
    meant as 80GiB) and a decimal unit ("80GB") gets the CLI's note on stderr."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError("{}: expected a size such as '80GiB' or a number of bytes, got {!r}"
                        .format(what, value))
    if isinstance(value, int) and value < 0:
        raise ValueError("{}: {} is negative".format(what, value))
    try:
        if not capacity:
            return value if isinstance(value, int) else _n.parse_size(value)
        size, note = _n.parse_capacity(str(value))
    except ValueError as e:
        raise ValueError("{}: {}".format(what, e)) from None
    if note:
        print("fragscope.torch: {}: {}".format(what, note), file=sys.stderr, flush=True)
    return size


_current = None


class _RecordFunction(contextlib.ContextDecorator):
    """torch.autograd.profiler.record_function while a virtual GPU is active: the same range
    (profilers and the CPU-only rules see it: Optimizer.step#...), but no tensor.  In 1.13 the
    original allocates a tensor in __init__ and one in __enter__, which a GPU run makes on the
    CPU too."""

    def __init__(self, name, args=None):
        self.name = name
        self.args = args
        self._scope = _hook_module.UserScope(hook(), name)

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


def _restore(saved):
    for owner, name, value in reversed(saved or []):
        setattr(owner, name, value)


def _device_arg(device):
    """torch.cuda's `device` argument on a virtual GPU: only device 0 (or None) exists."""
    if device is None:
        return
    index = getattr(device, "index", device)
    if isinstance(index, str):
        index = index.split(":")[-1] if ":" in index else 0
    if index not in (None, 0, "0"):
        raise ValueError("virtual GPU: only device 0 exists, got {!r}".format(device))


_NO_CUDA = ("fragscope virtual GPU: this torch ({}) is a CPU build, so .cuda(), device='cuda' "
            "and torch.cuda's kernels cannot run here. Keep the tensors on the CPU: the virtual "
            "GPU already sees every allocation they make (docs/virtual-gpu.md, 'What the CPU "
            "build cannot pretend')")


def _patch_torch_cuda(gpu):
    """While `gpu` is active, torch.cuda's memory functions answer from it, as 2.x code calls
    them (memory_stats(), memory_snapshot(), mem_get_info(), memory._snapshot(),
    memory._dump_snapshot(), ...), and CUDA initialization fails with a message that says why.
    Returns what to restore."""
    cuda = torch.cuda
    memory = getattr(cuda, "memory", None)

    def on(fn):
        def call(device=None, *args, **kwargs):
            _device_arg(device)
            return fn(*args, **kwargs)
        call.__name__ = getattr(fn, "__name__", "call")
        call.__doc__ = "fragscope virtual GPU: " + (fn.__doc__ or "").strip().split("\n")[0]
        return call

    def lazy_init(*_args, **_kwargs):
        raise RuntimeError(_NO_CUDA.format(torch.__version__))

    replacements = {
        "memory_stats": on(gpu.memory_stats),
        "memory_allocated": on(gpu.memory_allocated),
        "max_memory_allocated": on(gpu.max_memory_allocated),
        "memory_reserved": on(gpu.memory_reserved),
        "max_memory_reserved": on(gpu.max_memory_reserved),
        "memory_snapshot": lambda *a, **k: gpu.memory_snapshot(),
        "mem_get_info": on(gpu.mem_get_info),
        "reset_peak_memory_stats": on(gpu.reset_peak_memory_stats),
        "reset_accumulated_memory_stats": on(gpu.reset_accumulated_memory_stats),
        "empty_cache": lambda: gpu.empty_cache(),
        "set_per_process_memory_fraction": (
            lambda fraction, device=None: (_device_arg(device),
                                           gpu.set_per_process_memory_fraction(fraction))[1]),
        # The virtual GPU is device 0 (tools that read the allocator's state ask for it first,
        # e.g. fragscope_agent.send_torch_state); is_available() stays False.
        "current_device": lambda: 0,
        "_lazy_init": lazy_init,
    }
    saved = []
    for name, value in replacements.items():
        for owner in (cuda, memory):
            if owner is not None and hasattr(owner, name):
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)
    if memory is not None:
        for name, value in (("_snapshot", lambda *a, **k: gpu.snapshot()),
                            ("_dump_snapshot", lambda filename="dump_snapshot.pickle":
                             gpu.dump_snapshot(filename))):
            if hasattr(memory, name):
                saved.append((memory, name, getattr(memory, name)))
                setattr(memory, name, value)
    return saved


def snapshot_for_version(segments, trace, version, alloc_conf=""):
    """torch.cuda.memory._snapshot()'s dict as torch `version` writes it, from the virtual GPU's
    segments and allocator events (shared/spec/memory-snapshot-format.md §7, "Version history"):
    1.13-2.0 without block addresses and pool ids, 2.1 with them, time_us from 2.2,
    allocator_settings from 2.4, external_annotations and compile_context from 2.5/2.6,
    user_metadata from 2.8."""
    major, minor = _conf.release(version)
    v = (major, minor)
    out_segments = []
    for seg in segments:
        seg = dict(seg)
        blocks = []
        for b in seg.pop("blocks"):
            b = dict(b)
            if v < (2, 1):
                b.pop("address", None)
                b.pop("frames", None)
            blocks.append(b)
        if v >= (2, 1):
            seg["segment_pool_id"] = (0, 0)
            seg["frames"] = []
        else:
            seg.pop("is_expandable", None)
        seg["blocks"] = blocks
        out_segments.append(seg)
    entries = []
    for e in trace:
        e = dict(e)  # "step" entries are fragscope's own markers (fragscope analyze reads them)
        if e["action"] == "oom":
            e.pop("addr", None)
        if v < (2, 2):
            e.pop("time_us", None)
        if v >= (2, 6):
            e["compile_context"] = "N/A"
        if v >= (2, 8):
            e["user_metadata"] = ""
        entries.append(e)
    snap = {"segments": out_segments, "device_traces": [entries]}
    if v >= (2, 4):
        snap["allocator_settings"] = _n.snapshot_allocator_settings(
            alloc_conf, _conf.modelled_version(version))
    if v >= (2, 5):
        snap["external_annotations"] = []
    return snap


class VirtualGpu:
    """One virtual GPU.  Use as a context manager, or call start() and stop().

    capacity        total device memory: "80GiB", "40GB", or bytes
    alloc_conf      allocator settings string (default: what the running torch reads from
                    $PYTORCH_ALLOC_CONF / $PYTORCH_CUDA_ALLOC_CONF, fragscope.alloc_conf; or
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
        self.capacity = _parse_size("capacity", capacity, capacity=True)
        if self.capacity == 0:
            raise ValueError("capacity: must be more than 0 bytes")
        self.used_by_others = _parse_size("used_by_others", used_by_others)
        if self.used_by_others > self.capacity:
            raise ValueError("used_by_others: {} bytes is more than the capacity ({} bytes)"
                             .format(self.used_by_others, self.capacity))
        if torch_version is None:
            torch_version = default_torch_version()
        torch_version = str(torch_version)
        if torch_version not in _conf.MODELLED:
            raise ValueError("torch_version: {!r} is not one of '1.13', '2', 'newest'"
                             .format(torch_version))
        self.torch_version = torch_version
        if alloc_conf is None:
            # As the running torch reads its environment (fragscope.alloc_conf).
            alloc_conf, _name = _conf.read(torch.__version__, torch=torch)
        if not isinstance(alloc_conf, str):
            raise TypeError("alloc_conf: expected a PYTORCH_CUDA_ALLOC_CONF string, got {!r}"
                            .format(alloc_conf))
        # Validated now, so that a bad string fails here and not at start().
        self.alloc_conf = _conf.canonical(alloc_conf, torch_version, running=torch.__version__)
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
        h = hook()  # built before the session starts: a failed build leaves nothing running
        _n.vgpu_start(self.capacity, self.used_by_others, self.alloc_conf, self.torch_version,
                      self.on_oom == "raise", self.keep_cpu_only, self.record_trace)
        try:
            h.start(_n.vgpu_api_address(), not self.keep_cpu_only)
        except BaseException:
            _n.vgpu_stop()
            raise
        self._started = True
        _current = self
        self._saved_record_function = (None if self.keep_cpu_only
                                       else _patch_record_function())
        self._saved_cuda = _patch_torch_cuda(self)
        return self

    def stop(self):
        """Stops simulating; the figures stay readable until the next virtual GPU starts."""
        if self._started and not self._stopped:
            hook().stop()
            _n.vgpu_stop()
            self._stopped = True
            if self._saved_record_function is not None:
                _restore_record_function(self._saved_record_function)
            _restore(self._saved_cuda)

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
        """torch.cuda.memory._snapshot() as the running torch returns it: the keys and fields of
        that version's format (docs/virtual-gpu.md, "Snapshots"); the trace only with
        record_trace."""
        self._check()
        return snapshot_for_version(_n.vgpu_memory_snapshot(), _n.vgpu_allocator_trace(),
                                    torch.__version__, self.alloc_conf)

    def dump_snapshot(self, path, named_by_user=True):
        """torch.cuda.memory._dump_snapshot(path): the pickle the running torch would write
        (Python's default protocol), which `fragscope analyze` and PyTorch's _memory_viz.py read.
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
    FRAGSCOPE_VIRTUAL_GPU_ALLOC_CONF       settings (default: what the running torch reads
                                           from $PYTORCH_ALLOC_CONF / $PYTORCH_CUDA_ALLOC_CONF)
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
