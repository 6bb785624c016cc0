"""Trust on a node (issue 30, items 1 and 2): the daemon takes a sender's identity from the
kernel (SO_PEERCRED), so another local user can neither report for your process, nor make
your job checkpoint, nor crowd your series out. The attacks run as a second UID (65534,
"nobody") in a child process; they need root to switch to it and skip otherwise. The API
socket (`serve --api-socket`, read by `top --socket`) admits only the users its mode admits.

Run by ctest (serve_trust); FRAGSCOPE_BIN and FRAGSCOPE_SOURCE_DIR come from there.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import BIN, SOURCE_DIR, Daemon, full_sample, workdir  # noqa: E402,F401
import fragscope_agent  # noqa: E402  (test_serve put python/ on the path)
from soak_serve import parse_metrics, value  # noqa: E402

NOBODY = 65534
HOOK = os.path.join(SOURCE_DIR, "deploy", "fragscope-checkpoint-request")
PYTHON_DIR = os.path.join(SOURCE_DIR, "python")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the attacks run as a second UID (65534): the suite must run as root to switch to it")


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


# The attacker: connects as UID 65534 and sends the samples given as JSON on argv[2], then
# holds its connection open until its stdin closes.
ATTACKER = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
import fragscope_agent
samples = json.load(open(sys.argv[2]))
conns = {}
for s in samples:
    c = conns.get(s.get("_conn", 0))
    if c is None:
        c = conns[s.get("_conn", 0)] = fragscope_agent.AgentClient(sys.argv[1])
    s.pop("_conn", None)
    ok = c.send_sample(s)
print("sent", ok, flush=True)
sys.stdin.read()
"""


def attacker(sock, samples):
    """A UID-65534 process that sent `samples` and keeps its connections open (close stdin)."""
    path = os.path.join(os.path.dirname(os.path.dirname(sock)), f"attack-{len(samples)}.json")
    with open(path, "w") as f:
        json.dump(samples, f)
    os.chmod(path, 0o644)
    proc = subprocess.Popen([sys.executable, "-c", ATTACKER, sock, path, PYTHON_DIR],
                            preexec_fn=as_nobody, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert line.startswith("sent"), line
    return proc


def open_workdir(workdir):
    """The socket's folder reachable by UID 65534 (the socket itself: --socket-mode 0666)."""
    os.chmod(workdir, 0o755)
    os.makedirs(os.path.join(workdir, "run"), exist_ok=True)
    os.chmod(os.path.join(workdir, "run"), 0o755)


def pids_on_page(text):
    pids = set()
    for line in text.splitlines():
        if line.startswith("fragscope_process_step{"):
            for part in line[line.index("{") + 1:line.index("}")].split(","):
                k, _, v = part.partition("=")
                if k == "pid":
                    pids.add(int(v.strip('"')))
    return pids


def wait_until(predicate, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@needs_root
def test_another_uid_cannot_report_for_or_checkpoint_another_users_process(workdir):
    open_workdir(workdir)
    requests = os.path.join(workdir, "requests")
    config = os.path.join(workdir, "rules.toml")
    with open(config, "w") as f:
        f.write(f"""
[hooks.checkpoint]
type = "exec"
command = ["/usr/bin/env", "FRAGSCOPE_REQUEST_DIR={requests}", {json.dumps(HOOK)}]
timeout = "10s"

[[rules]]
name = "ForecastCritical"
metric = "forecast_level"
op = ">="
value = "critical"
for = "0s"
severity = "critical"
hooks = ["checkpoint"]
""")
    victim = subprocess.Popen(["sleep", "60"])  # root's training job
    d = Daemon(workdir, "--socket-mode", "0666", "--alerts", config)
    bad = None
    try:
        forged = full_sample(step=50, pid=victim.pid, job="victims-job", forecast_level="critical")
        bad = attacker(d.sock, [forged])
        # The rule fires for the sender's own process (so the hook ran) and never for the
        # victim's: no series under its pid, no request file for it.
        assert wait_until(lambda: os.path.exists(os.path.join(requests, str(bad.pid)))), \
            d.read_log()
        page = d.get("/metrics")[2]
        assert victim.pid not in pids_on_page(page), page
        assert bad.pid in pids_on_page(page)
        assert value(parse_metrics(page), "fragscope_agent_samples_relabeled_total") >= 1
        assert not os.path.exists(os.path.join(requests, str(victim.pid))), os.listdir(requests)
        # The request folder is not writable by group or others.
        assert os.stat(requests).st_mode & 0o022 == 0
        assert f"sent samples for pid {victim.pid}: recorded as pid {bad.pid}" in d.read_log()
    finally:
        if bad:
            bad.stdin.close()
            bad.wait(10)
        victim.kill()
        victim.wait()
        assert d.stop() == 0, d.read_log()


@needs_root
def test_the_hook_writes_only_for_the_process_of_the_reporting_uid(workdir):
    requests = os.path.join(workdir, "requests")
    victim = subprocess.Popen(["sleep", "60"])
    env = dict(os.environ, FRAGSCOPE_ALERT_STATE="firing", FRAGSCOPE_REQUEST_DIR=requests)
    try:
        # An alert whose series UID is not the process's owner: nothing written.
        r = subprocess.run([HOOK], env=dict(env, FRAGSCOPE_ALERT_PID=str(victim.pid),
                                            FRAGSCOPE_ALERT_UID=str(NOBODY)),
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 1 and f"belongs to UID 0, not to UID {NOBODY}" in r.stderr, r
        assert not os.path.exists(os.path.join(requests, str(victim.pid)))
        # No UID at all: refused as bad input.
        r = subprocess.run([HOOK], env=dict(env, FRAGSCOPE_ALERT_PID=str(victim.pid)),
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 2, r
        # A group-writable request folder is refused.
        os.makedirs(requests, exist_ok=True)
        os.chmod(requests, 0o775)
        r = subprocess.run([HOOK], env=dict(env, FRAGSCOPE_ALERT_PID=str(victim.pid),
                                            FRAGSCOPE_ALERT_UID="0"),
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 1 and "writable by group or others" in r.stderr, r
        os.chmod(requests, 0o755)
        r = subprocess.run([HOOK], env=dict(env, FRAGSCOPE_ALERT_PID=str(victim.pid),
                                            FRAGSCOPE_ALERT_UID="0"),
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r
        assert os.stat(os.path.join(requests, str(victim.pid))).st_mode & 0o022 == 0
    finally:
        victim.kill()
        victim.wait()


@needs_root
def test_sidecars_may_report_only_for_their_own_uids_processes(workdir):
    open_workdir(workdir)
    own = subprocess.Popen(["sleep", "60"], preexec_fn=as_nobody)  # 65534's training process
    root_job = subprocess.Popen(["sleep", "60"])
    d = Daemon(workdir, "--socket-mode", "0666", "--allow-uid-sidecars")
    side = None
    try:
        side = attacker(d.sock, [full_sample(step=3, pid=own.pid, device_uuid="GPU-a"),
                                 full_sample(step=4, pid=root_job.pid, device_uuid="GPU-b")])
        # Both samples: the second (relabelled to the sidecar's own pid) may come later.
        assert wait_until(lambda: {own.pid, side.pid} <= pids_on_page(d.get("/metrics")[2]))
        pids = pids_on_page(d.get("/metrics")[2])
        assert root_job.pid not in pids and side.pid in pids, pids
    finally:
        if side:
            side.stdin.close()
            side.wait(10)
        own.kill()
        root_job.kill()
        own.wait()
        root_job.wait()
        assert d.stop() == 0, d.read_log()


def flood(prefix, count, conn_size=8, **over):
    return [dict(full_sample(step=1, device_uuid=f"GPU-{prefix}-{i}", **over), _conn=i // conn_size)
            for i in range(count)]


@needs_root
def test_one_uid_cannot_evict_or_crowd_out_another_uids_series(workdir):
    open_workdir(workdir)
    d = Daemon(workdir, "--socket-mode", "0666", "--max-series", "8", "--linger", "600",
               "--max-page-bytes", "256KiB")
    bad = None
    me = os.getpid()
    try:
        # Root's job: one series that ended (an OOM: it lingers) and one live.
        done = fragscope_agent.AgentClient(d.sock)
        assert done.send_sample(full_sample(step=9, device_uuid="GPU-oom", num_ooms=1))
        done.close()
        live = fragscope_agent.AgentClient(d.sock)
        assert live.send_sample(full_sample(step=3, device_uuid="GPU-live"))
        d.wait_metric("fragscope_agent_series", 2)
        # UID 65534 floods new series with long labels and every bucket full.
        bad = attacker(d.sock, flood("x", 24, job="j" * 250, free_block_count=[1] * 64,
                                     free_block_bytes=[1] * 64))
        assert wait_until(lambda: value(d.metrics(), "fragscope_agent_series_dropped_total") or 0)
        time.sleep(0.5)
        m = d.metrics()
        # Root's series are all still there, the lingering OOM series included ...
        for uuid in ("GPU-oom", "GPU-live"):
            assert value(m, "fragscope_process_step", UUID=uuid, pid=str(me)) is not None, uuid
        # ... and on the page, whatever the other UID's labels take.
        page = d.get("/metrics")[2]
        assert me in pids_on_page(page) and bad.pid in pids_on_page(page)
        assert len(page) < 256 * 1024 + 64 * 1024, len(page)  # the bound + the node's part
        assert value(parse_metrics(page), "fragscope_agent_series_omitted") > 0
        # Under its fair share (4 of 8), root still gets new series at the full cap.
        for i in range(2):
            assert live.send_sample(full_sample(step=4, device_uuid=f"GPU-new-{i}"))
        d.wait_metric("fragscope_process_step", 4, UUID="GPU-new-1", pid=str(me))
        assert value(d.metrics(), "fragscope_agent_series") == 8
        live.close()
    finally:
        if bad:
            bad.stdin.close()
            bad.wait(10)
        assert d.stop() == 0, d.read_log()


@needs_root
def test_history_writes_are_bounded_per_uid(workdir):
    import sqlite3
    open_workdir(workdir)
    d = Daemon(workdir, "--socket-mode", "0666", "--history-rate-per-uid", "8KiB",
               "--max-series-per-connection", "100")
    bad = None
    try:
        # 4 connections x 90 samples at once, 1.3 KB of strings each: ~470 KB in a second.
        samples = [dict(full_sample(step=i, device_uuid=f"GPU-{i % 8}", job="j" * 250,
                                    run="r" * 250, architecture="a" * 250), _conn=i // 90)
                   for i in range(360)]
        bad = attacker(d.sock, samples)
        time.sleep(1)
        with fragscope_agent.AgentClient(d.sock, run="mine") as mine:
            for step in range(5):
                assert mine.send_sample(full_sample(step=step))
            d.wait_metric("fragscope_agent_samples_received_total", 365, timeout=10)
    finally:
        if bad:
            bad.stdin.close()
            bad.wait(10)
        assert d.stop() == 0, d.read_log()
    db = sqlite3.connect(d.history)
    try:
        theirs = db.execute("SELECT count(*) FROM samples WHERE run != 'mine'").fetchone()[0]
        mine = db.execute("SELECT count(*) FROM samples WHERE run = 'mine'").fetchone()[0]
    finally:
        db.close()
    # 8 KiB/s with a 5 s burst, for ~2 s: at most ~56 KiB of ~1 KB rows.
    assert 0 < theirs <= 60, theirs
    assert mine == 5
    assert "over the history's write rate" in d.read_log()


@needs_root
def test_the_api_socket_admits_only_whom_its_mode_admits(workdir):
    # The TCP port answers any local user; the API socket only those its file mode lets in.
    open_workdir(workdir)
    api = os.path.join(workdir, "run", "agent.api.sock")
    top = [BIN, "top", "--once", "--socket", api]
    daemon = Daemon(workdir)  # --api-socket-mode 0660: root and group root
    try:
        out = subprocess.run(top, preexec_fn=as_nobody, capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 1 and "permission denied" in out.stderr, out.stderr
        out = subprocess.run(top, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
    finally:
        daemon.stop()
    daemon = Daemon(workdir, "--api-socket-mode", "0666")
    try:
        out = subprocess.run(top, preexec_fn=as_nobody, capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0 and "0 processes" in out.stdout, out.stderr
    finally:
        daemon.stop()
