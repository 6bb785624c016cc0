"""fragscope.keras: the OOM forecaster in a Keras model.fit on TensorFlow (docs/frameworks.md,
docs/live-monitoring.md, "Keras").

    from fragscope.keras import MonitorCallback
    callback = MonitorCallback(run_dir=out)            # the Monitor's arguments
    model.fit(x, y, epochs=10, callbacks=[callback])
    callback.exit_if_stopped()                         # exit 75 so that the launcher restarts

MonitorCallback runs Monitor.step(step) after every training batch (on_train_batch_end; the
step is the optimizer's iteration count, so it goes on from a restored checkpoint). At the
agreed level it saves the Keras way — model.save(<run_dir>/fragscope-step<N>.keras), unless
save_checkpoint is given — and stops the Keras way: model.stop_training = True, so fit()
returns after this batch. It takes any fragscope monitor (monitor=...): under Keras's JAX
backend pass a fragscope.jax.Monitor.

fragscope.keras.Monitor reads tf.config.experimental.get_memory_info(device) — bytes in use and
their peak, all TensorFlow tells of its allocator — for every GPU, else CPU:0 (or `device`,
e.g. "GPU:1"). The BFC allocator's pool, largest free chunk and chunk map are not reachable
from Python: the monitor says so once, forecasts a shortage (the peak in use growing towards the
limit, where the limit is known: a GPU's logical memory_limit, or TF_CPU_BFC_MEM_LIMIT_IN_MB
under TF_CPU_ALLOCATOR_USE_BFC=true) and cannot see fragmentation; `fragscope explain` reads
all of it from the allocator's OOM dump. The recommendation is TF_GPU_ALLOCATOR=cuda_malloc_async
(CUDA's pool in place of BFC chunks); applied on the restart before TensorFlow sets up its
devices. One process only: under a multi-worker tf.distribute strategy the workers do not
agree yet (the monitor says so once).

Importing this module imports TensorFlow and Keras (never torch).
"""
import json
import os
import sys

from fragscope import _monitor
from fragscope._monitor import EXIT_CODE, RECOMMENDATION_FILE, REQUEST_FILE
from fragscope._monitor import _log

try:
    import keras
    import tensorflow as tf
except ImportError as _e:
    raise ImportError("fragscope.keras needs TensorFlow and Keras, which this interpreter ({}) "
                      "cannot import: {}".format(sys.executable, _e)) from None

__all__ = ["Monitor", "MonitorCallback", "memory_info", "read_recommendation",
           "apply_recommendation", "RECOMMENDATION", "EXIT_CODE",
           "RECOMMENDATION_FILE", "REQUEST_FILE"]

#: The variables a TensorFlow recommendation may set.
SETTINGS = ("TF_GPU_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH")
#: What the monitor recommends: TensorFlow keeps no request trace to replay; CUDA's
#: stream-ordered pool maps memory per request instead of carving BFC chunks.
RECOMMENDATION = {"TF_GPU_ALLOCATOR": "cuda_malloc_async"}
MiB = 1 << 20


def memory_info(device):
    """tf.config.experimental.get_memory_info(device): {"current", "peak"} in bytes; raises
    ValueError where the device keeps no statistics. The seam the tests replace to play a
    device that fills up."""
    return tf.config.experimental.get_memory_info(device)


def _initialized():
    """True once TensorFlow set up its devices (then TF_GPU_ALLOCATOR is read already)."""
    try:
        from tensorflow.python.eager import context
        return bool(context.context()._initialized)
    except (ImportError, AttributeError):
        return True  # cannot tell: say it may come too late


def read_recommendation(run_dir):
    """run_dir's recommendation when it is a valid TensorFlow one, else None."""
    return _monitor.read_env_recommendation(run_dir, "tensorflow", SETTINGS)


def apply_recommendation(run_dir, environ=None):
    """Sets the variables of run_dir's recommendation; returns them or None. Call it before
    TensorFlow sets up its devices (the first op or tf.config.list_logical_devices())."""
    return _monitor.apply_env_recommendation(run_dir, "tensorflow", SETTINGS, _initialized(),
                                             environ)


def device_limit_bytes(device):
    """The allocator's limit on `device` ("GPU:0", "CPU:0") when TensorFlow was told one, else
    None: a GPU's logical-device memory_limit (MiB), or TF_CPU_BFC_MEM_LIMIT_IN_MB for the CPU
    when TF_CPU_ALLOCATOR_USE_BFC is true."""
    kind, _, index = device.upper().rpartition("/")[2].partition(":")
    if kind == "CPU":
        if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() not in ("true", "1"):
            return None
        try:
            return int(os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"]) * MiB
        except (KeyError, ValueError):
            return None
    if kind == "GPU":
        try:
            physical = tf.config.list_physical_devices("GPU")[int(index or 0)]
            configs = tf.config.get_logical_device_configuration(physical) or []
            limits = [c.memory_limit for c in configs if c.memory_limit]
            return int(limits[0]) * MiB if limits else None
        except (IndexError, ValueError, RuntimeError):
            return None
    return None


def _multi_worker():
    """True under a TF_CONFIG naming more than one worker (MultiWorkerMirroredStrategy)."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker")) > 1
    except (ValueError, AttributeError, TypeError):
        return False


class Monitor(_monitor.EnvMonitorCore):
    """The monitor of a TensorFlow training loop (the module's doc); its arguments are
    fragscope._monitor.MonitorCore's."""

    framework = "tensorflow"
    settings = SETTINGS
    recommendation = RECOMMENDATION
    how = ("fallback: TensorFlow keeps no request trace to replay; CUDA's stream-ordered pool "
           "is not bound to BFC chunks (GPUs only)")

    def _initialized(self):
        return _initialized()

    def _devices(self):
        if self.device is not None:
            return [str(self.device)]
        gpus = tf.config.list_logical_devices("GPU")
        return [d.name.rpartition("/device:")[2] for d in gpus] or ["CPU:0"]

    def _say_once(self, what, message):
        said = self.__dict__.setdefault("_said", set())
        if what not in said:
            said.add(what)
            _log(message)

    def _read(self):
        if _multi_worker():
            self._say_once("workers", "TF_CONFIG names several workers: fragscope.keras does "
                           "not make them agree yet, so each worker acts on its own level")
        out = []
        host = os.uname().nodename
        for device in self._devices():
            uuid = "tf-{}-{}".format(device.replace(":", "").lower(), host)
            try:
                info = memory_info(device)
            except ValueError as e:
                self._say_once(device, "TensorFlow keeps no memory statistics for {} ({}): "
                               "nothing to monitor there".format(device, e))
                continue
            current, peak = int(info["current"]), int(info["peak"])
            # The BFC pool is not visible: the bytes in use stand for it (a lower bound, so
            # cached free and the fragmentation ratio read 0), and the forecaster's capacity,
            # reserved + device free, is the limit.
            sample = {"allocated_bytes": current, "peak_allocated_bytes": peak,
                      "reserved_bytes": current, "peak_reserved_bytes": peak,
                      "pool": "not visible"}
            limit = device_limit_bytes(device)
            if limit is not None:
                sample["device_free_bytes"] = max(0, limit - current)
                sample["bytes_limit"] = limit
            self._say_once("bfc:" + device, (
                "TensorFlow reports bytes in use and their peak for {} (get_memory_info) and "
                "nothing else of its allocator: the BFC pool, largest free chunk and chunk map "
                "are not reachable from Python, so fragmentation is not seen here (fragscope "
                "explain reads it from the OOM dump); {}".format(
                    device, "the peak is forecast against the limit of {} bytes".format(limit)
                    if limit is not None else "no limit is known, so no steps-to-OOM")))
            if self.reset_peaks:
                tf.config.experimental.reset_memory_stats(device)
            out.append((device, uuid, sample, True))
        return out


class MonitorCallback(keras.callbacks.Callback):
    """A Keras callback that runs a fragscope monitor after every training batch (the module's
    doc). `monitor`: any fragscope Monitor (default: fragscope.keras.Monitor(**kwargs)); its
    action becomes "stop". Without a save_checkpoint the model is saved with model.save."""

    def __init__(self, monitor=None, **kwargs):
        super().__init__()
        if monitor is not None and kwargs:
            raise TypeError("MonitorCallback: pass a monitor or its arguments, not both")
        self.monitor = monitor if monitor is not None else Monitor(**kwargs)
        self.monitor.action = "stop"
        self._own_save = self.monitor.save_checkpoint is None
        self._batches = 0

    def _save(self, step):
        path = os.path.join(self.monitor.run_dir, "fragscope-step{}.keras".format(step))
        os.makedirs(self.monitor.run_dir, exist_ok=True)
        self.model.save(path)
        self.saved = path

    def _step(self):
        iterations = getattr(getattr(self.model, "optimizer", None), "iterations", None)
        try:
            return int(iterations.numpy()) - 1  # counted after this batch's update
        except (AttributeError, TypeError, ValueError):
            return self._batches - 1

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._own_save:
            self.monitor.save_checkpoint = self._save
        if self.monitor.step(max(0, self._step())):
            self.model.stop_training = True

    def exit_if_stopped(self):
        """After fit(): exits with the monitor's exit code if it stopped the run."""
        self.monitor.exit_if_stopped()
