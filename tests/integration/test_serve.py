"""Integration tests for `fragscope serve` with real components: the built binary, the
Python agent client (python/fragscope_agent.py), HTTP scrapes, Debian's promtool and
prometheus server, and the load/fault tool (tools/soak_serve.py, short run).

Run by ctest (serve_integration); FRAGSCOPE_BIN and FRAGSCOPE_SOURCE_DIR come from there.
A test that needs an outside tool (promtool, prometheus, systemd-analyze, the stand-in NVML)
skips when it is missing, except under FRAGSCOPE_REQUIRE_TOOLS=1 (set by ctest, because
tools/install-deps.sh installs them all), where a missing tool fails the test.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import urllib.parse
import urllib.request

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("FRAGSCOPE_BIN", os.path.join(SOURCE_DIR, "build/dev/apps/fragscope/fragscope"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import fragscope_agent  # noqa: E402
from soak_serve import parse_metrics, value  # noqa: E402

UUID = "GPU-6c1d2b3a-0000-4000-8000-00000000beef"
REQUIRE_TOOLS = os.environ.get("FRAGSCOPE_REQUIRE_TOOLS") == "1"
# The daemon loads this instead of the host's libnvidia-ml unless a test says otherwise, so the
# NVML-absent state is the same on a GPU host as on CI.
NO_NVML = "/nonexistent/libnvidia-ml.so.1"
# The daemon records a sample under its sender's pid (SO_PEERCRED), whatever pid it names: the
# agents of these tests run in this process, so their series carry this pid.
ME = os.getpid()


def require_tool(name, package):
    """The tool's path; when it is missing, skip, or fail under FRAGSCOPE_REQUIRE_TOOLS=1."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not installed (Debian package {package}; tools/install-deps.sh)"
    if REQUIRE_TOOLS:
        pytest.fail(message + " and FRAGSCOPE_REQUIRE_TOOLS=1", pytrace=False)
    pytest.skip(message)


class Daemon:
    """A `fragscope serve` process on a temporary socket and a free loopback port."""

    def __init__(self, workdir, *extra, env=None):
        self.workdir = workdir
        self.sock = os.path.join(workdir, "run", "agent.sock")
        self.log_path = os.path.join(workdir, "serve.log")
        self.log = open(self.log_path, "w+")
        args = [BIN, "serve", "--socket", self.sock, "--hostname", "itest", "--interval", "0.2",
                *extra]
        if "--listen" not in extra:
            args += ["--listen", "127.0.0.1:0"]
        # Never the real ~/.local/state: each daemon gets its own history file.
        self.history = os.path.join(workdir, "history.sqlite")
        if "--history" not in extra:
            args += ["--history", self.history]
        if "--nvml-lib" not in extra:
            args += ["--nvml-lib", NO_NVML, "--proc-root", os.path.join(workdir, "no-proc")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log,
                                     env=env or os.environ)
        self.port = None
        deadline = time.time() + 10
        while time.time() < deadline:
            text = self.read_log()
            m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", text)
            if m:
                self.port = int(m.group(1))
                break
            # The socket file appears at bind(), a moment before listen(): a client connecting
            # in between is refused. The daemon logs this line once the socket accepts.
            if "--listen" in extra and re.search(r"agent socket \S+ \(mode", text):
                break
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        else:
            self.stop()
            raise AssertionError("serve did not start:\n" + self.read_log())

    def read_log(self):
        if self.log.closed:  # after stop()
            with open(self.log_path) as f:
                return f.read()
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()

    def metrics(self):
        return parse_metrics(self.get("/metrics")[2])

    def wait_metric(self, name, expected, timeout=5, **labels):
        deadline = time.time() + timeout
        got = None
        while time.time() < deadline:
            got = value(self.metrics(), name, **labels)
            if got == expected:
                return
            time.sleep(0.05)
        raise AssertionError(f"{name}{labels} = {got}, expected {expected}")

    def stop(self):
        """SIGTERM; returns the exit status (kills after 10 s so no process outlives a test)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="fragscope_serve_test_")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(workdir):
    d = Daemon(workdir)
    yield d
    rc = d.stop()
    assert rc == 0, d.read_log()
    assert not os.path.exists(d.sock), "the socket must be removed on SIGTERM"


def full_sample(step=5, **over):
    counts, sizes = fragscope_agent.free_block_histogram([3 << 20, 3 << 20, 1 << 30, 4096])
    s = fragscope_agent.sample_from_memory_stats(
        {"reserved_bytes.all.current": 8 << 30, "allocated_bytes.all.current": 6 << 30,
         "active_bytes.all.current": 6 << 30, "requested_bytes.all.current": 5 << 30,
         "reserved_bytes.all.peak": 9 << 30, "allocated_bytes.all.peak": 7 << 30,
         "num_alloc_retries": 3, "num_ooms": 1},
        device_uuid=UUID, step=step, largest_free_block=1 << 30, max_allocatable=(1 << 30) + 7,
        stranded_bytes=4096, fragmentation_ratio=0.25, free_block_count=counts,
        free_block_bytes=sizes, forecast_level="warning", steps_to_oom=40)
    s.update(over)
    return s


def test_torch_state_reaches_metrics(daemon):
    # send_torch_state reads torch.cuda (a stand-in here: Debian's PyTorch has no CUDA) and the
    # daemon accepts what it builds: a 20 MiB segment with a 6 MiB gap, 1 MiB of driver free.
    MiB = 1 << 20
    segment = {"device": 0, "segment_type": "large", "total_size": 20 * MiB, "blocks": [
        {"size": 6 * MiB, "state": "inactive", "requested_size": 0},
        {"size": 14 * MiB, "state": "active_allocated", "requested_size": 14 * MiB - 5}]}
    cuda = types.SimpleNamespace(
        current_device=lambda: 0, mem_get_info=lambda d: (MiB, 80 << 30),
        memory_stats=lambda d: {"reserved_bytes.all.current": 20 * MiB,
                                "allocated_bytes.all.current": 14 * MiB, "num_ooms": 0},
        memory_snapshot=lambda: [segment],
        get_device_properties=lambda d: types.SimpleNamespace(uuid=UUID[len("GPU-"):]))
    with fragscope_agent.AgentClient(daemon.sock) as agent:
        assert agent.send_torch_state(12, torch=types.SimpleNamespace(cuda=cuda))
        daemon.wait_metric("fragscope_process_step", 12, pid=str(ME))
        m = daemon.metrics()
        labels = {"pid": str(ME), "UUID": UUID}
        assert value(m, "fragscope_process_reserved_bytes", **labels) == 20 * MiB
        assert value(m, "fragscope_process_requested_bytes", **labels) == 14 * MiB - 5
        assert value(m, "fragscope_process_largest_free_block_bytes", **labels) == 6 * MiB
        assert value(m, "fragscope_process_max_allocatable_bytes", **labels) == 6 * MiB
        assert value(m, "fragscope_process_fragmentation_ratio", **labels) == 0.3
        assert value(m, "fragscope_process_free_blocks", size_bucket="4MiB-8MiB", **labels) == 1
        assert value(m, "fragscope_agent_samples_rejected_total", reason="malformed") == 0


def leak_sample(step):
    """A process whose peak grows 8 MiB a step from 6 GiB on a 10 GiB device (no forecast)."""
    peak = (6 << 30) + step * (8 << 20)
    return fragscope_agent.sample_from_memory_stats(
        {"reserved_bytes.all.current": peak + (512 << 20), "allocated_bytes.all.current": peak // 2,
         "reserved_bytes.all.peak": peak + (512 << 20), "allocated_bytes.all.peak": peak,
         "num_alloc_retries": 0},
        device_uuid=UUID, step=step, device_free_bytes=(10 << 30) - peak - (512 << 20))


def test_daemon_forecasts_for_agents_that_send_none(workdir):
    d = Daemon(workdir)
    try:
        with fragscope_agent.AgentClient(d.sock) as agent:
            for step in range(0, 200, 10):
                assert agent.send_sample(leak_sample(step))
            d.wait_metric("fragscope_process_step", 190, pid=str(ME))
            m = d.metrics()
            assert value(m, "fragscope_process_forecast_level", pid=str(ME)) >= 3
            assert value(m, "fragscope_process_steps_to_oom", pid=str(ME)) > 0
            # The calibrated risk, one gauge per horizon, once the forecaster has enough steps:
            # probabilities that grow with the horizon; a leak this fast is at risk within 500.
            risk = [value(m, "fragscope_process_oom_risk", pid=str(ME), horizon_steps=str(h))
                    for h in (50, 100, 500)]
            assert all(r is not None and 0.0 <= r <= 1.0 for r in risk), risk
            assert risk[0] <= risk[1] <= risk[2], risk
            assert risk[2] > 0.1, risk
            # Where it comes from (issue 31 item 5): the limit it takes and the largest step,
            # the peak allocated (6 GiB + 8 MiB a step) plus the cache's cost, below the device.
            limit = value(m, "fragscope_process_oom_risk_limit_bytes", pid=str(ME))
            largest = value(m, "fragscope_process_oom_risk_largest_step_bytes", pid=str(ME))
            assert limit is not None and largest is not None, m
            assert (6 << 30) <= largest <= limit <= (10 << 30), (largest, limit)
            # ... and the API's rows say it in words.
            rows = json.loads(d.get("/api/v1/processes")[2])["processes"]
            assert "P(a new largest step within 100 steps)" in rows[0]["oom_risk_explanation"], rows
    finally:
        assert d.stop() == 0
    log = d.read_log()
    assert re.search(rf"forecast: pid {ME} on GPU-\S+, step 1[5-9]0: (warning|critical): ~\d+ steps "
                     r"to OOM: peak allocated grows", log), log
    # Issue 31 item 5: the line says where the risk comes from.
    assert re.search(r"forecast: pid \d+ on GPU-\S+, step \d+: (warning|critical): .*"
                     r"P\(a new largest step within 100 steps\)", log), log
    # --no-forecast: the level stays what the agent sent (nothing: unknown).
    d = Daemon(workdir, "--no-forecast")
    try:
        with fragscope_agent.AgentClient(d.sock) as agent:
            for step in range(0, 200, 10):
                assert agent.send_sample(leak_sample(step))
            d.wait_metric("fragscope_process_step", 190, pid=str(ME))
            assert value(d.metrics(), "fragscope_process_forecast_level", pid=str(ME)) == 0
            assert value(d.metrics(), "fragscope_process_oom_risk", pid=str(ME),
                         horizon_steps="100") is None
    finally:
        assert d.stop() == 0


def test_help_teaches_with_examples():
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    for needle in ("--socket", "--listen", "--textfile-dir", "--expiry", "Examples:",
                   "127.0.0.1:9464", "/run/fragscope/agent.sock"):
        assert needle in out.stdout


def test_samples_reach_metrics_and_promtool_accepts_them(daemon):
    status, ctype, body = daemon.get("/healthz")
    assert status == 200 and body == "ok\n"
    with fragscope_agent.AgentClient(daemon.sock, job="llm-7b", rank=2) as agent:
        assert agent.send_sample(full_sample(step=4))
        assert agent.send_sample(full_sample(step=5))
        daemon.wait_metric("fragscope_agent_samples_received_total", 2)
        status, ctype, text = daemon.get("/metrics")
        assert ctype.startswith("text/plain; version=0.0.4")
        m = parse_metrics(text)
        labels = {"pid": str(ME), "rank": "2", "job_name": "llm-7b", "UUID": UUID,
                  "Hostname": "itest"}
        assert value(m, "fragscope_process_reserved_bytes", **labels) == 8 << 30
        assert value(m, "fragscope_process_allocated_bytes", **labels) == 6 << 30
        assert value(m, "fragscope_process_peak_reserved_bytes", **labels) == 9 << 30
        assert value(m, "fragscope_process_cached_free_bytes", **labels) == 2 << 30
        assert value(m, "fragscope_process_largest_free_block_bytes", **labels) == 1 << 30
        assert value(m, "fragscope_process_max_allocatable_bytes", **labels) == (1 << 30) + 7
        assert value(m, "fragscope_process_alloc_retries_total", **labels) == 3
        assert value(m, "fragscope_process_ooms_total", **labels) == 1
        assert value(m, "fragscope_process_fragmentation_ratio", **labels) == 0.25
        assert value(m, "fragscope_process_forecast_level", **labels) == 3
        assert value(m, "fragscope_process_steps_to_oom", **labels) == 40
        assert value(m, "fragscope_process_step", **labels) == 5
        assert value(m, "fragscope_process_samples_total", **labels) == 2
        assert value(m, "fragscope_process_free_blocks", size_bucket="2MiB-4MiB", **labels) == 2
        assert value(m, "fragscope_process_free_block_bytes", size_bucket="2MiB-4MiB",
                     **labels) == 6 << 20
        assert value(m, "fragscope_process_free_blocks", size_bucket="1GiB-2GiB", **labels) == 1
        assert value(m, "fragscope_process_free_blocks", size_bucket="4KiB-8KiB", **labels) == 1
        # The daemon was given a library that does not exist (NO_NVML): NVML is absent, which
        # it reports, with the reason, and survives.
        nvml = [(dict(ls), v) for (n, ls), v in m.items() if n == "fragscope_nvml_available"]
        assert len(nvml) == 1 and nvml[0][1] == 0, nvml
        assert NO_NVML in nvml[0][0]["reason"], nvml
        assert value(m, "fragscope_gpus") == 0
        assert value(m, "fragscope_agent_series") == 1
    # The agent disconnected: its last sample lingers (--linger, 60 s by default) so a scrape
    # still sees the final state of a process that exited.
    time.sleep(0.5)
    assert value(daemon.metrics(), "fragscope_process_reserved_bytes") == 8 << 30
    assert f"NVML unavailable ({NO_NVML}" in daemon.read_log()
    promtool = require_tool("promtool", "prometheus")
    lint = subprocess.run([promtool, "check", "metrics"], input=text,
                          capture_output=True, text=True, timeout=30)
    # promtool parses the exposition (exit 1 on a format error) and lints it (exit 3).
    # The only lint allowed is DCGM's camelCase label names (UUID, modelName,
    # Hostname), kept on purpose so the series join with dcgm-exporter's.
    problems = [l for l in (lint.stdout + lint.stderr).splitlines()
                if l and "should be written in 'snake_case' not 'camelCase'" not in l]
    assert lint.returncode in (0, 3) and not problems, lint.stdout + lint.stderr


def test_unknown_summary_is_derived_or_left_out_not_zero(daemon):
    # docs/formats.md's minimal sample: reserved 60 GiB, allocated 49 GiB and nothing of the
    # snapshot summary. Cached free and the ratio follow from their definitions; max
    # allocatable, largest free block and stranded bytes are unknown and have no series (they
    # used to read 0: "no fragmentation" and a max allocatable that fires the critical rule).
    with fragscope_agent.AgentClient(daemon.sock, job="bare") as agent:
        assert agent.send_sample({"device_uuid": UUID, "step": 3, "reserved_bytes": 60 << 30,
                                  "allocated_bytes": 49 << 30})
        daemon.wait_metric("fragscope_agent_samples_received_total", 1)
        m = daemon.metrics()
        labels = {"pid": str(ME), "job_name": "bare", "UUID": UUID}
        assert value(m, "fragscope_process_reserved_bytes", **labels) == 60 << 30
        assert value(m, "fragscope_process_cached_free_bytes", **labels) == 11 << 30
        assert abs(value(m, "fragscope_process_fragmentation_ratio", **labels) - 11 / 60) < 1e-9
        for name in ("fragscope_process_max_allocatable_bytes",
                     "fragscope_process_largest_free_block_bytes",
                     "fragscope_process_stranded_bytes"):
            assert value(m, name, **labels) is None, name
        # With the largest free block and the device's free memory, max allocatable is known.
        assert agent.send_sample({"device_uuid": UUID, "step": 4, "reserved_bytes": 60 << 30,
                                  "allocated_bytes": 49 << 30, "largest_free_block": 3 << 30,
                                  "device_free_bytes": (5 << 30) + 12345})
        daemon.wait_metric("fragscope_process_max_allocatable_bytes", 5 << 30, **labels)


def test_unknown_path_is_404(daemon):
    with pytest.raises(urllib.error.HTTPError) as e:
        daemon.get("/nope")
    assert e.value.code == 404


def test_bad_agents_are_counted_and_good_ones_undisturbed(daemon):
    good = fragscope_agent.AgentClient(daemon.sock)
    assert good.send_sample(full_sample(step=1))

    def raw(data, wait_close=True):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(daemon.sock)
        try:
            s.sendall(data)
            if wait_close:
                try:
                    assert s.recv(1) == b""
                except ConnectionResetError:
                    pass
        finally:
            s.close()

    raw(b"\x10\x00\x00\x00JUNKxxxxxxxxxxxx")
    raw(b"\xff\xff\xff\x7f")
    raw(fragscope_agent.encode_frame(b'{"pid": "seven", "device_uuid": "GPU-x"}'))
    raw(fragscope_agent.encode_frame(b"{}", version=2))
    raw(fragscope_agent.encode_sample({"pid": 1, "device_uuid": "G"})[:9], wait_close=False)
    raw(fragscope_agent.encode_sample({"pid": 1, "device_uuid": "G"}) * 1000)
    for reason in ("bad_magic", "oversized", "malformed", "unsupported_version", "truncated",
                   "rate_limited"):
        daemon.wait_metric("fragscope_agent_samples_rejected_total", 1, reason=reason)
    assert good.send_sample(full_sample(step=2))
    daemon.wait_metric("fragscope_process_step", 2, pid=str(ME))
    log = daemon.read_log()
    assert "field \"pid\": expected an integer" in log
    assert "(rate_limited)" in log
    good.close()


def test_silent_agent_expires(workdir):
    d = Daemon(workdir, "--expiry", "0.5")
    try:
        agent = fragscope_agent.AgentClient(d.sock)
        assert agent.send_sample(full_sample())
        d.wait_metric("fragscope_agent_series", 1)
        d.wait_metric("fragscope_agent_series", 0, timeout=5)
        # It comes back on its next sample (the client reconnects after the idle close).
        assert agent.send_sample(full_sample(step=6)) or agent.send_sample(full_sample(step=6))
        d.wait_metric("fragscope_process_step", 6, pid=str(ME))
        agent.close()
    finally:
        assert d.stop() == 0


def test_a_disconnected_process_lingers_then_leaves(workdir):
    """An agent that exits (an OOM, the monitor's checkpoint and stop) keeps its last sample
    on /metrics for --linger seconds, so the scrape after its exit still sees it, then leaves;
    the counter of expired series counts it."""
    d = Daemon(workdir, "--linger", "1.5")
    try:
        agent = fragscope_agent.AgentClient(d.sock)
        assert agent.send_sample(full_sample(step=9))
        d.wait_metric("fragscope_process_step", 9, pid=str(ME))
        agent.close()
        closed = time.monotonic()
        time.sleep(0.5)
        m = d.metrics()
        assert value(m, "fragscope_process_step", pid=str(ME)) == 9
        assert value(m, "fragscope_process_forecast_level", pid=str(ME)) == 3
        d.wait_metric("fragscope_agent_series", 0, timeout=5)
        assert time.monotonic() - closed >= 1.4
        assert value(d.metrics(), "fragscope_agent_series_expired_total") == 1
    finally:
        assert d.stop() == 0


def test_textfile_mode_writes_atomically(workdir):
    textdir = os.path.join(workdir, "textfile")
    os.mkdir(textdir)
    d = Daemon(workdir, "--listen", "none", "--textfile-dir", textdir)
    try:
        agent = fragscope_agent.AgentClient(d.sock)
        assert agent.send_sample(full_sample(step=77))
        path = os.path.join(textdir, "fragscope.prom")
        deadline = time.time() + 5
        got = None
        while time.time() < deadline:
            if os.path.exists(path):
                got = value(parse_metrics(open(path).read()), "fragscope_process_step", pid=str(ME))
                if got == 77:
                    break
            time.sleep(0.05)
        assert got == 77
        assert sorted(os.listdir(textdir)) == ["fragscope.prom"]
        agent.close()
    finally:
        assert d.stop() == 0
    # A stopped daemon leaves no file claiming it is up.
    assert os.listdir(textdir) == []


def test_refuses_to_clobber_and_to_share_a_socket(workdir, daemon):
    # A regular file at the socket path is never replaced.
    path = os.path.join(workdir, "precious")
    with open(path, "w") as f:
        f.write("data")
    out = subprocess.run([BIN, "serve", "--socket", path, "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 2 and "not a socket" in out.stderr
    assert open(path).read() == "data"
    # A live daemon's socket is not taken over.
    out = subprocess.run([BIN, "serve", "--socket", daemon.sock, "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1 and "in use" in out.stderr
    assert os.path.exists(daemon.sock)
    # Nor its port (no SO_REUSEPORT sharing), and the new socket is cleaned up.
    other = os.path.join(workdir, "other.sock")
    out = subprocess.run([BIN, "serve", "--socket", other, "--listen", f"127.0.0.1:{daemon.port}"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 1 and "cannot listen on 127.0.0.1:" in out.stderr, out.stderr
    assert not os.path.exists(other)
    # Bad usage.
    # --listen none alone has the API socket (auto) as its sink: not bad usage (tests/cli/
    # test_serve_sinks.py); with --api-socket none and no --textfile-dir it is.
    for bad in (["--listen", "9464"], ["--listen", "none", "--api-socket", "none"],
                ["--socket-mode", "999"], ["--max-message-bytes", "1"]):
        out = subprocess.run([BIN, "serve", "--socket", os.path.join(workdir, "x.sock"), *bad],
                             capture_output=True, text=True, timeout=10)
        assert out.returncode == 2, (bad, out.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_the_daemon(daemon, workdir):
    prometheus = require_tool("prometheus", "prometheus")
    agents = [fragscope_agent.AgentClient(daemon.sock, job="itest-job", rank=r) for r in range(2)]
    for r, agent in enumerate(agents):  # one process, two GPUs: two series
        assert agent.send_sample(full_sample(step=10 + r, largest_free_block=(r + 1) << 20,
                                             device_uuid=UUID if r == 0 else UUID[:-1] + "0"))
    prom_port = free_port()
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fragscope
    static_configs:
      - targets: ["127.0.0.1:{daemon.port}"]
""")
    log = open(os.path.join(workdir, "prometheus.log"), "w+")
    prom = subprocess.Popen(
        [prometheus, f"--config.file={config}",
         f"--storage.tsdb.path={os.path.join(workdir, 'tsdb')}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        def query(q):
            url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            with urllib.request.urlopen(url, timeout=5) as r:
                data = json.load(r)
            assert data["status"] == "success", data
            return data["data"]["result"]

        deadline = time.time() + 90
        result = []
        while time.time() < deadline:
            assert prom.poll() is None, "prometheus exited:\n" + open(log.name).read()[-3000:]
            try:
                result = query('fragscope_process_largest_free_block_bytes{job_name="itest-job"}')
            except OSError:
                result = []
            if len(result) == 2:
                break
            for agent in agents:  # keep the series fresh
                r = agent.defaults["rank"]
                agent.send_sample(full_sample(step=10, largest_free_block=r + 1 << 20,
                                              device_uuid=UUID if r == 0 else UUID[:-1] + "0"))
            time.sleep(0.5)
        got = {r["metric"]["rank"]: float(r["value"][1]) for r in result}
        assert got == {"0": float(1 << 20), "1": float(2 << 20)}, result
        # The scrape job's own labels sit beside ours: job="fragscope", instance=the daemon.
        assert all(r["metric"]["job"] == "fragscope" for r in result)
        assert {r["metric"]["UUID"] for r in result} == {UUID, UUID[:-1] + "0"}
        up = query('up{job="fragscope"}')
        assert up and up[0]["value"][1] == "1"
        received = query("fragscope_agent_samples_received_total")
        assert float(received[0]["value"][1]) >= 2
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()
        for agent in agents:
            agent.close()


def test_short_soak_loses_no_sample():
    """8 agents x 10 samples/s x 5 s with faults and 100 ms scrapes (make soak: 64 x 60 s)."""
    out = subprocess.run(
        [sys.executable, os.path.join(SOURCE_DIR, "tools", "soak_serve.py"), "--bin", BIN,
         "--agents", "8", "--rate", "10", "--seconds", "5", "--procs", "2",
         # Latency is make soak's to judge (a quiet machine); here only losses count.
         "--p99-target-ms", "1000"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["samples_sent"] == 400
    assert summary["problems"] == []
    assert all(n > 0 for n in summary["faults_injected"].values())


def test_systemd_unit_verifies(workdir):
    systemd_analyze = require_tool("systemd-analyze", "systemd")
    unit = open(os.path.join(SOURCE_DIR, "deploy", "systemd", "fragscope.service")).read()
    assert "ExecStart=/usr/local/bin/fragscope serve" in unit
    # The unit names the installed path; verify it against the built binary instead.
    path = os.path.join(workdir, "fragscope.service")
    with open(path, "w") as f:
        f.write(unit.replace("/usr/local/bin/fragscope", os.path.abspath(BIN)))
    out = subprocess.run([systemd_analyze, "verify", path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


def test_python_client_frame_is_the_documented_example():
    frame = fragscope_agent.encode_frame(b'{"pid":4242,"device_uuid":"GPU-1","step":7}')
    assert frame.hex(" ") == (
        "33 00 00 00 46 53 41 47 01 00 01 00 7b 22 70 69 64 22 3a 34 32 34 32 2c 22 64 65 76 "
        "69 63 65 5f 75 75 69 64 22 3a 22 47 50 55 2d 31 22 2c 22 73 74 65 70 22 3a 37 7d")
    doc = open(os.path.join(SOURCE_DIR, "docs", "formats.md")).read()
    assert "00000000: 33 00 00 00 46 53 41 47 01 00 01 00 7b 22 70 69" in doc
    counts, sizes = fragscope_agent.free_block_histogram([0, 1, 512, 1023, 1 << 20])
    assert counts[0] == 2 and counts[9] == 2 and counts[20] == 1
    assert sizes[9] == 1535
    s = fragscope_agent.sample_from_memory_stats(
        {"reserved_bytes.all.current": 10, "allocated_bytes.all.current": 4, "num_ooms": 2},
        device_uuid="GPU-x")
    assert s == {"reserved_bytes": 10, "allocated_bytes": 4, "num_ooms": 2,
                 "cached_free_bytes": 6, "device_uuid": "GPU-x"}
    with pytest.raises(ValueError):
        fragscope_agent.AgentClient("/nonexistent/sock").send_sample({"pid": 1})
    # A daemon that is not there: False, never an exception.
    assert fragscope_agent.AgentClient("/nonexistent/sock").send_sample(
        {"device_uuid": "GPU-x"}) is False


def test_sigterm_right_after_start_never_hangs(workdir):
    for delay in (0.0, 0.005, 0.02, 0.05):
        sock = os.path.join(workdir, "quick.sock")
        proc = subprocess.Popen([BIN, "serve", "--socket", sock, "--listen", "127.0.0.1:0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"serve hung on SIGTERM {delay} s after start")
        # Before the handler is in place the default action ends it (-15); after, exit 0.
        assert rc in (0, -signal.SIGTERM), rc
        assert not os.path.exists(sock) or rc != 0


FAKE_NVML = os.environ.get("FRAGSCOPE_FAKE_NVML", "")
NODE2_GPU0 = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"


def require_fake_nvml():
    """The stand-in libnvidia-ml (tests/testing/fake_nvml) that ctest passes in."""
    if FAKE_NVML and os.path.exists(FAKE_NVML):
        return FAKE_NVML
    message = f"FRAGSCOPE_FAKE_NVML (the stand-in libnvidia-ml) not set or missing: {FAKE_NVML!r}"
    if REQUIRE_TOOLS:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def test_gpu_facts_from_nvml_and_procfs_join_the_agent_series(workdir):
    """The daemon loads NVML through the same dlopen path as production (here the tests'
    stand-in library answering from a fixture), joins /proc/driver/nvidia by UUID, and labels
    the agent's series with the GPU's index, bus id and model."""
    require_fake_nvml()
    env = dict(os.environ,
               FRAGSCOPE_FAKE_NVML_FIXTURE=os.path.join(SOURCE_DIR, "tests/data/nvml/node2.txt"))
    d = Daemon(workdir, "--nvml-lib", FAKE_NVML, "--proc-root",
               os.path.join(SOURCE_DIR, "tests/data/procfs/node2"), env=env)
    try:
        d.wait_metric("fragscope_nvml_available", 1)
        m = d.metrics()
        assert value(m, "fragscope_gpu_memory_total_bytes", UUID=NODE2_GPU0) == 85899345920
        assert value(m, "fragscope_gpu_memory_used_bytes", UUID=NODE2_GPU0) == 21474836480
        with fragscope_agent.AgentClient(d.sock) as agent:
            assert agent.send_sample(full_sample(device_uuid=NODE2_GPU0))
            d.wait_metric("fragscope_agent_samples_received_total", 1)
            m = d.metrics()
            assert value(m, "fragscope_process_reserved_bytes", UUID=NODE2_GPU0, gpu="0",
                         pci_bus_id="00000000:3B:00.0",
                         modelName="NVIDIA A100-SXM4-80GB") == 8 << 30
        assert "NVML available: 2 GPU(s), driver 535.104.05" in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_samples_are_recorded_in_the_history(workdir):
    import sqlite3
    d = Daemon(workdir)
    with fragscope_agent.AgentClient(d.sock, run="nightly-3", job="j") as agent:
        for step in range(3):
            assert agent.send_sample(full_sample(step=step, largest_request_bytes=5 << 20))
        d.wait_metric("fragscope_agent_samples_received_total", 3)
    assert d.stop() == 0, d.read_log()  # the last batch is flushed at shutdown
    assert "history: 3 samples written" in d.read_log()
    db = sqlite3.connect(d.history)
    try:
        rows = db.execute("SELECT run, pid, step, reserved_bytes, largest_request_bytes "
                          "FROM samples ORDER BY step").fetchall()
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()
    assert rows == [("nightly-3", ME, s, 8 << 30, 5 << 20) for s in range(3)]
    # A damaged history is refused at start, and left as it was.
    bad = os.path.join(workdir, "bad.sqlite")
    with open(bad, "wb") as f:
        f.write(b"not a database\n" * 64)
    out = subprocess.run([BIN, "serve", "--socket", os.path.join(workdir, "b.sock"),
                          "--listen", "127.0.0.1:0", "--history", bad],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and bad in out.stderr, out.stderr
    with open(bad, "rb") as f:
        assert f.read() == b"not a database\n" * 64


RECORD_HOOK = os.path.join(SOURCE_DIR, "tests", "data", "alerts", "record_hook.sh")


def test_a_fired_alert_reaches_its_hook(workdir):
    out = os.path.join(workdir, "fired")
    config = os.path.join(workdir, "rules.toml")
    with open(config, "w") as f:
        f.write(f"""
[hooks.record]
type = "exec"
command = [{json.dumps(RECORD_HOOK)}, {json.dumps(out)}]
timeout = "10s"

[[rules]]
name = "ForecastWarning"
metric = "forecast_level"
op = ">="
value = "warning"
for = "0s"
severity = "warning"
hooks = ["record"]
""")
    d = Daemon(workdir, "--alerts", config)
    try:
        with fragscope_agent.AgentClient(d.sock, rank=1, job="train; rm -rf /") as agent:
            assert agent.send_sample(full_sample(step=9))  # forecast_level "warning"
            # The daemon logs the delivery after the hook exits; the hook's files exist (empty)
            # before it has written them, so waiting for them alone races.
            deadline = time.time() + 20
            while "-> hook record" not in d.read_log() and time.time() < deadline:
                time.sleep(0.1)
        assert os.path.exists(out + ".json"), d.read_log()
        with open(out + ".json") as f:
            alert = json.load(f)
        assert alert["alert"] == "ForecastWarning" and alert["state"] == "firing"
        with open(out + ".env", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        assert env[b"FRAGSCOPE_ALERT_NAME"] == b"ForecastWarning"
        assert env[b"FRAGSCOPE_ALERT_JOB"] == b"train; rm -rf /"  # literal, never a shell
        assert "alert ForecastWarning firing" in d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()
    # A broken rules file is a usage error before the daemon starts.
    with open(config, "w") as f:
        f.write('[[rules]]\nname = "x"\nmetric = "nope"\n')
    r = subprocess.run([BIN, "serve", "--socket", os.path.join(workdir, "c.sock"),
                        "--listen", "127.0.0.1:0", "--history", "none", "--alerts", config],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--alerts" in r.stderr, r.stderr


# --- docs/exporter.md against what the daemon really exports ---------------------------------

EXPORTER_DOC = os.path.join(SOURCE_DIR, "docs", "exporter.md")
# Documented metrics that none of the states set up in test_exporter_doc_lists_every_family
# gives a sample (their family is still there, HELP and TYPE only), each with why. Empty today:
# the fake NVML's node2 fixture and one full agent sample produce every series.
# Families with samples only in states the test above does not build; each is checked elsewhere.
CONDITIONAL = {
    # The daemon's risk needs 120 steps of samples: test_daemon_forecasts_for_agents_that_send_none.
    "fragscope_process_oom_risk": "after 120 steps",
    "fragscope_process_oom_risk_limit_bytes": "with the risk",
    "fragscope_process_oom_risk_largest_step_bytes": "with the risk",
}


def documented_families():
    """{name: type} from the metric tables of docs/exporter.md (rows "| `name` | type | ...")."""
    with open(EXPORTER_DOC, encoding="utf-8") as f:
        text = f.read()
    rows = re.findall(r"^\| `(fragscope_[a-z0-9_]+)` \| ([a-z]+) \|", text, re.MULTILINE)
    names = [n for n, _ in rows]
    assert len(names) == len(set(names)), "a metric listed twice in docs/exporter.md"
    # Any other `fragscope_...` in the prose names a listed metric (or is a prefix: `..._*`).
    mentioned = set(re.findall(r"`(fragscope_[a-z0-9_]*[a-z0-9])`", text))
    assert mentioned <= set(names), f"docs/exporter.md mentions unlisted {mentioned - set(names)}"
    return dict(rows), text


def exposed_families(text):
    """({name: type} from the # TYPE lines, {names with at least one sample})."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    with_samples = {n for (n, _) in parse_metrics(text)}
    return types, with_samples


def test_exporter_doc_lists_every_family(workdir):
    """Both ways: every family the daemon exports is documented with its type, and every
    documented metric is exported, with samples in one of the states below."""
    fake_nvml = require_fake_nvml()
    documented, _ = documented_families()
    # State 1: two GPUs through the stand-in NVML and /proc, one agent with every field.
    env = dict(os.environ,
               FRAGSCOPE_FAKE_NVML_FIXTURE=os.path.join(SOURCE_DIR, "tests/data/nvml/node2.txt"))
    os.mkdir(os.path.join(workdir, "gpus"))
    d = Daemon(os.path.join(workdir, "gpus"), "--nvml-lib", fake_nvml, "--proc-root",
               os.path.join(SOURCE_DIR, "tests/data/procfs/node2"), env=env)
    try:
        d.wait_metric("fragscope_nvml_available", 1)
        with fragscope_agent.AgentClient(d.sock, rank=0, job="doc") as agent:
            assert agent.send_sample(full_sample(device_uuid=NODE2_GPU0,
                                                 largest_request_bytes=5 << 20))
            d.wait_metric("fragscope_agent_series", 1)
            full_types, full_samples = exposed_families(d.get("/metrics")[2])
    finally:
        assert d.stop() == 0, d.read_log()
    # State 2: no NVML, no /proc, no agent.
    os.mkdir(os.path.join(workdir, "bare"))
    d = Daemon(os.path.join(workdir, "bare"))
    try:
        bare_types, bare_samples = exposed_families(d.get("/metrics")[2])
    finally:
        assert d.stop() == 0, d.read_log()

    undocumented = sorted(set(full_types) - set(documented))
    assert not undocumented, f"exported but not in docs/exporter.md: {undocumented}"
    not_exported = sorted(set(documented) - set(full_types))
    assert not not_exported, f"in docs/exporter.md but not exported: {not_exported}"
    wrong_type = {n: (documented[n], full_types[n]) for n in documented
                  if documented[n] != full_types[n]}
    assert not wrong_type, f"(documented, exported) types differ: {wrong_type}"
    # "Every family is always present with its HELP and TYPE lines" (docs/exporter.md).
    assert bare_types == full_types
    assert "fragscope_process_reserved_bytes" not in bare_samples  # state 2 really is bare
    no_samples = sorted(set(documented) - full_samples - bare_samples - set(CONDITIONAL))
    assert not no_samples, f"documented, but no state here gives a sample: {no_samples}"
    stale = {n for n in CONDITIONAL if n not in documented or n in full_samples | bare_samples}
    assert not stale, f"CONDITIONAL lists {stale}, which are undocumented or have samples now"


# --- kill -9 of the daemon and its history ----------------------------------------------------


def committed_rows(path):
    """(stream key, step) of the samples another connection sees as committed. Read-only: this
    reader never writes to the database, nor checkpoints its WAL."""
    import sqlite3
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return set(db.execute("SELECT CAST(substr(device_uuid, 5) AS INTEGER), step FROM samples"))
    finally:
        db.close()


def test_kill_9_keeps_every_committed_sample(workdir):
    """SIGKILL the daemon three times at random moments of a sample stream, on one history
    file: after each kill the database passes integrity_check and holds every sample a
    reader saw committed before the kill, and the next daemon opens it."""
    import random
    import sqlite3
    import threading
    seed = int(os.environ.get("FRAGSCOPE_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    history = os.path.join(workdir, "history.sqlite")
    attempted = set()  # (pid, step) of every sample sent, accepted or not
    kept = set()  # rows after the previous kill
    for kill in range(3):
        # The same history each round: the daemon reopens what the killed one left.
        d = Daemon(workdir, "--max-rate", "5000", "--burst", "5000")
        stop = threading.Event()

        def stream(pid):
            # One process: the streams are told apart by their device ("GPU-<key>").
            with fragscope_agent.AgentClient(d.sock, run=f"kill-{kill}") as agent:
                step = 0
                while not stop.is_set():
                    attempted.add((pid, step))
                    agent.send_sample(full_sample(step=step, device_uuid=f"GPU-{pid}"))
                    step += 1
                    time.sleep(0.001)

        pids = (9000 + 10 * kill, 9001 + 10 * kill)
        threads = [threading.Thread(target=stream, args=(p,)) for p in pids]
        for t in threads:
            t.start()
        try:
            deadline = time.time() + 5
            while not any(p in pids for p, _ in committed_rows(history)):
                assert time.time() < deadline, "no sample committed:\n" + d.read_log()
                time.sleep(0.02)
            # Anywhere in the 0.2 s flush cycle: between batches, mid-insert, mid-commit.
            time.sleep(rng.uniform(0, 0.6))
            seen = committed_rows(history)
            d.proc.send_signal(signal.SIGKILL)  # right after the reader's look
            d.proc.wait(timeout=10)
        finally:
            stop.set()
            for t in threads:
                t.join()
            if d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()
            d.log.close()
        assert d.proc.returncode == -signal.SIGKILL
        db = sqlite3.connect(history)
        try:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            after = set(db.execute("SELECT CAST(substr(device_uuid, 5) AS INTEGER), step FROM samples"))
        finally:
            db.close()
        context = f"(kill {kill}, FRAGSCOPE_TEST_SEED={seed})"
        this_round = {r for r in seen if r[0] in pids}
        assert len(this_round) > 0, context
        lost = seen - after
        assert not lost, f"{len(lost)} committed samples lost {context}: {sorted(lost)[:5]}"
        assert kept <= after, f"rows of an earlier round lost {context}"
        assert after <= attempted, f"rows nobody sent {context}: {sorted(after - attempted)[:5]}"
        kept = after
    # A clean start and stop on the thrice-killed file.
    d = Daemon(workdir)
    assert d.stop() == 0, d.read_log()
    assert committed_rows(history) == kept
