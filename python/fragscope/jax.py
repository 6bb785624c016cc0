"""fragscope.jax.Monitor: the OOM forecaster inside a JAX training loop (docs/frameworks.md,
docs/live-monitoring.md, "JAX").

    from fragscope.jax import Monitor
    monitor = Monitor(save_checkpoint=save, run_dir=out)   # before the first computation
    for step, batch in enumerate(batches):
        params, opt_state = train_step(params, opt_state, batch)
        monitor.step(step)

The same arguments, samples, OOM risk, daemon, alerts and checkpoint-then-exit loop as
fragscope.torch.Monitor (fragscope._monitor.MonitorCore). Every `every` steps it reads
Device.memory_stats() of each local device (or of `device`: an index into jax.local_devices()
or a Device) — the BFC allocator's bytes_in_use, pool_bytes, largest_free_block_bytes,
bytes_limit, ... (fragscope_agent.sample_from_bfc_stats) — and forecasts each device; the
process's level is its worst device's. A backend whose memory_stats() returns None (JAX's CPU
backend does) has no allocator to read: the monitor says so once, and for that device sends
the bytes of its live arrays (jax.live_arrays(), as allocated_bytes) and the process's resident
memory (host_rss_bytes), forecasts nothing and never acts on it.

With several processes (jax.distributed), the processes agree on the worst level with one
multihost_utils.process_allgather per sample; one process needs no jax.distributed. At the
level, every process saves (save_checkpoint(step)), writes fragscope-recommendation.json with the
XLA client setting to restart with (XLA_PYTHON_CLIENT_ALLOCATOR=platform: no pool to fragment),
and exits with 75. A Monitor made on the restart with apply_recommendation=True (or
FRAGSCOPE_APPLY_RECOMMENDATION=1) before JAX sets up its devices sets the variable.

Importing this module imports jax (never torch). What JAX does not have is said where it
matters: no empty_cache() (empty_cache_first only calls shrink_batch), no peak reset
(reset_peaks is ignored), no OOM observer (record_oom is ignored).
"""
import os
import sys

from fragscope import _monitor
from fragscope._monitor import EXIT_CODE, RECOMMENDATION_FILE, REQUEST_FILE
from fragscope._monitor import _log, host_rss_bytes

try:
    import jax
except ImportError as _e:
    raise ImportError("fragscope.jax needs JAX, which this interpreter ({}) cannot import: "
                      "{}".format(sys.executable, _e)) from None

__all__ = ["Monitor", "device_memory_stats", "read_recommendation", "apply_recommendation",
           "RECOMMENDATION", "EXIT_CODE",
           "RECOMMENDATION_FILE", "REQUEST_FILE"]

#: The variables a JAX recommendation may set (the XLA client's allocator settings).
SETTINGS = ("XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_PREALLOCATE",
            "XLA_PYTHON_CLIENT_MEM_FRACTION")
#: What the monitor recommends: JAX has no request trace to replay, so the setting that leaves
#: no pool to fragment (each buffer allocated and freed as asked; slower).
RECOMMENDATION = {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}


def device_memory_stats(device):
    """device.memory_stats(): a dict of the allocator's statistics, or None where the backend
    keeps none. The seam the tests replace to play a device that fills up."""
    return device.memory_stats()


def _initialized():
    """True once JAX set up its backends (then XLA_PYTHON_CLIENT_* are read already)."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True  # cannot tell: say it may come too late


def read_recommendation(run_dir):
    """run_dir's recommendation when it is a valid JAX one, else None (a message says why)."""
    return _monitor.read_env_recommendation(run_dir, "jax", SETTINGS)


def apply_recommendation(run_dir, environ=None):
    """Sets the XLA client variables of run_dir's recommendation; returns them or None. Call
    it before JAX's first computation (it reads them when it sets up its devices)."""
    return _monitor.apply_env_recommendation(run_dir, "jax", SETTINGS, _initialized(),
                                             environ)


def _live_bytes_by_device():
    """{device: bytes of the live arrays' shards on it}."""
    out = {}
    for array in jax.live_arrays():
        try:
            devices = array.sharding.device_set
            if len(devices) == 1:
                (device,) = devices
                out[device] = out.get(device, 0) + int(array.nbytes)
                continue
            for shard in array.addressable_shards:
                out[shard.device] = out.get(shard.device, 0) + int(shard.data.nbytes)
        except Exception:  # an array deleted meanwhile
            continue
    return out


class Monitor(_monitor.EnvMonitorCore):
    """The monitor of a JAX training loop (the module's doc); its arguments are
    fragscope._monitor.MonitorCore's."""

    framework = "jax"
    settings = SETTINGS
    recommendation = RECOMMENDATION
    how = ("fallback: JAX keeps no request trace to replay; the platform allocator leaves no "
           "BFC pool to fragment (slower)")

    def _process_rank(self):
        # jax.process_index() would set up the backends (too early for jax.distributed and for
        # the recommendation): the rank is read at the first sample.
        return 0

    def _process_local_rank(self):
        return 0  # one process per host: each writes the recommendation into its run_dir

    def _initialized(self):
        return _initialized()

    def _devices(self):
        devices = jax.local_devices()
        if self.device is None:
            return devices
        if isinstance(self.device, int):
            return [devices[self.device]]
        return [self.device]

    def _read(self):
        if self.distributed is not False:
            self.rank = jax.process_index()
        out = []
        live = None
        host = os.uname().nodename
        for device in self._devices():
            uuid = "jax-{}-{}-{}".format(device.platform, host, device.id)
            key = "{}:{}".format(device.platform, device.id)
            stats = device_memory_stats(device)
            if stats:
                from fragscope_agent import sample_from_bfc_stats
                out.append((key, uuid, sample_from_bfc_stats(stats), True))
                continue
            if not getattr(self, "_said_no_stats", None):
                self._said_no_stats = True
                _log("JAX device {} ({} backend) reports no memory_stats(): there is no "
                     "allocator to read, so no OOM forecast for it; its samples carry the "
                     "bytes of its live arrays (allocated_bytes, from jax.live_arrays()) and "
                     "this process's resident memory (host_rss_bytes) only".format(
                         key, device.platform))
            if live is None:
                live = _live_bytes_by_device()
            sample = {"allocated_bytes": live.get(device, 0), "memory_stats": "none"}
            rss = host_rss_bytes()
            if rss is not None:
                sample["host_rss_bytes"] = rss
            out.append((key, uuid, sample, False))
        return out

    # -- agreement over jax.distributed -------------------------------------------------------
    def _gather(self, values):
        if jax.process_count() == 1:
            return [list(values)]
        import numpy as np
        from jax.experimental import multihost_utils
        rows = multihost_utils.process_allgather(np.asarray(values, dtype=np.int32))
        return [[int(v) for v in row] for row in np.asarray(rows).reshape(-1, len(values))]

    def _barrier(self):
        if self.distributed is not False and jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("fragscope-monitor")
