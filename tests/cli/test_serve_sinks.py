"""`fragscope serve --listen none`: the metrics need one sink, the TCP port, the API socket
(--api-socket serves /metrics too) or the textfile (--textfile-dir); with none it refuses to
start and names all three."""
import os
import signal
import socket
import subprocess
import tempfile
import time

import pytest

BIN = os.environ.get("FRAGSCOPE_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def serve_args(folder, *extra):
    # Socket paths must fit sun_path (108 bytes): a short folder of its own, not tmp_path.
    return [BIN, "serve", "--socket", os.path.join(folder, "agent.sock"), "--listen", "none",
            "--history", "none", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1",
            "--proc-root", os.path.join(folder, "no-proc"), "--interval", "0.1", *extra]


def get(path, target):
    """One HTTP/1.0 GET over the Unix socket at `path`: (status line, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(f"GET {target} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body.decode()


def test_listen_none_with_an_api_socket_needs_no_textfile():
    folder = tempfile.mkdtemp(prefix="fsserve")
    api = os.path.join(folder, "api.sock")
    log = open(os.path.join(folder, "serve.log"), "wb")
    daemon = subprocess.Popen(serve_args(folder, "--api-socket", api), stderr=log,
                              stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and daemon.poll() is None and not os.path.exists(api):
            time.sleep(0.05)
        assert daemon.poll() is None, open(log.name).read()
        status, body = get(api, "/metrics")
        assert status.split()[1] == "200", status
        assert "fragscope_nvml_available" in body
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=30)
        log.close()
    assert code == 0, open(log.name).read()
    assert not os.path.exists(api)


def test_listen_none_without_any_sink_is_refused_naming_the_options():
    folder = tempfile.mkdtemp(prefix="fsserve")
    r = subprocess.run(serve_args(folder, "--api-socket", "none"), capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    for option in ("--listen", "--api-socket", "--textfile-dir"):
        assert option in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(folder, "agent.sock"))
