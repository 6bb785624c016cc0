"""deploy/fragscope-checkpoint-request, the daemon's exec hook that asks a monitored training
process to checkpoint (docs/live-monitoring.md): against a real process running a Monitor."""
import json
import os
import subprocess
import sys
import time

import pytest

import conftest

pytest.importorskip("torch")
try:
    from fragscope import _native
    _native.load()
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)

HOOK = os.path.join(conftest.SOURCE_DIR, "deploy", "fragscope-checkpoint-request")

LOOP = """
import os, sys, time, json
import fragscope.torch as ft
from fragscope.torch.monitor import Monitor
saved = []
m = Monitor(every=1, run_dir=sys.argv[1], socket="/none", action="stop",
            save_checkpoint=saved.append)
print("ready", flush=True)
sys.stdin.readline()  # the test runs the hook first: the request waits for the next sample
for step in range(600):
    if m.step(step):
        print(json.dumps({"stopped": step, "saved": saved}), flush=True)
        sys.exit(0)
    time.sleep(0.02)
print(json.dumps({"stopped": None}), flush=True)
"""


def run_hook(env, *args):
    full = dict(os.environ)
    # The daemon names the UID that reported the process (SO_PEERCRED); here: ours.
    full["FRAGSCOPE_ALERT_UID"] = str(os.getuid())
    full.update(env)
    return subprocess.run([HOOK] + list(args), env=full, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("use_signal", [False, True])
def test_hook_makes_the_monitored_process_checkpoint(tmp_path, use_signal):
    req = tmp_path / "requests"
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                            env=conftest.subprocess_env(FRAGSCOPE_REQUEST_DIR=str(req)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        # The process waits on its stdin, alive, with the monitor's handler installed, until
        # the hook is done (it could otherwise take the request and exit before the hook looks
        # for the handler).
        out = run_hook({"FRAGSCOPE_ALERT_STATE": "firing", "FRAGSCOPE_ALERT_PID": str(proc.pid),
                        "FRAGSCOPE_ALERT_NAME": "ForecastCritical",
                        "FRAGSCOPE_REQUEST_DIR": str(req)},
                       *(["--signal"] if use_signal else []), "--reason", "test")
        assert out.returncode == 0, out.stderr
        if use_signal:
            assert "sent SIGUSR1" in out.stdout
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert result["stopped"] is not None and result["saved"] == [result["stopped"]]
    rec = json.loads((tmp_path / "fragscope-recommendation.json").read_text())
    assert rec["node_request"] is True
    assert not (req / str(proc.pid)).exists()  # answered: consumed


def test_hook_never_signals_a_process_without_the_monitor(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        out = run_hook({"FRAGSCOPE_ALERT_PID": str(sleeper.pid),
                        "FRAGSCOPE_REQUEST_DIR": str(tmp_path)}, "--signal")
        assert out.returncode == 0
        assert "does not catch SIGUSR1" in out.stderr
        time.sleep(0.2)
        assert sleeper.poll() is None  # still alive
    finally:
        sleeper.kill()


def test_hook_input_errors_and_no_ops(tmp_path):
    env = {"FRAGSCOPE_REQUEST_DIR": str(tmp_path)}
    bad = run_hook(dict(env, FRAGSCOPE_ALERT_PID="12; rm -rf /"))
    assert bad.returncode == 2 and "not a process id" in bad.stderr
    assert run_hook(env, "--bogus").returncode == 2
    resolved = run_hook(dict(env, FRAGSCOPE_ALERT_STATE="resolved", FRAGSCOPE_ALERT_PID="42"))
    assert resolved.returncode == 0 and not (tmp_path / "42").exists()
    nopid = run_hook(dict(env, FRAGSCOPE_ALERT_PID=""))
    assert nopid.returncode == 0 and "names no process" in nopid.stderr
    unwritable = run_hook({"FRAGSCOPE_REQUEST_DIR": "/proc/nope", "FRAGSCOPE_ALERT_PID": "42"})
    assert unwritable.returncode == 1
