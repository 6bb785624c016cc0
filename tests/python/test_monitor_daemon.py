"""The Monitor's samples reach a real `fragscope serve` (docs/live-monitoring.md, "The node
daemon"): the daemon exports the monitor's own level for the rank, and a daemon that goes
away mid-run never stops training."""
import json
import subprocess

import conftest

conftest.native_or_skip()
Daemon = conftest.integration_daemon()
from soak_serve import value  # noqa: E402

JOB = """
import json, sys, torch
import fragscope.torch as ft
from fragscope.torch.monitor import Monitor, LEVELS
m = Monitor(every=5, run_dir=sys.argv[1], socket=sys.argv[2], action="stop", job="itest",
            request_signal=None)
gpu = ft.virtual_gpu("64MiB").start()
keep = []
for step in range(int(sys.argv[3])):
    keep.append(torch.empty(256 << 10, dtype=torch.uint8))
    gpu.step(step)
    m.step(step)
print(json.dumps({"level": LEVELS.index(m.last["level"]), "step": m.last["step"]}),
      flush=True)
sys.stdin.readline()  # stay connected (the daemon drops a process's series when it leaves)
"""


def run_job(tmp_path, sock, steps):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = subprocess.Popen([conftest.PYTHON, str(job), str(tmp_path), sock, str(steps)],
                            env=conftest.subprocess_env(RANK="3"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=60)
        raise AssertionError(proc.stderr.read())
    return json.loads(line), proc


def finish(proc):
    out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err


def test_monitor_samples_reach_the_daemon_with_the_monitors_level(tmp_path):
    conftest.fragscope_bin()
    daemon = Daemon(str(tmp_path))
    try:
        last, proc = run_job(tmp_path, daemon.sock, 41)
        try:
            assert last["step"] == 40 and last["level"] >= 1
            # The monitor sends without waiting, so the last sample (step 40) may arrive after
            # the job printed; wait for it, then its level is the monitor's own.
            daemon.wait_metric("fragscope_process_step", 40, timeout=30, rank="3")
            assert value(daemon.metrics(), "fragscope_process_forecast_level", rank="3",
                         job_name="itest") == last["level"]
        finally:
            finish(proc)
    finally:
        daemon.stop()


def test_a_daemon_that_goes_away_never_stops_training(tmp_path):
    conftest.fragscope_bin()
    daemon = Daemon(str(tmp_path))
    daemon.stop()  # the socket file may stay behind; nobody answers
    last, proc = run_job(tmp_path, daemon.sock, 21)
    finish(proc)
    assert last["step"] == 20
