"""Hostile neighbours against `fragscope serve` (issue 24, item 6): slowloris HTTP clients,
trickling and flooding agents, series floods. Each case is bounded in time and asserts the
bound the daemon promises (docs/exporter.md, "Limits and safety").

Run by ctest (serve_hostile); FRAGSCOPE_BIN and FRAGSCOPE_SOURCE_DIR come from there.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import Daemon, full_sample, workdir  # noqa: E402,F401  (workdir: a fixture)
import fragscope_agent  # noqa: E402  (test_serve put python/ on the path)
from soak_serve import parse_metrics, value  # noqa: E402


def timed_get(port, path, timeout=5):
    begin = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        body = r.read().decode()
        status = r.status
    return status, body, time.monotonic() - begin


def open_slowloris(port, count):
    """`count` connections that each sent part of a request line and will trickle the rest."""
    socks = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def trickle(socks):
    """One more header byte on every connection that is still open; returns how many were."""
    alive = 0
    for s in socks:
        try:
            s.sendall(b"X")
            alive += 1
        except OSError:
            pass
    return alive


def close_all(socks):
    for s in socks:
        s.close()


def test_scrapes_answer_within_a_second_while_100_slowloris_connections_are_open(workdir):
    d = Daemon(workdir)
    socks = []
    try:
        socks = open_slowloris(d.port, 100)
        worst = 0.0
        # Five seconds of trickling, scraping both paths every half second: the slow clients
        # never finish a request, and the server must neither wait for them nor run out of
        # room for the scraper.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            trickle(socks)
            for path in ("/metrics", "/healthz"):
                status, body, took = timed_get(d.port, path, timeout=3)
                assert status == 200
                worst = max(worst, took)
            time.sleep(0.5)
        assert worst < 1.0, f"slowest scrape {worst:.3f} s with 100 slowloris connections open"
    finally:
        close_all(socks)
        assert d.stop() == 0


def test_a_request_that_never_completes_is_closed_at_its_deadline(workdir):
    d = Daemon(workdir, "--http-request-timeout", "1")
    try:
        s = open_slowloris(d.port, 1)[0]
        begin = time.monotonic()
        closed_after = None
        while time.monotonic() - begin < 4:
            try:
                s.sendall(b"X")  # trickled bytes do not extend the deadline
                s.settimeout(0.2)
                s.recv(4096)  # b"" (closed) or the 408 answer
            except socket.timeout:
                continue
            except OSError:
                pass
            closed_after = time.monotonic() - begin
            break
        s.close()
        assert closed_after is not None, "a trickling request was still open after 4 s"
        assert closed_after < 2.5, closed_after
        metrics = parse_metrics(timed_get(d.port, "/metrics")[1])
        assert value(metrics, "fragscope_http_requests_timed_out_total") == 1
    finally:
        assert d.stop() == 0


def test_request_bodies_and_huge_headers_are_refused_without_reading_them(workdir):
    d = Daemon(workdir)
    try:
        s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 413"), reply
        s.close()
        s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Junk: " + b"a" * 100000)
        except OSError:
            pass  # the server may close before taking it all
        try:
            reply = s.recv(4096)
        except ConnectionResetError:
            reply = b""
        assert reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply
        s.close()
        assert timed_get(d.port, "/healthz")[0] == 200
        metrics = parse_metrics(timed_get(d.port, "/metrics")[1])
        assert value(metrics, "fragscope_http_requests_refused_total") == 2
    finally:
        assert d.stop() == 0


def test_idle_connections_beyond_the_pool_cannot_lock_out_a_scraper(workdir):
    d = Daemon(workdir, "--http-max-connections", "8", "--http-request-timeout", "30")
    socks = []
    try:
        socks = open_slowloris(d.port, 50)  # far more than the pool, none ever finishing
        for _ in range(3):
            status, _, took = timed_get(d.port, "/metrics", timeout=3)
            assert status == 200 and took < 1.0, took
        metrics = parse_metrics(timed_get(d.port, "/metrics")[1])
        assert value(metrics, "fragscope_http_connections_evicted_total") >= 42
    finally:
        close_all(socks)
        assert d.stop() == 0


# --- agent socket ---------------------------------------------------------------------------


def test_a_trickled_frame_must_complete_within_the_frame_timeout(workdir):
    d = Daemon(workdir, "--agent-frame-timeout", "1", "--expiry", "60")
    try:
        frame = fragscope_agent.encode_sample(full_sample())
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        s.settimeout(0.25)
        begin = time.monotonic()
        closed_after = None
        for i in range(len(frame) - 1):  # never the last byte
            try:
                s.sendall(frame[i:i + 1])
                if s.recv(1) == b"":
                    closed_after = time.monotonic() - begin
                    break
            except socket.timeout:
                pass
            except OSError:
                closed_after = time.monotonic() - begin
                break
            if time.monotonic() - begin > 5:
                break
        s.close()
        assert closed_after is not None, "a frame trickled for 5 s was still accepted"
        assert closed_after < 2.5, closed_after
        d.wait_metric("fragscope_agent_samples_rejected_total", 1, reason="truncated")
        assert "not complete 1000 ms after its first byte" in d.read_log()
    finally:
        assert d.stop() == 0


def test_a_stream_of_frames_split_across_writes_is_not_cut_off(workdir):
    """The frame deadline restarts when a frame completes: an agent whose writes always end
    inside the next frame (a busy stream) is not mistaken for a trickler."""
    d = Daemon(workdir, "--agent-frame-timeout", "0.5")
    try:
        def frame(i):  # all the same length
            return fragscope_agent.encode_sample(full_sample(step=100 + i, pid=7))
        frames = b"".join(frame(i) for i in range(40))
        size = len(frame(0)) + 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(d.sock)
        sent = 0
        begin = time.monotonic()
        while sent + size < len(frames) and time.monotonic() - begin < 2:
            s.sendall(frames[sent:sent + size])  # ends one byte into the next frame
            sent += size
            time.sleep(0.1)
        assert time.monotonic() - begin > 1.0  # well past the frame timeout
        complete = sent // (size - 1)
        d.wait_metric("fragscope_process_samples_total", complete)
        assert value(d.metrics(), "fragscope_agent_samples_rejected_total", reason="truncated") == 0
        s.close()
    finally:
        assert d.stop() == 0


def test_one_uid_cannot_take_every_agent_connection(workdir):
    d = Daemon(workdir, "--max-connections-per-uid", "3")
    socks = []
    try:
        for _ in range(5):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(d.sock)
            socks.append(s)
        d.wait_metric("fragscope_agent_connections_refused_total", 2)
        closed = 0
        for s in socks:
            try:
                s.settimeout(0.3)
                if s.recv(1) == b"":
                    closed += 1
            except socket.timeout:
                pass
            except OSError:
                closed += 1
        assert closed == 2
        assert "connections per UID" in d.read_log()
    finally:
        close_all(socks)
        assert d.stop() == 0


def flood_sample(i):
    return full_sample(device_uuid=f"GPU-{i:08x}-0000-4000-8000-000000000000")


def test_series_limits_drop_and_count_what_is_beyond_them(workdir):
    d = Daemon(workdir, "--max-series", "10", "--max-series-per-connection", "4")
    try:
        flooder = fragscope_agent.AgentClient(d.sock, pid=1)
        for i in range(8):  # within the rate limit's burst; 4 are beyond its own limit
            assert flooder.send_sample(flood_sample(i))
        d.wait_metric("fragscope_agent_series_dropped_total", 4)
        others = [fragscope_agent.AgentClient(d.sock, pid=2 + k) for k in range(3)]
        for k, client in enumerate(others):
            for i in range(4):
                assert client.send_sample(flood_sample(100 + 10 * k + i))
        # 4 + 6 stored: the total limit; the other 6 of the 12 are dropped.
        d.wait_metric("fragscope_agent_series_dropped_total", 10)
        d.wait_metric("fragscope_agent_series", 10)
        # A known series still updates at the limit.
        assert flooder.send_sample(full_sample(step=77, device_uuid=flood_sample(0)["device_uuid"]))
        d.wait_metric("fragscope_process_step", 77, pid=str(os.getpid()), UUID=flood_sample(0)["device_uuid"])
        time.sleep(0.5)  # a tick (--interval 0.2) logs the drops, once
        log = d.read_log()
        assert "dropped at the series limits" in log
        assert log.count("dropped at the series limits") <= 3, log
        for c in [flooder, *others]:
            c.close()
    finally:
        assert d.stop() == 0


def test_lingering_series_of_closed_connections_never_lock_out_a_live_agent(workdir):
    """Series of closed connections linger (--linger), but at the total cap a live agent's new
    series takes a lingering one's place: connecting, filling and leaving cannot hold the
    daemon's series for the linger time."""
    d = Daemon(workdir, "--max-series", "4", "--max-series-per-connection", "4",
               "--linger", "600")
    try:
        flooder = fragscope_agent.AgentClient(d.sock, pid=1)
        for i in range(4):
            assert flooder.send_sample(flood_sample(i))
        d.wait_metric("fragscope_agent_series", 4)
        flooder.close()
        time.sleep(0.3)
        live = fragscope_agent.AgentClient(d.sock, pid=2)
        for i in range(4):
            assert live.send_sample(flood_sample(100 + i))
        d.wait_metric("fragscope_agent_series_expired_total", 4)
        m = d.metrics()
        assert value(m, "fragscope_agent_series") == 4
        assert value(m, "fragscope_agent_series_dropped_total") == 0
        live.close()
    finally:
        assert d.stop() == 0


def test_a_flood_of_new_devices_leaves_the_page_and_shutdown_bounded(workdir):
    """The issue's flood: new device UUIDs within the rate limit from many connections. At the
    default limits (512 series) the page stays a bounded size and SIGTERM is prompt."""
    d = Daemon(workdir, "--max-connections-per-uid", "64", "--max-series-per-uid", "512")
    try:
        clients = [fragscope_agent.AgentClient(d.sock, pid=1000 + k) for k in range(40)]
        n = 0
        for client in clients:
            for _ in range(90):  # inside the burst of 100
                client.send_sample(flood_sample(n))
                n += 1
        # Every sample is in once all beyond the limit are counted.
        d.wait_metric("fragscope_agent_series_dropped_total", n - 512, timeout=20)
        status, body, took = timed_get(d.port, "/metrics")
        assert value(parse_metrics(body), "fragscope_agent_series") == 512
        assert len(body) < 8 << 20, len(body)
        for client in clients:
            client.close()
        begin = time.monotonic()
        assert d.stop() == 0
        assert time.monotonic() - begin < 3
    finally:
        d.stop()


# --- the history database ------------------------------------------------------------------


@pytest.fixture
def small_fs(workdir):
    """A 16 MiB tmpfs mounted in the work folder (needs mount rights: root in the CI
    container); skips where mounting is not allowed."""
    path = os.path.join(workdir, "fs")
    os.makedirs(path)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", path],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield path
    subprocess.run(["umount", "-l", path], capture_output=True)


def healthz(d):
    return timed_get(d.port, "/healthz")[1]


def test_a_read_only_history_is_reported_at_start_and_on_healthz(workdir, small_fs):
    history = os.path.join(small_fs, "history.sqlite")
    d = Daemon(workdir, "--history", history)  # creates it
    assert healthz(d) == "ok\n"
    assert d.stop() == 0
    subprocess.run(["mount", "-o", "remount,ro", small_fs], check=True)
    d = Daemon(workdir, "--history", history)
    try:
        assert healthz(d).startswith(f"degraded: history {history}: read-only file system")
        assert "history DEGRADED" in d.read_log()
        # It still serves the agents' samples.
        agent = fragscope_agent.AgentClient(d.sock, pid=5)
        assert agent.send_sample(full_sample(step=3))
        d.wait_metric("fragscope_process_step", 3, pid=str(os.getpid()))
        agent.close()
    finally:
        assert d.stop() == 0


def test_a_full_history_disk_is_reported_and_recovers(workdir, small_fs):
    history = os.path.join(small_fs, "history.sqlite")
    filler = os.path.join(small_fs, "filler")
    d = Daemon(workdir, "--history", history)
    try:
        assert healthz(d) == "ok\n"
        with open(filler, "wb") as f:  # fill the disk
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        agent = fragscope_agent.AgentClient(d.sock, pid=6)
        deadline = time.monotonic() + 5
        step = 0
        while time.monotonic() < deadline and not healthz(d).startswith("degraded"):
            step += 1
            agent.send_sample(full_sample(step=step))
            time.sleep(0.1)
        assert healthz(d).startswith(f"degraded: history {history}: disk full"), healthz(d)
        assert "history degraded: disk full" in d.read_log()
        os.remove(filler)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and healthz(d) != "ok\n":
            step += 1
            agent.send_sample(full_sample(step=step))
            time.sleep(0.1)
        assert healthz(d) == "ok\n"
        assert "history writable again" in d.read_log()
        agent.close()
    finally:
        assert d.stop() == 0


def test_keep_alive_pipelining_head_and_methods(workdir):
    """The HTTP server is fragscope's own: the parts of HTTP/1.1 a scraper or a probe uses."""
    d = Daemon(workdir)
    try:
        s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        # Two pipelined requests on one connection, then a HEAD, then a POST.
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /nope?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"/healthz\n"):
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 OK\r\n"), data
        assert b"\r\n\r\nok\n" in data
        assert b"HTTP/1.1 404 Not Found\r\n" in data
        s.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n"), head
        assert b"Content-Type: text/plain; version=0.0.4" in head
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # HTTP/1.0: the server closes after it
        page = b""
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            page += chunk
        assert page.startswith(b"HTTP/1.1 200 OK\r\n") and b"fragscope_agent_series" in page
        s.close()
        s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
        s.sendall(b"garbage\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 Bad Request\r\n")
        s.close()
    finally:
        assert d.stop() == 0



def test_a_closing_answer_survives_unread_input(workdir):
    """An answer the server closes after (HTTP/1.0, a refusal) reaches the client whole even
    when the client sent more than the server read: the server shuts its side and drains
    instead of resetting the connection."""
    d = Daemon(workdir)
    try:
        for request in (b"GET /metrics HTTP/1.0\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"):
            s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
            s.sendall(request + b"x" * 100000)
            time.sleep(0.2)  # the answer is sent and the server has closed its side
            data = b""
            try:
                while True:
                    chunk = s.recv(1 << 16)
                    if not chunk:
                        break
                    data += chunk
            except ConnectionResetError:
                pytest.fail(f"connection reset after {len(data)} bytes of the answer")
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            assert len(body) == length, (len(body), length)
            s.close()
    finally:
        assert d.stop() == 0


def test_slow_readers_holding_every_slot_cannot_lock_out_scrapes(workdir):
    """Issue 30, item 3: 64 connections ask for a multi-MB page and never read it. A scraper
    still gets its page, every time: the most stalled writer gives up its slot."""
    d = Daemon(workdir)
    socks = []
    try:
        big = dict(job="j" * 200, free_block_count=[1] * 64, free_block_bytes=[1] * 64)
        clients = [fragscope_agent.AgentClient(d.sock) for _ in range(4)]
        for k, client in enumerate(clients):
            for i in range(16):
                assert client.send_sample(full_sample(device_uuid=f"GPU-{k}-{i}", **big))
        d.wait_metric("fragscope_agent_series", 64)
        page = timed_get(d.port, "/metrics")[1]
        assert len(page) > 2 << 20, len(page)

        def slow_reader():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            s.settimeout(2)
            s.connect(("127.0.0.1", d.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            return s

        ok = 0
        for _ in range(15):
            while len(socks) < 64:  # the slots the server closed are taken again at once
                try:
                    socks.append(slow_reader())
                except OSError:
                    break
            time.sleep(0.1)
            try:
                status, body, took = timed_get(d.port, "/metrics", timeout=5)
                ok += status == 200 and len(body) > 2 << 20
            except OSError:
                pass
            alive = []
            for s in socks:  # drop the ones the server closed
                try:
                    s.setblocking(False)
                    if s.recv(1, socket.MSG_PEEK) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            socks = alive
        assert ok == 15, f"{ok} of 15 scrapes got their page with 64 slow readers"
        for client in clients:
            client.close()
    finally:
        close_all(socks)
        assert d.stop() == 0
