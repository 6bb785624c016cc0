"""fragscope's JAX and Keras monitors with the real frameworks (issue 32 item 4): a jit-compiled
JAX loop (jax 0.10.2 on the CPU) and a Keras model.fit (tensorflow-cpu 2.21), each under its
monitor from the installed wheel (tests/user_env/bfc_framework_job.py):

* on the real devices the samples reach `fragscope serve`, and what the framework does not
  report is said once (JAX's CPU backend has no memory_stats(); TensorFlow gives in-use and
  peak only);
* on a device that fills up (the statistics replaced, the loop real) the monitor saves through
  the framework, writes its recommendation and stops (JAX: exit 75; Keras: stop_training, then
  exit 75), and the restart applies the recommended variable before the framework sets up its
  devices, resumes from the checkpoint and finishes without stopping again.
"""
import importlib.util
import json
import sys
import os
import socket
import subprocess
import time
import urllib.request

import pytest

import conftest
from conftest import metric

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "bfc_framework_job.py")
# TensorFlow's CPU allocator as a BFC allocator with a limit: the limit the Keras monitor reads.
TF_BFC = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPU_BFC_MEM_LIMIT_IN_MB": "256",
          "TF_CPP_MIN_LOG_LEVEL": "2"}


def needs(module, pin):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason="{} is not installed in this environment ({}; tools/setup_user_env.sh pins {})"
               .format(module, sys.executable, pin))


jax_only = needs("jax", "jax==0.10.2")
tf_only = needs("tensorflow", "tensorflow-cpu==2.21.0")


def job(installed, framework, mode, run_dir, *args, env=None):
    proc = installed.run([installed.python, JOB, framework, mode, str(run_dir), *args],
                         timeout=120, **(env or {}))
    return proc.returncode, proc.stdout, proc.stderr


def real_run_reaches_the_daemon(installed, tmp_path, framework, env):
    with conftest.serve(installed, tmp_path) as (sock, url):
        proc = subprocess.Popen([installed.python, JOB, framework, "real", str(tmp_path), sock],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=installed.env(**env))
        try:
            out = ""
            for line in proc.stdout:  # the job's lines up to "done"; EOF: it failed
                if line.strip() == "done":
                    break
                out += line
            else:  # the job ended without "done": its stderr is complete
                assert False, out + proc.stderr.read()[-3000:]
            last = int(out.split("finished at step ")[1].split()[0])
            job_name = "{}-real".format(framework)
            deadline = time.time() + 10
            while True:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                step = metric(text, "fragscope_process_step", pid=str(proc.pid),
                              job_name=job_name)
                if step == last or time.time() > deadline:
                    break
                time.sleep(0.2)
            assert step == last, [line for line in text.splitlines() if "process_step" in line]
            held = metric(text, "fragscope_process_allocated_bytes", pid=str(proc.pid),
                          job_name=job_name)
        finally:
            _, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err[-3000:]
    return out, err, held


@jax_only
def test_a_jax_loop_on_the_cpu_reaches_the_daemon_and_says_once_what_it_cannot_see(
        installed, tmp_path):
    out, err, held = real_run_reaches_the_daemon(installed, tmp_path, "jax",
                                                 {"JAX_PLATFORMS": "cpu"})
    # Three samples (steps 0, 10, 20), one message that the CPU backend keeps no statistics.
    assert "samples 3" in out, out
    assert err.count("reports no memory_stats()") == 1, err
    # What the job's arrays hold on the device reached the daemon: x, y and w, 33 KiB at least.
    assert held is not None and held >= (128 * 64 + 128 + 64) * 4, held
    assert "frameworks imported ['jax']" in out, out  # no torch, no TensorFlow


@jax_only
def test_a_jax_device_filling_up_saves_exits_75_and_the_restart_applies_the_fix(
        installed, tmp_path):
    env = {"JAX_PLATFORMS": "cpu"}
    rc, out, err = job(installed, "jax", "filling", tmp_path, env=env)
    assert rc == 75, out + err[-3000:]
    rec = json.loads((tmp_path / "fragscope-recommendation.json").read_text())
    assert rec["framework"] == "jax" and rec["worst_level"] in ("warning", "critical"), rec
    assert rec["env"] == {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, rec
    assert rec["checkpoint_saved"] is True and rec["levels"] == [rec["worst_level"]], rec
    assert int((tmp_path / "jax-step.txt").read_text()) == rec["step"]
    assert (tmp_path / "jax-params.npy").exists()
    assert "reports no memory_stats()" not in err  # the replaced device has statistics
    rc, out, err = job(installed, "jax", "restart", tmp_path, env=env)
    assert rc == 0, out + err[-3000:]
    assert "applied the recommendation of step {}".format(rec["step"]) in err, err
    assert "comes too late" not in err, err
    assert "not stopping again" in err, err  # the device still fills up: one stop per run dir
    assert "finished at step 390 with" in out and "env platform" in out, out


@jax_only
def test_two_jax_processes_agree_and_both_save_and_exit_at_the_same_step(installed, tmp_path):
    with socket.socket() as s:  # a free port for jax.distributed's coordinator
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = installed.env(JAX_PLATFORMS="cpu")
    nobody = str(tmp_path / "no-daemon.sock")
    procs = [subprocess.Popen([installed.python, JOB, "jax", "agree", str(tmp_path), nobody,
                               str(p), port], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for p in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [75, 75], outs
    rec = json.loads((tmp_path / "fragscope-recommendation.json").read_text())
    # Process 1's device filled up, process 0's did not; both acted at the step they agreed on.
    assert rec["worst_rank"] == 1 and rec["levels"][0] == "ok", rec
    assert rec["levels"][1] in ("warning", "critical"), rec
    steps = [int((tmp_path / "jax-step{}.txt".format(p)).read_text()) for p in (0, 1)]
    assert steps == [rec["step"], rec["step"]], steps
    for _, err in outs:
        assert "worst rank 1 agreed over 2 ranks" in err, err[-3000:]


@tf_only
def test_a_keras_fit_reaches_the_daemon_and_says_once_what_tensorflow_hides(installed,
                                                                         tmp_path):
    out, err, held = real_run_reaches_the_daemon(installed, tmp_path, "keras", TF_BFC)
    assert "samples 4" in out, out  # 40 batches, every 10
    assert err.count("nothing else of its allocator") == 1, err
    assert "the limit of {} bytes".format(256 << 20) in err, err
    assert held is not None and held > 0, held
    assert "torch" not in out.split("frameworks imported")[1], out


@tf_only
def test_a_keras_device_filling_up_saves_stops_fit_and_the_restart_applies_the_fix(
        installed, tmp_path):
    env = dict(TF_BFC, TF_CPU_BFC_MEM_LIMIT_IN_MB="1024")  # the filling device's limit
    rc, out, err = job(installed, "keras", "filling", tmp_path, env=env)
    assert rc == 75, out + err[-3000:]
    rec = json.loads((tmp_path / "fragscope-recommendation.json").read_text())
    assert rec["framework"] == "tensorflow" and rec["checkpoint_saved"] is True, rec
    assert rec["env"] == {"TF_GPU_ALLOCATOR": "cuda_malloc_async"}, rec
    # stop_training ended fit() right after the batch of the stop, saved by model.save.
    assert "keras stopped at step {} ".format(rec["step"]) in out, out
    assert (tmp_path / "fragscope-step{}.keras".format(rec["step"])).exists()
    rc, out, err = job(installed, "keras", "restart", tmp_path, env=env)
    assert rc == 0, out + err[-3000:]
    assert "applied the recommendation of step {}".format(rec["step"]) in err, err
    assert "comes too late" not in err and "not stopping again" in err, err
    assert "env cuda_malloc_async" in out, out
