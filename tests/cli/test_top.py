"""`fragscope top --once` and its usage errors, against endpoints that are not a healthy daemon:
nothing listening, a server that answers 404, and one that answers hostile JSON. The live
daemon with two processes is tests/integration/test_top.py."""
import http.server
import json
import os
import socket
import socketserver
import subprocess
import tempfile
import threading

import pytest

BIN = os.environ.get("FRAGSCOPE_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def top(*args, columns=80):
    return subprocess.run([BIN, "top", *args], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL,
                          env=dict(os.environ, COLUMNS=str(columns), LANG="C.UTF-8"))


def handler(status, body):
    """A request handler answering every GET with (status, body)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def address_string(self):
            return "client"

        def log_message(self, *args):
            pass

    return Handler


class Server:
    """A loopback HTTP server answering every GET with (status, body)."""

    def __init__(self, status, body):
        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), handler(status, body))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class UnixServer:
    """The same answers on a Unix socket (as `serve --api-socket`), in a folder of its own."""

    def __init__(self, status, body):
        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.dir = tempfile.mkdtemp(prefix="fstop")
        self.path = os.path.join(self.dir, "agent.api.sock")
        self.httpd = Server(self.path, handler(status, body))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        os.unlink(self.path)
        os.rmdir(self.dir)


def serve(status, body, columns=80):
    s = Server(status, body)
    try:
        return top("--once", "--url", s.url, columns=columns)
    finally:
        s.close()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_usage_errors_say_what_is_expected():
    out = top("--once", "--sort", "worst")
    assert out.returncode == 2
    assert "--sort worst: expected level, reserved, allocated, fragmentation or risk" in out.stderr
    out = top("--once", "--url", "ftp://x")
    assert out.returncode == 2 and "--url ftp://x: expected http://HOST:PORT" in out.stderr
    out = top("--once", "--url", "http://127.0.0.1:1/other")
    assert out.returncode == 2
    out = top("--once", "--interval", "0")
    assert out.returncode == 2
    # Without --once, top needs a terminal.
    out = top("--url", "http://127.0.0.1:1")
    assert out.returncode == 2 and "top needs a terminal" in out.stderr and "--once" in out.stderr


def test_no_daemon_is_said_and_exits_1():
    port = free_port()
    out = top("--once", "--url", f"http://127.0.0.1:{port}")
    assert out.returncode == 1
    assert out.stdout == ""
    assert f"daemon unreachable: http://127.0.0.1:{port}/api/v1/processes" in out.stderr
    assert "is `fragscope serve` running?" in out.stderr
    # The URL probe takes (…/metrics) is accepted: the same daemon.
    out = top("--once", "--url", f"http://127.0.0.1:{port}/metrics")
    assert out.returncode == 1 and "daemon unreachable" in out.stderr


HEAD = {"schema": "fragscope.processes", "schema_version": 1, "host": "h", "time_unix_ms": 1}


@pytest.mark.parametrize("body,error", [
    ("<html>not json</html>", "not JSON (byte 1)"),
    (json.dumps({"schema": "other"}), "schema: \"other\" is not \"fragscope.processes\""),
    (json.dumps(dict(HEAD, processes=[{"id": "1"}])), "processes[0].job: missing"),
    (json.dumps(dict(HEAD, processes="all")), "processes: expected an array, got string"),
    ("[" * 100000 + "]" * 100000, "nested deeper"),
], ids=["html", "schema", "missing-field", "processes-string", "deep"])
def test_hostile_answers_are_clear_errors(body, error):
    out = serve(200, body)
    assert out.returncode == 1, out.stdout
    assert "not the daemon's process API" in out.stderr
    assert error in out.stderr, out.stderr
    assert out.stdout == ""


def test_an_old_daemon_without_the_api_is_named():
    out = serve(404, "not found: fragscope serves /metrics and /healthz\n")
    assert out.returncode == 1
    assert "no process API" in out.stderr and "answered 404" in out.stderr


def test_once_draws_what_the_api_says_and_escapes_its_strings():
    row = {"id": "7-0", "job": "evil\u001b]0;title\u0007", "rank": 2, "pid": 7, "host": "h",
           "device_uuid": "GPU-1", "device_index": 0, "step": 9, "reserved_bytes": 8 << 30,
           "allocated_bytes": 4 << 30, "fragmentation_ratio": 0.5, "cached_free_bytes": 4 << 30,
           "largest_free_block_bytes": 1 << 20, "largest_request_bytes": 2 << 20,
           "max_allocatable_bytes": 1 << 20, "stranded_bytes": 0, "oom_risk_horizon_steps": 100,
           "oom_risk": 0.9, "level": "critical", "steps_to_oom": 3,
           "last_sample_unix_ms": 1, "connected": True,
           "history": {"step": [1, 2], "reserved_bytes": [1, 2], "allocated_bytes": [1, 2]}}
    out = serve(200, json.dumps(dict(HEAD, processes=[row])), columns=200)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert lines[3].split()[:3] == ["evil\\x1b]0;title\\x07", "2", "7"]
    assert "8.0G" in lines[3] and "1.0M/2.0M!" in lines[3] and "90%" in lines[3]
    assert "critical" in lines[3]


def test_help_teaches():
    out = subprocess.run([BIN, "top", "--help"], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0
    for text in ("--once", "--socket", "--api-socket", "--sort", "--job", "--no-color",
                 "--interval", "FREE/REQ", "P100",
                 "Enter shows that process's memory", "/api/v1/processes", "Examples:"):
        assert text in out.stdout, text


ROW = {"id": "7-0", "job": "llama", "rank": 2, "pid": 7, "host": "h", "device_uuid": "GPU-1",
       "device_index": 0, "step": 9, "reserved_bytes": 8 << 30, "allocated_bytes": 4 << 30,
       "fragmentation_ratio": 0.5, "cached_free_bytes": 4 << 30,
       "largest_free_block_bytes": 1 << 20, "largest_request_bytes": 2 << 20,
       "max_allocatable_bytes": 1 << 20, "stranded_bytes": 0, "oom_risk_horizon_steps": 100,
       "oom_risk": 0.9, "level": "critical", "steps_to_oom": 3, "last_sample_unix_ms": 1,
       "connected": True,
       "history": {"step": [1, 2], "reserved_bytes": [1, 2], "allocated_bytes": [1, 2]}}


def test_socket_reads_the_same_api_as_the_url():
    doc = json.dumps(dict(HEAD, processes=[ROW]))
    s = UnixServer(200, doc)
    try:
        out = top("--once", "--socket", s.path, columns=200)
    finally:
        s.close()
    assert out.returncode == 0, out.stderr
    h = Server(200, doc)
    try:
        over_http = top("--once", "--url", h.url, columns=200)
    finally:
        h.close()
    lines = out.stdout.splitlines()
    assert lines[1] == f"from {s.path}"
    assert lines[3].split()[:3] == ["llama", "2", "7"] and "critical" in lines[3]
    assert lines[2:] == over_http.stdout.splitlines()[2:]


def test_socket_errors_name_the_socket_and_the_reason():
    d = tempfile.mkdtemp(prefix="fstop")
    try:
        missing = os.path.join(d, "agent.api.sock")
        out = top("--once", "--socket", missing)
        assert out.returncode == 1 and out.stdout == ""
        assert (f"daemon unreachable: /api/v1/processes on {missing}: no such socket "
                "(is `fragscope serve` running?)") in out.stderr, out.stderr
        # A socket file nobody accepts on (a daemon that was killed).
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(missing)
        stale.close()
        out = top("--once", "--socket", missing)
        assert out.returncode == 1 and "nobody accepts on it" in out.stderr, out.stderr
        os.unlink(missing)
    finally:
        os.rmdir(d)
    # 404 and hostile answers read as over HTTP.
    s = UnixServer(404, "not found\n")
    try:
        out = top("--once", "--socket", s.path)
    finally:
        s.close()
    assert out.returncode == 1
    assert f"no process API: /api/v1/processes on {s.path} answered 404" in out.stderr
    s = UnixServer(200, "<html>")
    try:
        out = top("--once", "--socket", s.path)
    finally:
        s.close()
    assert out.returncode == 1 and "not the daemon's process API" in out.stderr
    # One source at a time.
    out = top("--once", "--socket", "/x.sock", "--url", "http://127.0.0.1:1")
    assert out.returncode == 2 and "excludes" in out.stderr, out.stderr
