"""The framework-neutral half of fragscope's training-loop monitors (docs/live-monitoring.md).

``MonitorCore`` holds everything fragscope.torch.Monitor, fragscope.jax.Monitor and
fragscope.keras.Monitor share: the constructor's arguments, step() every `every` steps, the OOM
risk from fragscope's own forecaster (fragscope._core.LiveForecasts, the daemon's code), the
samples sent to `fragscope serve`, node checkpoint requests, the level logged when it changes,
and the checkpoint-then-exit action with the processes' agreement. A framework's subclass says
how to read its allocator (``_read``), how its processes agree (``_agree`` and friends), what it
recommends and how the restart applies it. Importing this module imports no framework.

Between samples step() costs one comparison. Monitoring never fails training: a daemon that is
down or slow, an unreadable allocator, a corrupt recommendation file each give one message.
"""

import atexit
import contextlib
import gc
import io
import json
import os
import re
import signal
import stat
import sys
import time

from fragscope import _native
from fragscope._safe_file import write_file_safely

EXIT_CODE = 75  # EX_TEMPFAIL: "try again" — torchrun (and most launchers) restart non-zero exits
RECOMMENDATION_FILE = "fragscope-recommendation.json"
REQUEST_FILE = "fragscope-checkpoint-request"
TAKEN_SUFFIX = ".taken"  # a request being answered (renamed, so that a kill cannot replay it)
LEVELS = ("unknown", "ok", "watch", "warning", "critical")
ENV_APPLY = "FRAGSCOPE_APPLY_RECOMMENDATION"
ENV_RUN_DIR = "FRAGSCOPE_RUN_DIR"
ENV_REQUEST_DIR = "FRAGSCOPE_REQUEST_DIR"
DEFAULT_REQUEST_DIR = "/run/fragscope/requests"


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


def read_recommendation_object(run_dir):
    """(path, dict) of run_dir's recommendation file, (path, None) when there is none or it is
    not a JSON object (a message names the file and the fault). Never follows a link, never
    blocks on a FIFO planted there; reads at most 1 MiB."""
    path = os.path.join(run_dir, RECOMMENDATION_FILE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return path, None
    except OSError as e:
        _log("cannot read {}: {}; ignored".format(path, e))
        return path, None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            _log("{} is not a regular file; ignored".format(path))
            return path, None
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = f.read(1 << 20)
    except OSError as e:
        _log("cannot read {}: {}; ignored".format(path, e))
        return path, None
    finally:
        if fd is not None:
            os.close(fd)
    try:
        rec = json.loads(data.decode("utf-8"))
        if not isinstance(rec, dict):
            raise ValueError("expected a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        _log("{} is not a valid recommendation ({}); ignored".format(path, e))
        return path, None
    return path, rec


# -- recommendations made of environment variables (JAX, TensorFlow) -----------------------------
# A recommendation file lives in a directory other people's tools may write to: only these
# names, with values of this shape, are ever set from it.
_ENV_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def read_env_recommendation(run_dir, framework, allowed):
    """run_dir's recommendation when it is one for `framework` whose "env" sets only names in
    `allowed` to plain values; else None (a message says why)."""
    path, rec = read_recommendation_object(run_dir)
    if rec is None:
        return None
    env = rec.get("env")
    problem = None
    if rec.get("framework") != framework:
        problem = "made for {!r}, not {}".format(rec.get("framework"), framework)
    elif not isinstance(env, dict) or not env:
        problem = "field 'env': expected an object of variables"
    else:
        for name, value in env.items():
            if name not in allowed:
                problem = "field 'env': {!r} is not one of {}".format(name, ", ".join(allowed))
            elif not isinstance(value, str) or not _ENV_VALUE.match(value):
                problem = "field 'env': {}={!r} is not a plain value".format(name, value)
    if problem is not None:
        _log("{} is not a valid recommendation ({}); ignored".format(path, problem))
        return None
    return rec


def apply_env_recommendation(run_dir, framework, allowed, initialized, environ=None):
    """Sets the variables of run_dir's recommendation for `framework` (read_env_recommendation)
    in `environ` (default os.environ); returns the dict applied, or None. `initialized`: true
    when the framework already read its variables (then nothing is set, and a message says the
    setting comes too late for this process)."""
    env = os.environ if environ is None else environ
    rec = read_env_recommendation(run_dir, framework, allowed)
    if rec is None:
        return None
    setting = " ".join("{}={}".format(k, v) for k, v in sorted(rec["env"].items()))
    if initialized:
        _log("{} already set up its devices: the setting {} from {} comes too late for this "
             "process; make the Monitor before the first computation".format(
                 framework, setting, run_dir))
        return None
    before = {k: env.get(k) for k in rec["env"]}
    env.update(rec["env"])
    _log("applied the recommendation of step {} (rank {}: {}): {} (was {})".format(
        rec.get("step"), rec.get("worst_rank"), rec.get("worst_level"), setting,
        ", ".join("{}={!r}".format(k, v) for k, v in sorted(before.items()))))
    return dict(rec["env"])


def host_rss_bytes():
    """This process's resident set (VmRSS of /proc/self/status) in bytes, or None."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _exit_code_at_shutdown(code):
    """Makes `code` the process's exit status once the interpreter starts to shut down: an exit
    handler registered now runs first at exit; it runs every other exit handler (so logging,
    frameworks and the program's own handlers finish as usual), flushes every open writable
    file, then leaves with os._exit(code) — skipping only the interpreter's final teardown.
    That teardown destroys C++ objects of the frameworks, and some abort there: gloo's threads
    after a distributed run ("terminate called without an active exception", PyTorch issue
    #190489), which turns the 75 a launcher restarts on into a SIGABRT after the checkpoint."""
    def finish():
        atexit.unregister(finish)
        try:
            atexit._run_exitfuncs()
        finally:
            for obj in gc.get_objects():
                try:
                    if isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
                        obj.flush()
                except Exception:  # noqa: BLE001 - one file that cannot flush stops nothing
                    pass
            os._exit(code)
    atexit.register(finish)


class MonitorCore:
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
    distributed        None: agree with the other processes when the framework runs several;
                       False: never
    device             which device to read (framework's meaning; default: the current one,
                       under JAX every local device)
    job                the job's name on the daemon's series (job_name; default
                       $FRAGSCOPE_JOB): the Grafana job view and the FragscopeJobRankAtRisk
                       alert group ranks by it
    reset_peaks        reset the framework's peak counters after each sample, where it can
    record_oom         record the allocator's state at an OOM, where the framework lets it

    Thread-safety: one Monitor per training process, called from its training loop's thread.
    """

    #: The framework's name in messages and recommendation files.
    framework = ""
    #: Who restarts the job after the exit, in messages.
    launcher = "the launcher"

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
        self.applied = None
        if apply_recommendation is None:
            apply_recommendation = os.environ.get(ENV_APPLY, "") == "1"
        if apply_recommendation:  # first: before anything here could set up a device
            self.applied = self._apply_recommendation(self.run_dir)
        self.rank = self._process_rank()
        # Checkpoint requests: the run directory's file, and the node's per-process file that
        # deploy/fragscope-checkpoint-request writes.
        self._request_paths = (os.path.join(self.run_dir, REQUEST_FILE), os.path.join(
            os.environ.get(ENV_REQUEST_DIR, DEFAULT_REQUEST_DIR), str(os.getpid())))
        self.local_rank = self._process_local_rank()
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
        # One stop per run directory: after a restart with the fix, stopping again for the same
        # risk would only restart the job again. The monitor goes on sampling, sending and
        # warning; a node's checkpoint request still acts. Delete the file to re-arm.
        # Only a valid recommendation counts: garbage (or a FIFO, a link) there is ignored.
        self.acted_before = self._read_recommendation(self.run_dir) is not None
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

    # -- what a framework's monitor provides --------------------------------------------------
    def _process_rank(self):
        return int(os.environ.get("RANK", "0"))

    def _process_local_rank(self):
        return int(os.environ.get("LOCAL_RANK", "0"))

    def _apply_recommendation(self, run_dir):
        """Applies run_dir's recommendation before the framework allocates; returns it or
        None."""
        raise NotImplementedError

    def _read_recommendation(self, run_dir):
        """run_dir's recommendation when it is a valid one for this framework, else None."""
        raise NotImplementedError

    def _attach_oom_observer(self):
        """Records the allocator's state at an OOM, where the framework can."""

    def _read(self):
        """[(series key, device_uuid, sample dict, forecast)], one per monitored device; a
        sample with forecast False has no allocator figures: it is sent, never forecast (its
        level is "unknown"). May raise: the monitor then says so once and stops forecasting."""
        raise NotImplementedError

    def _recommend(self, verdict):
        """The framework's fields of the recommendation (at least "how")."""
        raise NotImplementedError

    def _describe(self, rec):
        """The recommended setting, in words, for the message at the stop."""
        raise NotImplementedError

    def _after_stop(self):
        """Anything the framework's users must know after the stop (a launcher quirk)."""

    def _empty_cache(self):
        """Gives cached device memory back, where the framework can."""

    def _gather(self, values):
        """Every process's list of ints (same length everywhere), in rank order: a collective
        across the job's processes, or [values] for one process."""
        return [list(values)]

    def _pick_recommendation(self, rec, worst_rank):
        """The recommendation every process writes: the worst rank's where it differs."""
        return rec

    def _barrier(self):
        """Waits for every process (nothing for one process)."""

    # -- the training loop's call -----------------------------------------------------------
    def step(self, step):
        """Call once per training step, after the optimizer's update. Returns True when the
        monitor stopped the run (action="stop"); with action="exit" it exits the process
        instead."""
        if step < self._next:
            return False
        return self._sample(step)

    def exit_if_stopped(self):
        """After a framework's fit()/train() returned: exits with exit_code if the monitor
        stopped the run (so that the launcher restarts it), else returns."""
        if self.stopped:
            self._exit()

    # The exit a launcher restarts: SystemExit, so that the program's finally blocks, its
    # non-daemon threads and its exit handlers run as for any exit; then _exit_code_at_shutdown
    # makes the code the launcher sees exactly exit_code. False for tests that catch the
    # SystemExit in-process.
    _exact_exit = True

    def _exit(self):
        self._before_exit()
        sys.stdout.flush()
        if self._exact_exit:
            _exit_code_at_shutdown(self.exit_code)
        sys.exit(self.exit_code)

    def _before_exit(self):
        """What the framework needs released before the process exits (a subclass's)."""

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
        own, verdict, readings = self._forecast(step)
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
        self._send(step, readings)
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
        """(own level index, the worst device's verdict dict, readings for _send or None): the
        worst level over this process's devices."""
        try:
            devices = self._read()
        except Exception as e:  # monitoring never stops training
            if self._forecasts is not False:
                _log("cannot read the allocator state: {!r}; forecasting off".format(e))
            self._forecasts = False
            return 0, {"reason": "no allocator state", "steps_to_oom": None}, None
        if self._forecasts is None:
            self._forecasts = _native.load().LiveForecasts(max(4, len(devices)))
        own, verdict, readings = 0, None, []
        for key, uuid, sample, forecast in devices:
            if not forecast:
                v = {"reason": "no allocator statistics on {}".format(uuid),
                     "steps_to_oom": None}
                level = 0
            elif self._forecasts is False:
                v = {"reason": "no allocator state", "steps_to_oom": None}
                level = 0
            else:
                v = self._forecasts.observe(key, step, sample)
                level = LEVELS.index(v["level"])
            readings.append((uuid, level, v, sample))
            if verdict is None or level > own:
                own, verdict = level, v
        if verdict is None:
            verdict = {"reason": "no allocator figures on any device", "steps_to_oom": None}
        return own, verdict, readings

    def _agree(self, own, requested):
        """[(level, requested)] per rank, through the adapter's agree_with, else the
        framework's collective (_gather) unless distributed is False."""
        if self.agree_with is not None:
            return self.agree_with(own, requested)
        if self.distributed is False:
            return [(own, requested)]
        return [(int(lv), bool(r)) for lv, r in self._gather([own, int(requested)])]

    def _failed_ranks(self, failed):
        """The ranks whose checkpoint failed."""
        if self.distributed is False:
            return [self.rank] if failed else []
        return [r for r, (v,) in enumerate(self._gather([int(failed)])) if v]

    def _send(self, step, readings):
        if not readings or not os.path.exists(self.socket):
            return
        try:
            if self._client is None:
                from fragscope_agent import AgentClient
                self._client = AgentClient(self.socket, job=self.job, rank=self.rank,
                                           timeout=self.daemon_timeout)
            for uuid, level, verdict, sample in readings:
                fields = dict(sample, step=step, device_uuid=uuid, forecast_level=LEVELS[level])
                if verdict.get("steps_to_oom") is not None:
                    fields["steps_to_oom"] = verdict["steps_to_oom"]
                self._client.send_sample(fields)
        except Exception as e:  # a slow or broken daemon never stops training
            _log("cannot send to {}: {!r}".format(self.socket, e))

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
        rec = {
            "format": "fragscope-recommendation", "version": 1,
            "step": step, "rank": self.rank, "worst_rank": worst_rank,
            "worst_level": LEVELS[worst],
            "levels": [LEVELS[lv] for lv, _ in levels],
            "node_request": any(r for _, r in levels),
            "reason": verdict.get("reason", ""),
            "steps_to_oom": verdict.get("steps_to_oom"),
        }
        rec.update(self._recommend(verdict))
        rec.update({
            "checkpoint_saved": error is None and self.save_checkpoint is not None,
            "checkpoint_error": None if error is None else repr(error),
            "time": time.time(),
        })
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
        _log("step {}: saved={}; recommended {} ({}{}); {}".format(
            step, rec["checkpoint_saved"], self._describe(rec), rec["how"],
            "" if rec["rank"] == self.rank else ", from rank {}".format(rec["rank"]),
            "exiting with {} for {} to restart".format(self.exit_code, self.launcher)
            if self.action == "exit" else "stopping"))
        self._after_stop()
        if self.action == "exit":
            self._exit()
        return True

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


class EnvMonitorCore(MonitorCore):
    """A MonitorCore whose recommendation is environment variables the framework reads when it
    sets up its devices (JAX's XLA client, TensorFlow): the subclass names them (`settings`),
    the fallback it recommends (`recommendation`, with `how`) and says whether the framework is
    set up yet (`_initialized`)."""

    settings = ()
    recommendation = {}
    how = ""

    def _initialized(self):
        raise NotImplementedError

    def _apply_recommendation(self, run_dir):
        return apply_env_recommendation(run_dir, self.framework, self.settings,
                                        self._initialized())

    def _read_recommendation(self, run_dir):
        return read_env_recommendation(run_dir, self.framework, self.settings)

    def _recommend(self, verdict):
        return {"framework": self.framework, "env": dict(self.recommendation),
                "how": self.how}

    def _describe(self, rec):
        return " ".join("{}={}".format(k, v) for k, v in sorted(rec["env"].items()))
