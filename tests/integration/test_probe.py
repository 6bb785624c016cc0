"""`fragscope probe` and the Server Scout plugin (deploy/scout-plugin-fragscope.sh) against a
live `fragscope serve` (docs/live-monitoring.md, "Monitoring systems")."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import BIN, SOURCE_DIR, Daemon, full_sample, fragscope_agent  # noqa: E402

PLUGIN = os.path.join(SOURCE_DIR, "deploy", "scout-plugin-fragscope.sh")


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(str(tmp_path))
    yield d
    d.stop()


def probe(daemon, *args):
    return subprocess.run([BIN, "probe", "--url", f"http://127.0.0.1:{daemon.port}/metrics",
                           *args], capture_output=True, text=True, timeout=30)


def plugin(daemon, function):
    env = dict(os.environ, FRAGSCOPE_BIN=BIN,
               FRAGSCOPE_METRICS_URL=f"http://127.0.0.1:{daemon.port}/metrics")
    return subprocess.run(["bash", "-c", f'source "{PLUGIN}"; echo "tier=$PLUGIN_TIER"; '
                           f'{function}'], env=env, capture_output=True, text=True, timeout=30)


def send(daemon, client, **over):
    assert client.send_sample(full_sample(**over))


def test_probe_levels_follow_the_worst_process(daemon):
    out = probe(daemon)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("FRAGSCOPE OK - no training process")
    with fragscope_agent.AgentClient(daemon.sock, job="j", rank=0) as a, \
            fragscope_agent.AgentClient(daemon.sock, job="j", rank=3) as b:  # another GPU
        send(daemon, a, forecast_level="ok", fragmentation_ratio=0.05)
        send(daemon, b, device_uuid="GPU-other", forecast_level="warning", fragmentation_ratio=0.10, steps_to_oom=120)
        daemon.wait_metric("fragscope_process_forecast_level", 3, rank="3")
        out = probe(daemon)
        assert out.returncode == 1, out.stdout
        line = out.stdout.strip()
        assert line.startswith("FRAGSCOPE WARNING - 2 process(es); worst risk warning (rank 3")
        assert "~120 steps to OOM" in line
        perf = line.split(" | ")[1].split(" ")
        assert perf[0] == "'risk'=3;3;4;0;4"
        assert perf[1] == "'fragmentation'=0.100;;;0;1"
        send(daemon, b, device_uuid="GPU-other", step=6, forecast_level="critical",
             fragmentation_ratio=0.10)
        daemon.wait_metric("fragscope_process_forecast_level", 4, rank="3")
        assert probe(daemon).returncode == 2
        js = json.loads(probe(daemon, "--json").stdout)
        assert js["status"] == "CRITICAL" and js["code"] == 2 and js["worst"]["rank"] == "3"
        # Fragmentation alone is information: OK risk stays OK (a threshold the user gives
        # makes it a level).
        send(daemon, b, device_uuid="GPU-other", step=7, forecast_level="ok",
             fragmentation_ratio=0.35)
        daemon.wait_metric("fragscope_process_forecast_level", 1, rank="3")
        out = probe(daemon)
        assert out.returncode == 0 and "fragmentation 0.35" in out.stdout, out.stdout
        out = probe(daemon, "--warning-fragmentation", "0.3")
        assert out.returncode == 1 and "over your threshold" in out.stdout, out.stdout
        assert "'fragmentation'=0.350;0.300;;0;1" in out.stdout


def test_probe_calls_a_healthy_caching_job_ok(daemon):
    # A finished toy job: 82% of what it reserved is cached for reuse, the forecast is ok and
    # its largest request fits many times over. Not an alarm (issue 29, item 3).
    with fragscope_agent.AgentClient(daemon.sock, job="j", rank=0) as a:
        send(daemon, a, forecast_level="ok", fragmentation_ratio=0.82, steps_to_oom=None,
             largest_request_bytes=4 << 20)
        daemon.wait_metric("fragscope_process_forecast_level", 1, rank="0")
        out = probe(daemon)
        assert out.returncode == 0, out.stdout
        assert out.stdout.startswith("FRAGSCOPE OK - 1 process(es); worst risk ok")
        assert "fragmentation 0.82" in out.stdout and "information" in out.stdout


def test_probe_calls_the_bundled_sample_at_its_healthy_capacity_ok(daemon):
    # Issue 29 item 3, end to end: the bundled sample replayed on 1 GiB (where it fits with room
    # to spare, caching 81-100% of what it reserves at each step's end), sent step by step
    # without a level of its own: the daemon's forecaster (LiveForecasts) calls it ok, and so
    # does probe. Before, every sample was "watch: fragmentation ratio 0.81 > 0.30".
    capacity = 1 << 30
    r = subprocess.run([BIN, "replay", "tests/data/sample/gpt_tiny_50steps.jsonl.gz",
                        "--capacity", "1GiB", "--json", "--no-map"], cwd=SOURCE_DIR,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [row for row in json.loads(r.stdout)["analysis"]["devices"][0]["timeline"]
            if row["step_first"] >= 0]
    retries = 0
    with fragscope_agent.AgentClient(daemon.sock, job="j", rank=0) as a:
        for row in rows:
            retries += row["alloc_retries"] or 0
            s = fragscope_agent.sample_from_memory_stats(
                {"reserved_bytes.all.current": row["reserved_bytes"],
                 "allocated_bytes.all.current": row["allocated_bytes"],
                 "requested_bytes.all.current": row["live_requested_bytes"],
                 "reserved_bytes.all.peak": row["peak_reserved_bytes"],
                 "allocated_bytes.all.peak": row["peak_allocated_bytes"],
                 "num_alloc_retries": retries, "num_ooms": 0},
                device_uuid="GPU-sample", step=row["step_last"],
                largest_free_block=row["largest_free_block_bytes"],
                max_allocatable=row["max_allocatable_bytes"],
                stranded_bytes=row["stranded_bytes"],
                fragmentation_ratio=row["fragmentation_ratio"],
                largest_request_bytes=row["largest_request_bytes"],
                device_free_bytes=capacity - row["reserved_bytes"])
            assert a.send_sample(s)
        daemon.wait_metric("fragscope_process_step", rows[-1]["step_last"], rank="0")
        daemon.wait_metric("fragscope_process_forecast_level", 1, rank="0")
        out = probe(daemon)
        assert out.returncode == 0, out.stdout
        assert out.stdout.startswith("FRAGSCOPE OK - 1 process(es); worst risk ok"), out.stdout


def test_probe_is_critical_when_the_largest_request_no_longer_fits(daemon):
    # The ratio is low and the forecast has not caught up, but the largest single allocation
    # that would succeed is below the job's largest request: the next one fails.
    with fragscope_agent.AgentClient(daemon.sock, job="j", rank=0) as a:
        send(daemon, a, forecast_level="ok", fragmentation_ratio=0.05, steps_to_oom=None,
             largest_request_bytes=2 << 30, max_allocatable=1 << 30)
        daemon.wait_metric("fragscope_process_forecast_level", 1, rank="0")
        out = probe(daemon)
        assert out.returncode == 2, out.stdout
        assert "the largest request (2.00 GiB) no longer fits: max allocatable 1.00 GiB" in out.stdout


def test_probe_unknown_when_the_daemon_is_down(tmp_path):
    out = subprocess.run([BIN, "probe", "--url", "http://127.0.0.1:9/metrics", "--timeout",
                          "0.5"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 3 and out.stdout.startswith("FRAGSCOPE UNKNOWN - cannot read")
    # The reason in words, not httplib's bare enumerator name ("...: Connection (is ...").
    assert "could not connect" in out.stdout, out.stdout
    bad = subprocess.run([BIN, "probe", "--url", "ftp://x"], capture_output=True, text=True)
    assert bad.returncode == 3 and "expected http://" in bad.stdout


def test_scout_plugin_functions_against_a_live_daemon(daemon, tmp_path):
    detect = plugin(daemon, "detect")
    assert detect.returncode == 0 and "tier=standard" in detect.stdout
    with fragscope_agent.AgentClient(daemon.sock, job="j", rank=1) as a:
        send(daemon, a, forecast_level="warning", fragmentation_ratio=0.1)
        daemon.wait_metric("fragscope_process_forecast_level", 3, rank="1")
        collect = plugin(daemon, "collect")
        assert collect.returncode == 1 and "FRAGSCOPE WARNING" in collect.stdout
        js = plugin(daemon, "json")
        assert json.loads(js.stdout.split("\n", 1)[1])["worst_level"] == "warning"
    down = subprocess.run(["bash", "-c", f'source "{PLUGIN}"; detect'],
                          env=dict(os.environ, FRAGSCOPE_BIN=BIN,
                                   FRAGSCOPE_METRICS_URL="http://127.0.0.1:9/metrics"),
                          capture_output=True, text=True, timeout=30)
    assert down.returncode == 1


# --- hostile endpoints (issue 30, item 11) ----------------------------------------------------

def serve_once(handler):
    """A loopback listener that runs `handler(conn)` for each connection in a thread."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return server, f"http://127.0.0.1:{server.getsockname()[1]}/metrics"


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk


def run_probe(url, *args, timeout=60):
    import time
    begin = time.monotonic()
    out = subprocess.run([BIN, "probe", "--url", url, *args], capture_output=True, text=True,
                         timeout=timeout)
    return out, time.monotonic() - begin


@pytest.mark.parametrize("where", ["head", "body"])
def test_timeout_bounds_the_whole_run_against_a_trickling_endpoint(where):
    import time

    def trickle(conn):
        try:
            read_request(conn)
            if where == "body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(200):  # one byte every 0.1 s: each read is quick, the whole is not
                conn.sendall(b"X-A: b\r\n"[:1] if where == "head" else b"#")
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            conn.close()

    server, url = serve_once(trickle)
    try:
        out, took = run_probe(url, "--timeout", "1")
        assert out.returncode == 3, out
        assert out.stdout.startswith("FRAGSCOPE UNKNOWN - cannot read"), out.stdout
        # The sanitizer build starts slower; the bound is the timeout plus start-up either way.
        limit = 2.5 * (3 if os.environ.get("FRAGSCOPE_SANITIZED") else 1)
        assert took < limit, f"probe --timeout 1 took {took:.2f} s against a trickling endpoint"
    finally:
        server.close()


def test_an_endless_body_is_capped():
    def endless(conn):
        try:
            read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            block = b"# endless\n" * 100000
            while True:
                conn.sendall(block)
        except OSError:
            pass
        finally:
            conn.close()

    server, url = serve_once(endless)
    try:
        out, took = run_probe(url, "--timeout", "30")
        assert out.returncode == 3 and "sent more than 64 MiB" in out.stdout, out
    finally:
        server.close()


def test_a_bar_in_a_label_value_cannot_reorder_the_perfdata():
    page = ('fragscope_up{Hostname="h"} 1\n'
            'fragscope_process_forecast_level{pid="7",rank="0",gpu="0| \'risk\'=0;3;4;0;4"} 3\n'
            'fragscope_process_fragmentation_ratio{pid="7",rank="0",gpu="0| \'risk\'=0;3;4;0;4"}'
            ' 0.1\n').encode()

    def answer(conn):
        try:
            read_request(conn)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                         % len(page) + page)
        finally:
            conn.close()

    server, url = serve_once(answer)
    try:
        out, _ = run_probe(url)
        assert out.returncode == 1, out
        line = out.stdout.strip()
        assert line.count("|") == 1, line
        assert line.split(" | ")[1].split(" ")[0] == "'risk'=3;3;4;0;4", line
        assert "gpu 0%7C 'risk'=0;3;4;0;4" in line
    finally:
        server.close()
