"""A tiny training job under fragscope's JAX or Keras monitor (tests/user_env/test_jax_keras.py).

    bfc_framework_job.py FRAMEWORK MODE RUN_DIR [SOCKET]

FRAMEWORK: "jax" (a jit-compiled linear-regression step, fragscope.jax.Monitor) or "keras" (a
two-layer model.fit on TensorFlow, fragscope.keras.MonitorCallback). MODE:

* "real": the device's own statistics, samples sent to SOCKET; prints "done" and waits for a
  line on stdin (the daemon drops a process's series when its connection closes);
* "filling": the statistics are replaced by a device that fills up by 2 MiB a step towards a
  1 GiB limit (the BFC pool preallocated, as JAX does by default): the monitor must save, write
  its recommendation and stop (JAX: exit 75; Keras: fit() returns, then exit 75);
* "agree" (JAX, two processes: ... RUN_DIR SOCKET PROCESS PORT): jax.distributed on the CPU
  (gloo); process 1's device fills up, process 0's stays put: both must save and exit 75 at the
  same step, agreed;
* "restart": as on the restart of a stopped job: the recommendation is applied before the
  framework sets up its devices, the checkpoint is loaded, and the run finishes although the
  device still fills up (one stop per run directory).
"""
import os
import sys

framework, mode, run_dir = sys.argv[1:4]
sock = sys.argv[4] if len(sys.argv) > 4 else os.path.join(run_dir, "no-daemon.sock")
MiB = 1 << 20
LIMIT = 1 << 30
STEPS = 400
BATCHES = 20  # a Keras epoch's batches
now = {"step": 0}


def in_use():
    return 256 * MiB + now["step"] * 2 * MiB


def jax_filling_stats(device):
    used = in_use() if mode != "agree" or sys.argv[5] == "1" else 256 * MiB
    return {"bytes_in_use": used, "peak_bytes_in_use": used, "pool_bytes": LIMIT,
            "peak_pool_bytes": LIMIT, "bytes_limit": LIMIT,
            "largest_free_block_bytes": LIMIT - used, "num_allocs": now["step"]}


def keras_filling_info(device):
    return {"current": in_use(), "peak": in_use()}


def monitor_args():
    return dict(every=10, run_dir=run_dir, socket=sock, job="{}-{}".format(framework, mode),
                request_signal=None, apply_recommendation=(mode == "restart"))


def run_jax():
    if mode == "agree":
        import jax
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address="127.0.0.1:" + sys.argv[6],
                                   num_processes=2, process_id=int(sys.argv[5]))
    import fragscope.jax as fj
    # Made before the first computation: the restart's setting must come before JAX reads it.
    monitor = fj.Monitor(save_checkpoint=lambda step: save(step), **monitor_args())
    import jax
    import jax.numpy as jnp
    import numpy as np
    if mode != "real":
        fj.device_memory_stats = jax_filling_stats
    first = 0
    w = jnp.zeros((64, 1))
    if mode == "restart":
        first = int(open(os.path.join(run_dir, "jax-step.txt")).read()) + 1
        w = jnp.asarray(np.load(os.path.join(run_dir, "jax-params.npy")))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(128, 64)), dtype=jnp.float32)
    y = x @ jnp.ones((64, 1))

    @jax.jit
    def train_step(w):
        grad = x.T @ (x @ w - y) / x.shape[0]
        return w - 0.05 * grad

    def save(step):
        rank = "" if mode != "agree" else sys.argv[5]
        np.save(os.path.join(run_dir, "jax-params{}.npy".format(rank)), np.asarray(w))
        with open(os.path.join(run_dir, "jax-step{}.txt".format(rank)), "w") as f:
            f.write(str(step))

    steps = 30 if mode == "real" else STEPS
    for step in range(first, steps):
        now["step"] = step
        w = train_step(w)
        monitor.step(step)  # "filling": exits 75 here
    loss = float(jnp.mean((x @ w - y) ** 2))
    return monitor, "loss {:.4f} env {}".format(loss, os.environ.get(
        "XLA_PYTHON_CLIENT_ALLOCATOR"))


def run_keras():
    import fragscope.keras as fk
    if mode != "real":
        fk.memory_info = keras_filling_info
    callback = fk.MonitorCallback(**monitor_args())
    import keras
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * 8, 16)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    if mode == "restart":
        path = os.path.join(run_dir, "fragscope-step{}.keras".format(
            fk.read_recommendation(run_dir)["step"]))
        model = keras.models.load_model(path)
    else:
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")

    class Clock(keras.callbacks.Callback):  # the filling device's step
        def on_train_batch_begin(self, batch, logs=None):
            now["step"] = int(model.optimizer.iterations.numpy())

    # "real" runs 2 epochs, the others up to STEPS steps.
    epochs = 2 if mode == "real" else STEPS // BATCHES
    done = int(model.optimizer.iterations.numpy()) // BATCHES
    history = model.fit(x, y, batch_size=8, epochs=epochs, initial_epoch=done, verbose=0,
                        callbacks=[Clock(), callback])
    print("fragscope-test: keras stopped at step {} after {} epochs".format(
        int(model.optimizer.iterations.numpy()) - 1, len(history.epoch)), flush=True)
    callback.exit_if_stopped()  # "filling": exits 75 here
    return callback.monitor, "env {}".format(os.environ.get("TF_GPU_ALLOCATOR"))


monitor, what = run_jax() if framework == "jax" else run_keras()
print("fragscope-test: finished at step {} with {}; samples {}; frameworks imported {}".format(
    monitor.last["step"], what, len(monitor.history),
    sorted(m for m in ("jax", "tensorflow", "torch") if m in sys.modules)), flush=True)
if mode == "real":
    print("done", flush=True)
    sys.stdin.readline()
