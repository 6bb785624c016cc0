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

import contextlib
import json
import os
import signal
import stat
import sys
import time

from fragscope import _native
from fragscope import alloc_conf as _conf
from fragscope._safe_file import write_file_safely

EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — torchrun restarts any non-zero exit
RECOMMENDATION_FILE = "fragscope-recommendation.json"
REQUEST_FILE = "fragscope-checkpoint-request"
TAKEN_SUFFIX = ".taken"  # a request being answered (renamed, so that a kill cannot replay it)
LEVELS = ("unknown", "ok", "watch", "warning", "critical")
ENV_APPLY = "FRAGSCOPE_APPLY_RECOMMENDATION"
ENV_RUN_DIR = "FRAGSCOPE_RUN_DIR"
ENV_REQUEST_DIR = "FRAGSCOPE_REQUEST_DIR"
DEFAULT_REQUEST_DIR = "/run/fragscope/requests"
# What the monitor recommends when it cannot replay the requests (no virtual GPU trace, or no
# setting of the grid does better): expandable segments end most fragmentation (PyTorch >= 2.1);
# PyTorch 1.13 has no such option, so there it caps block splitting instead.
FALLBACK_ALLOC_CONF = {"1.13": "max_split_size_mb:128", "2": "expandable_segments:True",
                       "newest": "expandable_segments:True"}


def _risk_source(verdict):
    """Where the OOM risk comes from (issue 31 item 5), when the reason does not say it."""
    why = verdict.get("risk_explanation")
    if not why or why in verdict["reason"]:
        return ""
    return "; OOM risk from: " + why


def _log(message):
    print("fragscope.monitor: " + message, file=sys.stderr, flush=True)


def _level_index(name, what="level"):
    if name not in LEVELS or name == "unknown":
        raise ValueError("{}: {!r} is not one of {}".format(what, name, ", ".join(LEVELS[1:])))
    return LEVELS.index(name)


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


def _honoured_request(path):
    """True for a checkpoint request the monitor acts on: a regular file (not a link) owned by
    root, by this process's user, or by the owner of its folder when only that user may write
    there (the node daemon's request folder). Another local user cannot make the job stop
    (docs/live-monitoring.md, "Trust on a node")."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        _log("{} is not a regular file: not a checkpoint request".format(path))
        return False
    if st.st_uid in (0, os.getuid()):
        return True
    # The daemon's hook writes as the daemon's user (DynamicUser under the shipped unit) into a
    # request folder only that user may write: its files count, a stranger's never do.
    try:
        folder = os.lstat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        folder = None
    if (folder is not None and stat.S_ISDIR(folder.st_mode) and folder.st_uid == st.st_uid
            and not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return True
    _log("{} belongs to uid {}, neither root, this job's user nor the owner of a request "
         "folder only it may write: ignored".format(path, st.st_uid))
    return False


def read_recommendation(run_dir):
    """The recommendation dict in run_dir, or None when there is none. A file that is not a
    valid recommendation gives a message naming it and the fault, and None."""
    path = os.path.join(run_dir, RECOMMENDATION_FILE)
    try:
        # No link followed, never blocked by a FIFO planted there; a regular file only.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        _log("cannot read {}: {}; ignored".format(path, e))
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _log("{} is not a regular file; ignored".format(path))
            return None
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(1 << 20)
    except OSError as e:
        _log("cannot read {}: {}; ignored".format(path, e))
        return None
    finally:
        if fd is not None:
            os.close(fd)
    try:
        rec = json.loads(data.decode("utf-8"))
        if not isinstance(rec, dict):
            raise ValueError("expected a JSON object")
        conf = rec.get("alloc_conf")
        if not isinstance(conf, str):
            raise ValueError("field 'alloc_conf': expected a string, got {!r}".format(conf))
        version = rec.get("torch_version", "newest")
        rec["alloc_conf"] = _native.load().canonical_alloc_conf(
            conf, version if version in ("1.13", "2", "newest") else "newest")
    except (ValueError, UnicodeDecodeError) as e:
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


class Monitor:
    """See the module's doc. Arguments:

    every              steps between samples (and collectives); all ranks must use the same
    level              the agreed level that triggers the action: "watch", "warning",
                       "critical"
    save_checkpoint    callable(step), or None; an exception is reported and the monitor
                       stops acting (no exit, no claim of a checkpoint)
    run_dir            where the recommendation, OOM snapshots and the request file live
                       (default $FRAGSCOPE_RUN_DIR or the working directory)
    action             "exit": sys.exit(exit_code) after saving (torchrun restarts);
                       "stop": step() returns True and `stopped` is set (adapters)
    exit_code          default EXIT_CODE (75)
    apply_recommendation  apply run_dir's recommendation now (default: $FRAGSCOPE_APPLY_
                       RECOMMENDATION == "1")
    empty_cache_first  at the level, first call empty_cache() once (and shrink_batch(step) if
                       given) and act only if the level is still reached at a later sample
    socket             the daemon's socket (default $FRAGSCOPE_AGENT_SOCKET or
                       /run/fragscope/agent.sock); samples go there only if it exists
    daemon_timeout     seconds a send may block (default 0.2)
    request_signal     a signal (e.g. signal.SIGUSR1) that requests a checkpoint, as
                       deploy/fragscope-checkpoint-request sends; None: do not install
    distributed        None: use torch.distributed when it is initialized; False: never
    device             CUDA device index (default: the current one)
    job                the job's name on the daemon's series (job_name; default
                       $FRAGSCOPE_JOB): the Grafana job view and the FragscopeJobRankAtRisk
                       alert group ranks by it
    """

    def __init__(self, every=50, level="warning", save_checkpoint=None, run_dir=None,
                 action="exit", exit_code=EXIT_CODE, apply_recommendation=None,
                 empty_cache_first=False, shrink_batch=None, socket=None, daemon_timeout=0.2,
                 request_signal=signal.SIGUSR1, distributed=None, device=None, job="",
                 reset_peaks=False, record_oom=True):
        if not isinstance(every, int) or every < 1:
            raise ValueError("every: must be an int >= 1, got {!r}".format(every))
        self.every = every
        self.level = _level_index(level)
        if action not in ("exit", "stop"):
            raise ValueError("action: {!r} is not one of 'exit', 'stop'".format(action))
        self.action = action
        self.exit_code = int(exit_code)
        if save_checkpoint is not None and not callable(save_checkpoint):
            raise TypeError("save_checkpoint: expected a callable(step) or None, got {!r}"
                            .format(save_checkpoint))
        self.save_checkpoint = save_checkpoint
        self.run_dir = run_dir or os.environ.get(ENV_RUN_DIR) or os.getcwd()
        self.empty_cache_first = empty_cache_first
        self.shrink_batch = shrink_batch
        self.socket = socket or os.environ.get("FRAGSCOPE_AGENT_SOCKET",
                                               "/run/fragscope/agent.sock")
        self.daemon_timeout = daemon_timeout
        self.distributed = distributed
        self.device = device
        self.job = job or os.environ.get("FRAGSCOPE_JOB", "")
        self.reset_peaks = reset_peaks
        self.rank = int(os.environ.get("RANK", "0"))
        # Checkpoint requests: the run directory's file, and the node's per-process file that
        # deploy/fragscope-checkpoint-request writes.
        self._request_paths = (os.path.join(self.run_dir, REQUEST_FILE), os.path.join(
            os.environ.get(ENV_REQUEST_DIR, DEFAULT_REQUEST_DIR), str(os.getpid())))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._next = 0  # the next step that samples
        self._forecasts = None
        self._client = None
        self._soft_done = False
        self._requested = False
        self.stopped = False  # set when the action ran (or failed: see `disabled`)
        self.disabled = False  # set when the checkpoint callback failed
        self.last = None  # the last sample's {step, level, worst, levels, reason, ...}
        self.history = []  # (step, own level, agreed level), one per sample
        self._logged_level = None  # the agreed level last logged
        # An adapter's own agreement across ranks (the Lightning callback's, through its
        # strategy): callable(own level, requested) -> [(level, requested)] per rank.
        self.agree_with = None
        self.applied = None
        if apply_recommendation is None:
            apply_recommendation = os.environ.get(ENV_APPLY, "") == "1"
        if apply_recommendation:
            self.applied = globals()["apply_recommendation"](self.run_dir)
        # One stop per run directory: after a restart with the fix, stopping again for the same
        # risk would only restart the job again. The monitor goes on sampling, sending and
        # warning; a node's checkpoint request still acts. Delete the file to re-arm.
        # Only a valid recommendation counts: garbage (or a FIFO, a link) there is ignored.
        self.acted_before = read_recommendation(self.run_dir) is not None
        # A request taken by a run that was killed while it saved was being answered: the
        # restart does not answer it again.
        for path in self._request_paths:
            with contextlib.suppress(OSError):
                os.unlink(path + TAKEN_SUFFIX)
        self._said_acted = False
        self.oom_snapshot = os.path.join(self.run_dir,
                                         "fragscope-oom-rank{}.pickle".format(self.rank))
        self._oom_hooked = False
        self.record_oom = record_oom
        if record_oom:
            self._attach_oom_observer()
        self._previous_handler = None
        if request_signal is not None:
            try:
                previous = signal.signal(request_signal, self._on_request_signal)
                if callable(previous):  # the program's own handler still runs
                    self._previous_handler = previous
            except ValueError:  # not the main thread
                _log("cannot install the checkpoint-request signal outside the main thread")

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

    # -- the training loop's call -----------------------------------------------------------
    def step(self, step):
        """Call once per training step, after optimizer.step(). Returns True when the monitor
        stopped the run (action="stop"); with action="exit" it exits the process instead."""
        if step < self._next:
            return False
        return self._sample(step)

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

    def exit_if_stopped(self):
        """After a framework's fit()/train() returned: exits with exit_code if the monitor
        stopped the run (so that torchrun restarts it), else returns."""
        if self.stopped:
            sys.stdout.flush()
            sys.exit(self.exit_code)

    def request_checkpoint(self):
        """Asks for the action at the next sample (what the signal handler does)."""
        self._requested = True

    def _on_request_signal(self, signum, frame):
        self._requested = True
        if self._previous_handler is not None:
            self._previous_handler(signum, frame)

    # -- sampling ---------------------------------------------------------------------------
    def _sample(self, step):
        self._next = (step // self.every + 1) * self.every
        if self.stopped or self.disabled:
            return self.stopped
        own, verdict, sample = self._forecast(step)
        for path in self._request_paths:
            if _honoured_request(path):
                self._requested = True
        requested = self._requested
        if requested:
            verdict["reason"] = "checkpoint requested on the node; " + verdict["reason"]
        levels = self._agree(own, requested)
        worst = max(lv for lv, _ in levels)
        any_request = any(r for _, r in levels)
        self.last = dict(step=step, level=LEVELS[own], worst=LEVELS[worst],
                         levels=[LEVELS[lv] for lv, _ in levels], requested=any_request,
                         steps_to_oom=verdict.get("steps_to_oom"), reason=verdict["reason"],
                         risk=verdict.get("risk"),
                         risk_explanation=verdict.get("risk_explanation"))
        self.history.append((step, LEVELS[own], LEVELS[worst]))
        self._send(step, own, verdict, sample)
        if worst != self._logged_level:  # a level is logged when it changes, not per sample
            if self._logged_level is not None or worst > LEVELS.index("ok"):
                _log("step {}: {} (was {}); worst rank {} {}; this rank: {}".format(
                    step, LEVELS[worst], LEVELS[self._logged_level or 0],
                    max(range(len(levels)), key=lambda r: levels[r][0]),
                    "agreed over {} ranks".format(len(levels)), verdict["reason"])
                     + _risk_source(verdict))
            self._logged_level = worst
        if worst < self.level and not any_request:
            return False
        if self.acted_before and not any_request:
            if not self._said_acted:
                self._said_acted = True
                _log("step {}: not stopping again: this run directory already has {} (delete "
                     "it to re-arm)".format(step, RECOMMENDATION_FILE))
            return False
        if self.empty_cache_first and not self._soft_done and not any_request:
            self._soft_done = True
            self._empty_cache()
            if self.shrink_batch is not None:
                self._call("shrink_batch", self.shrink_batch, step)
            _log("step {}: emptied the cache once; acting if the level stays".format(step))
            return False
        return self._act(step, levels, verdict)

    def _forecast(self, step):
        """(own level index, verdict dict, sample dict or None)."""
        try:
            sample = self._read()
        except Exception as e:  # monitoring never stops training
            if self._forecasts is not False:
                _log("cannot read the allocator state: {!r}; forecasting off".format(e))
            self._forecasts = False
            return 0, {"reason": "no allocator state", "steps_to_oom": None}, None
        if self._forecasts is None:
            self._forecasts = _native.load().LiveForecasts(4)
        if self._forecasts is False:
            return 0, {"reason": "no allocator state", "steps_to_oom": None}, sample
        verdict = self._forecasts.observe("self", step, sample)
        return LEVELS.index(verdict["level"]), verdict, sample

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
        sample = sample_from_memory_stats(stats)
        sample.update(summarize_segments(segments, device=device, device_free_bytes=free))
        sample["device_free_bytes"] = int(free)
        return sample

    def _agree(self, own, requested):
        """[(level, requested)] per rank: one all_reduce(MAX) of a 2 x world_size tensor in
        which each rank fills its own column (or the adapter's agree_with)."""
        if self.agree_with is not None:
            return self.agree_with(own, requested)
        dist = None
        if self.distributed is not False:
            try:
                import torch.distributed as dist
                if not (dist.is_available() and dist.is_initialized()):
                    dist = None
            except ImportError:
                dist = None
        if dist is None:
            return [(own, requested)]
        import torch
        world, rank = dist.get_world_size(), dist.get_rank()
        t = torch.zeros(2 * world, dtype=torch.int32)
        t[rank] = own
        t[world + rank] = int(requested)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        values = t.tolist()
        return [(values[r], bool(values[world + r])) for r in range(world)]

    def _send(self, step, own, verdict, sample):
        if sample is None or not os.path.exists(self.socket):
            return
        try:
            if self._client is None:
                from fragscope_agent import AgentClient
                self._client = AgentClient(self.socket, job=self.job, rank=self.rank,
                                           timeout=self.daemon_timeout)
            gpu = _vgpu()
            uuid = ("GPU-virtual-{}-{}".format(os.uname().nodename, self.local_rank)
                    if gpu is not None else self._cuda_uuid())
            fields = dict(sample, step=step, device_uuid=uuid, forecast_level=LEVELS[own])
            if verdict.get("steps_to_oom") is not None:
                fields["steps_to_oom"] = verdict["steps_to_oom"]
            self._client.send_sample(fields)
        except Exception as e:  # a slow or broken daemon never stops training
            _log("cannot send to {}: {!r}".format(self.socket, e))

    def _cuda_uuid(self):
        import torch
        from fragscope_agent import torch_device_uuid
        return torch_device_uuid(torch, torch.cuda.current_device()) or "GPU-unknown"

    def _empty_cache(self):
        gpu = _vgpu()
        if gpu is not None:
            gpu.empty_cache()
        else:
            import torch
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    def _call(self, what, fn, step):
        try:
            fn(step)
            return None
        except Exception as e:
            _log("step {}: {} raised {!r}".format(step, what, e))
            return e

    # -- the action -------------------------------------------------------------------------
    def _act(self, step, levels, verdict):
        worst = max(lv for lv, _ in levels)
        worst_rank = max(range(len(levels)), key=lambda r: levels[r][0])
        # Requests are taken (renamed) before the save: a kill during it cannot leave one for
        # the restart to act on again; a failed save gives them back.
        taken = []
        for path in self._request_paths:
            if _honoured_request(path):
                with contextlib.suppress(OSError):
                    os.rename(path, path + TAKEN_SUFFIX)
                    taken.append(path)
        error = None
        if self.save_checkpoint is not None:
            error = self._call("save_checkpoint", self.save_checkpoint, step)
        conf, how = recommend_alloc_conf()
        rec = {
            "format": "fragscope-recommendation", "version": 1,
            "step": step, "rank": self.rank, "worst_rank": worst_rank,
            "worst_level": LEVELS[worst],
            "levels": [LEVELS[lv] for lv, _ in levels],
            "node_request": any(r for _, r in levels),
            "reason": verdict.get("reason", ""),
            "steps_to_oom": verdict.get("steps_to_oom"),
            "alloc_conf": conf, "how": how,
            "torch_version": (_vgpu().torch_version if _vgpu() is not None
                              else _torch_version()),
            "checkpoint_saved": error is None and self.save_checkpoint is not None,
            "checkpoint_error": None if error is None else repr(error),
            "time": time.time(),
        }
        rec = self._pick_recommendation(rec, worst_rank)
        # A checkpoint counts only if every rank's was written: a restart from a mix of new
        # and old checkpoints would corrupt the run, so one failure stops every rank's action.
        failed = self._failed_ranks(error is not None)
        rec["checkpoint_failed_ranks"] = failed
        if failed:
            rec["checkpoint_saved"] = False
            if error is None:
                rec["checkpoint_error"] = "failed on rank(s) {}".format(failed)
        if failed:
            # Nothing is claimed: no recommendation (the run directory stays armed), the node's
            # request stays for the next sample, and the monitor tries again there.
            for path in taken:
                with contextlib.suppress(OSError):
                    os.rename(path + TAKEN_SUFFIX, path)
            self._barrier()
            _log("step {}: the checkpoint failed on rank(s) {}, so no rank stops and nothing is "
                 "claimed as saved; the monitor tries again at its next sample".format(
                     step, failed))
            return False
        for path in taken:  # answered: a restart must not act on it again
            with contextlib.suppress(OSError):
                os.unlink(path + TAKEN_SUFFIX)
        self._requested = False
        if self.local_rank == 0:
            self._write(rec)
        self._barrier()
        self.stopped = True
        _log("step {}: saved={}; recommended PYTORCH_CUDA_ALLOC_CONF={} ({}{}); {}".format(
            step, rec["checkpoint_saved"], rec["alloc_conf"], rec["how"],
            "" if rec["rank"] == self.rank else ", from rank {}".format(rec["rank"]),
            "exiting with {} for torchrun to restart".format(self.exit_code)
            if self.action == "exit" else "stopping"))
        hint = restart_hint()
        if hint:
            _log(hint)
        if self.action == "exit":
            sys.stdout.flush()
            sys.exit(self.exit_code)
        return True

    def _pick_recommendation(self, rec, worst_rank):
        """Under torch.distributed, the worst rank's recommendation for every rank (its
        requests are the ones at risk)."""
        try:
            import torch.distributed as dist
            if self.distributed is False or not dist.is_initialized():
                return rec
            box = [rec]
            dist.broadcast_object_list(box, src=worst_rank)
            mine = box[0]
            mine["checkpoint_saved"] = rec["checkpoint_saved"]  # each rank's own
            return mine
        except ImportError:
            return rec

    def _failed_ranks(self, failed):
        """The ranks whose checkpoint failed: one all_reduce(MAX) under torch.distributed."""
        try:
            import torch.distributed as dist
            if self.distributed is False or not dist.is_initialized():
                return [self.rank] if failed else []
        except ImportError:
            return [self.rank] if failed else []
        import torch
        t = torch.zeros(dist.get_world_size(), dtype=torch.int32)
        t[dist.get_rank()] = int(failed)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [r for r, v in enumerate(t.tolist()) if v]

    def _barrier(self):
        try:
            import torch.distributed as dist
            if self.distributed is not False and dist.is_initialized():
                dist.barrier()
        except ImportError:
            pass

    def _write(self, rec):
        path = os.path.join(self.run_dir, RECOMMENDATION_FILE)
        try:
            os.makedirs(self.run_dir, exist_ok=True)
            # A new temporary renamed into place; a link planted at the name is refused
            # (fragscope._safe_file), never written through.
            write_file_safely(path, json.dumps(rec, indent=1).encode("utf-8"),
                              named_by_user=False)
        except OSError as e:
            _log("cannot write {}: {}".format(path, e))
