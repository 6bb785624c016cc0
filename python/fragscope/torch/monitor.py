"""fragscope.torch.Monitor: the OOM forecaster inside the training loop (docs/live-monitoring.md).

    monitor = Monitor(save_checkpoint=save, run_dir=args.out)
    for step, batch in enumerate(loader):
        ...
        optimizer.step()
        monitor.step(step)

Every `every` steps (default 50) the monitor reads the allocator's state (memory_stats(),
mem_get_info() and the block-level memory_snapshot()) from torch.cuda, or from the active
virtual GPU (fragscope.torch.virtual_gpu) when one runs; updates the OOM risk with fragscope's
own forecaster (the daemon's analysis::LiveForecasts, bound in fragscope._core); sends the
sample to `fragscope serve` when its socket exists; and, under torch.distributed, agrees with
the other ranks on the worst level with one all_reduce(MAX). At `level` (default "warning") on
any rank, every rank at the same step: calls save_checkpoint(step), writes
fragscope-recommendation.json (what it saw, each rank's level, a recommended
PYTORCH_CUDA_ALLOC_CONF) into `run_dir`, and exits with EXIT_CODE (75) so that torchrun, with
restarts left (--max-restarts), starts the job again. A Monitor made on the restart with
apply_recommendation=True (or FRAGSCOPE_APPLY_RECOMMENDATION=1) before the first CUDA
allocation sets the recommended PYTORCH_CUDA_ALLOC_CONF and says so.

Between samples step() costs one comparison. Monitoring never fails training: a daemon that
is down or slow, an unreadable allocator, a corrupt recommendation file each give one message.
"""

import os
import sys

from fragscope import _monitor
from fragscope import _native
from fragscope import alloc_conf as _conf
from fragscope._monitor import _log
from fragscope._safe_file import write_file_safely

# This module's names since it was written; they live in fragscope._monitor now.
EXIT_CODE = _monitor.EXIT_CODE
RECOMMENDATION_FILE = _monitor.RECOMMENDATION_FILE
REQUEST_FILE = _monitor.REQUEST_FILE
TAKEN_SUFFIX = _monitor.TAKEN_SUFFIX
LEVELS = _monitor.LEVELS
ENV_APPLY = _monitor.ENV_APPLY
ENV_RUN_DIR = _monitor.ENV_RUN_DIR
ENV_REQUEST_DIR = _monitor.ENV_REQUEST_DIR
DEFAULT_REQUEST_DIR = _monitor.DEFAULT_REQUEST_DIR
_risk_source = _monitor._risk_source
_level_index = _monitor._level_index
_honoured_request = _monitor._honoured_request

# What the monitor recommends when it cannot replay the requests (no virtual GPU trace, or no
# setting of the grid does better): expandable segments end most fragmentation (PyTorch >= 2.1);
# PyTorch 1.13 has no such option, so there it caps block splitting instead.
FALLBACK_ALLOC_CONF = {"1.13": "max_split_size_mb:128", "2": "expandable_segments:True",
                       "newest": "expandable_segments:True"}


def _torch_version():
    """The allocator fragscope models for the running torch: "1.13", "2" or "newest"."""
    import torch
    return _conf.modelled_version(torch.__version__)


def _vgpu():
    """The active virtual GPU, or None (without importing torch when fragscope.torch is not
    loaded: it is, since this module lives in it)."""
    vt = sys.modules.get("fragscope.torch")
    gpu = vt.current() if vt is not None else None
    return gpu if gpu is not None and gpu.active else None


def read_recommendation(run_dir):
    """The recommendation dict in run_dir, or None when there is none. A file that is not a
    valid recommendation gives a message naming it and the fault, and None."""
    path, rec = _monitor.read_recommendation_object(run_dir)
    if rec is None:
        return None
    try:
        conf = rec.get("alloc_conf")
        if not isinstance(conf, str):
            raise ValueError("field 'alloc_conf': expected a string, got {!r}".format(conf))
        version = rec.get("torch_version", "newest")
        rec["alloc_conf"] = _native.load().canonical_alloc_conf(
            conf, version if version in ("1.13", "2", "newest") else "newest")
    except ValueError as e:
        _log("{} is not a valid recommendation ({}); ignored".format(path, e))
        return None
    return rec


def apply_recommendation(run_dir, environ=None, torch_version=None):
    """Sets the allocator settings from run_dir's recommendation under the name the running
    torch reads (PYTORCH_CUDA_ALLOC_CONF before 2.9, PYTORCH_ALLOC_CONF from 2.9 on:
    fragscope.alloc_conf); returns the setting applied or None. Call it before the first CUDA
    allocation (PyTorch reads the variable once); a virtual GPU reads it when made."""
    env = os.environ if environ is None else environ
    rec = read_recommendation(run_dir)
    if rec is None:
        return None
    conf = rec["alloc_conf"]
    if torch_version is None:
        import torch
        torch_version = torch.__version__
    if "torch" in sys.modules:
        cuda = sys.modules["torch"].cuda
        if cuda.is_available() and cuda.is_initialized():
            _log("CUDA is already initialized: the allocator settings {} from {} come too late "
                 "for this process; make the Monitor before the first allocation"
                 .format(conf, run_dir))
            return None
    before, _ = _conf.read(torch_version, environ=env)
    name = _conf.apply(conf, torch_version, environ=env)
    _log("applied the recommendation of step {} (rank {}: {}): {}={} (was {!r})".format(
        rec.get("step"), rec.get("worst_rank"), rec.get("worst_level"), name, conf, before))
    return conf


def restart_hint(environ=None, torch_version=None):
    """What to tell a user whose job the monitor stops for a torchrun restart, or "": since
    PyTorch 2.5 a restarted worker can read the previous attempt's rendezvous keys and fail to
    connect (PyTorch issue #135712) unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 is set (with
    `--rdzv-backend c10d`); docs/live-monitoring.md, "Launch with restarts left"."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RESTART_COUNT" not in environ:  # not under torchrun
        return ""
    if environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "") not in ("", "0"):
        return ""
    if torch_version is None:
        import torch
        torch_version = torch.__version__
    version = torch_version
    try:
        major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return ""
    if (major, minor) < (2, 5):
        return ""
    return ("torch {}: if the restart fails to connect its ranks (\"connectFullMesh failed\", "
            "\"Connection refused\"), launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "and --rdzv-backend c10d (PyTorch issue #135712; docs/live-monitoring.md)".format(
                version))


def recommend_alloc_conf(torch_version=None):
    """(setting, how) — the PYTORCH_CUDA_ALLOC_CONF for the requests seen so far: with a virtual
    GPU, `fragscope tune`'s replay of its request trace under the default grid, with the
    smallest device each setting fits on (bisection): the setting that fits on the smallest
    device, then with the lowest peak reserved, if it beats the current setting; else
    FALLBACK_ALLOC_CONF (docs/live-monitoring.md, "The recommendation")."""
    gpu = _vgpu()
    version = torch_version or (gpu.torch_version if gpu is not None else _torch_version())
    fallback = FALLBACK_ALLOC_CONF.get(version, FALLBACK_ALLOC_CONF["newest"])
    if gpu is None or not gpu.record_trace:
        return fallback, "fallback: no request trace (not on a virtual GPU)"
    n = _native.load()
    try:
        current = n.vgpu_alloc_conf()
        ranked = n.tune_requests(n.vgpu_request_trace(), gpu.capacity, gpu.used_by_others,
                                 version, [], 1, True)
    except (ValueError, RuntimeError) as e:
        return fallback, "fallback: tune failed ({})".format(e)

    def key(o):
        return (o["min_capacity"] if o["min_capacity"] is not None else 1 << 64,
                o["peak_reserved"])
    fitting = [o for o in ranked if not o["oom"]]
    mine = [o for o in ranked if o["conf"] == current]
    if not fitting:
        return fallback, "fallback: every setting runs out of memory on these requests"
    best = min(fitting, key=key)
    if best["conf"] == current or (mine and key(mine[0]) <= key(best)):
        return fallback, ("fallback: tune found nothing better than the current setting for "
                          "the requests so far")
    return best["conf"], "tune: fits on {} bytes, peak reserved {} (current: {})".format(
        best["min_capacity"], best["peak_reserved"],
        "{} bytes, peak {}".format(mine[0]["min_capacity"], mine[0]["peak_reserved"])
        if mine else "n/a")


class Monitor(_monitor.MonitorCore):
    """The monitor of a PyTorch training loop (the module's doc); its arguments are
    fragscope._monitor.MonitorCore's. `device` is a CUDA device index (default: the current
    one); `distributed`: None agrees over torch.distributed when it is initialized; the rank is
    $RANK and $LOCAL_RANK (torchrun sets them)."""

    framework = "torch"
    launcher = "torchrun"

    def _apply_recommendation(self, run_dir):
        return apply_recommendation(run_dir)

    def _before_exit(self):
        """Destroys the default process group, when one is still up, before the exit that
        torchrun restarts: every rank agreed to stop at the same step (and, after a framework's
        fit, has left its loop), so no collective is pending. Without it, gloo's worker threads can be
        torn down during interpreter finalization, which aborts the process ("terminate called
        without an active exception", SIGABRT instead of the exit code)."""
        torch = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None) if torch is not None else None
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - the exit must happen regardless
            _log("could not destroy the process group before exiting: {!r}".format(e))

    def _read_recommendation(self, run_dir):
        return read_recommendation(run_dir)

    def _attach_oom_observer(self):
        """Records a snapshot at an OOM for `fragscope explain --snapshot`: PyTorch >= 2.0's
        OOM observer on a CUDA device (PyTorch 1.13 has none: skipped), or on a virtual GPU
        its recorded OOM state at exit (hooked at the first sample)."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            _log("this PyTorch ({}) has no OOM observer: an OOM is not recorded"
                 .format(torch.__version__))
            return
        path = self.oom_snapshot

        def observer(device, alloc, device_alloc, device_free):
            try:
                import pickle
                # A name the monitor chose: a link planted there is refused (OSError, logged).
                write_file_safely(path, pickle.dumps(torch.cuda.memory._snapshot()),
                                  named_by_user=False)
                _log("out of memory on device {} ({} bytes requested, {} free): wrote {} "
                     "(fragscope analyze {}; fragscope explain LOG --snapshot {})".format(
                         device, alloc, device_free, path, path, path))
            except Exception as e:  # never make the OOM worse
                _log("cannot record the OOM snapshot: {!r}".format(e))
        attach(observer)
        self._oom_hooked = True

    def _hook_virtual_oom(self, gpu):
        import atexit
        path = self.oom_snapshot

        def at_exit():
            vt = sys.modules.get("fragscope.torch")
            if vt is None or vt.current() is not gpu:  # replaced by a later virtual GPU
                return
            try:
                if gpu.ooms():
                    gpu.dump_snapshot(path, named_by_user=False)
                    _log("the virtual GPU ran out of memory: wrote {} (fragscope analyze {}; "
                         "fragscope explain LOG --snapshot {})".format(path, path, path))
            except Exception as e:
                _log("cannot record the OOM snapshot: {!r}".format(e))
        atexit.register(at_exit)
        self._oom_hooked = True

    def attach(self, optimizer):
        """Calls step() after every optimizer.step(): a post-step hook where torch has one
        (>= 2.0), else a wrapper of optimizer.step. The step number is the count of steps."""
        counter = [0]

        def after(*_args, **_kwargs):
            self.step(counter[0])
            counter[0] += 1

        hook = getattr(optimizer, "register_step_post_hook", None)
        if hook is not None:
            return hook(after)
        inner = optimizer.step

        def wrapped(*args, **kwargs):
            out = inner(*args, **kwargs)
            after()
            return out
        optimizer.step = wrapped
        return None

    # -- reading the allocator ----------------------------------------------------------------
    def _read(self):
        from fragscope_agent import sample_from_memory_stats, summarize_segments
        gpu = _vgpu()
        if gpu is not None and not self._oom_hooked and self.record_oom:
            self._hook_virtual_oom(gpu)
        if gpu is not None:
            stats, (free, _total), segments = (gpu.memory_stats(), gpu.mem_get_info(),
                                               gpu.memory_snapshot())
            device = None
            if self.reset_peaks:
                gpu.reset_peak_memory_stats()
            uuid = "GPU-virtual-{}-{}".format(os.uname().nodename, self.local_rank)
        else:
            import torch
            if not torch.cuda.is_available():
                raise RuntimeError("no CUDA device and no virtual GPU")
            device = torch.cuda.current_device() if self.device is None else self.device
            free, _total = torch.cuda.mem_get_info(device)
            stats = torch.cuda.memory_stats(device)
            segments = torch.cuda.memory_snapshot()
            if self.reset_peaks:
                torch.cuda.reset_peak_memory_stats(device)
            from fragscope_agent import torch_device_uuid
            uuid = torch_device_uuid(torch, device) or "GPU-unknown"
        sample = sample_from_memory_stats(stats)
        sample.update(summarize_segments(segments, device=device, device_free_bytes=free))
        sample["device_free_bytes"] = int(free)
        return [("self", uuid, sample, True)]

    def _empty_cache(self):
        gpu = _vgpu()
        if gpu is not None:
            gpu.empty_cache()
        else:
            import torch
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    # -- the recommendation -------------------------------------------------------------------
    def _recommend(self, verdict):
        conf, how = recommend_alloc_conf()
        return {"alloc_conf": conf, "how": how,
                "torch_version": (_vgpu().torch_version if _vgpu() is not None
                                  else _torch_version())}

    def _describe(self, rec):
        return "PYTORCH_CUDA_ALLOC_CONF={}".format(rec["alloc_conf"])

    def _after_stop(self):
        hint = restart_hint()
        if hint:
            _log(hint)

    # -- agreement over torch.distributed -----------------------------------------------------
    def _dist(self):
        """torch.distributed when it is initialized (and distributed is not False), else
        None."""
        if self.distributed is False:
            return None
        try:
            import torch.distributed as dist
        except ImportError:
            return None
        return dist if dist.is_available() and dist.is_initialized() else None

    def _gather(self, values):
        """One all_reduce(MAX) of a len(values) x world_size tensor in which each rank fills
        its own column (every value is >= 0)."""
        dist = self._dist()
        if dist is None:
            return [list(values)]
        import torch
        world, rank, n = dist.get_world_size(), dist.get_rank(), len(values)
        t = torch.zeros(n * world, dtype=torch.int32)
        for i, v in enumerate(values):
            t[i * world + rank] = int(v)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        flat = t.tolist()
        return [[flat[i * world + r] for i in range(n)] for r in range(world)]

    def _pick_recommendation(self, rec, worst_rank):
        """Under torch.distributed, the worst rank's recommendation for every rank (its
        requests are the ones at risk)."""
        dist = self._dist()
        if dist is None:
            return rec
        box = [rec]
        dist.broadcast_object_list(box, src=worst_rank)
        mine = box[0]
        mine["checkpoint_saved"] = rec["checkpoint_saved"]  # each rank's own
        return mine

    def _barrier(self):
        dist = self._dist()
        if dist is not None:
            dist.barrier()
