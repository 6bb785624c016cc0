"""`fragscope top` against a live `fragscope serve` fed by two agent processes (issue 33 item 3):
the daemon's process API (/api/v1/processes) over HTTP and over its API socket, `top --once`,
and the interactive view in a real terminal, reading either: tmux at 80x24, keys sent with
send-keys, the screen read with capture-pane.

The two feeders are separate processes running the Python agent client (what Monitor sends
through), so the daemon sees two pids: "llama" leaks (the daemon's forecast reaches warning) and
"bert" holds steady with more of its cache free. The tmux test skips only when tmux is absent
(tools/install-deps.sh installs it; FRAGSCOPE_REQUIRE_TOOLS=1 turns the skip into a failure).
"""
import http.client
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_serve import BIN, SOURCE_DIR, Daemon, require_tool  # noqa: E402

# One training process: a burst of 20 steps, then a sample a second so the daemon's --expiry
# never drops it; "sent" on stdout after the burst.
FEEDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[1])
    import fragscope_agent
    sock, job, rank, leak = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "leak"
    GiB, MiB = 1 << 30, 1 << 20
    def sample(step):
        peak = 6 * GiB + (step * 8 * MiB if leak else 0)
        counts, sizes = fragscope_agent.free_block_histogram([3 * MiB, 3 * MiB, 64 * MiB, 4096])
        return fragscope_agent.sample_from_memory_stats(
            {"reserved_bytes.all.current": peak + 512 * MiB,
             "allocated_bytes.all.current": peak // 2 + step * MiB,
             "reserved_bytes.all.peak": peak + 512 * MiB, "allocated_bytes.all.peak": peak,
             "num_alloc_retries": 0},
            device_uuid="GPU-%s-%d" % (job, rank), step=step,
            device_free_bytes=10 * GiB - peak - 512 * MiB, largest_free_block=64 * MiB,
            fragmentation_ratio=0.3 if leak else 0.6, free_block_count=counts,
            free_block_bytes=sizes, largest_request_bytes=(96 if leak else 2) * MiB)
    with fragscope_agent.AgentClient(sock, job=job, rank=rank) as agent:
        for step in range(0, 200, 10):
            assert agent.send_sample(sample(step)), agent.last_error
        print("sent", flush=True)
        while True:
            time.sleep(1)
            agent.send_sample(sample(190))
""")


class Feeders:
    """The two training processes; their pids are the daemon's."""

    def __init__(self, daemon):
        self.procs = {}
        for job, rank, kind in (("llama", 0, "leak"), ("bert", 1, "steady")):
            self.procs[job] = subprocess.Popen(
                [sys.executable, "-c", FEEDER, os.path.join(SOURCE_DIR, "python"), daemon.sock,
                 job, str(rank), kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for job, p in self.procs.items():
            line = p.stdout.readline()
            assert line.strip() == "sent", (job, line, p.stderr.read() if p.poll() else "")

    def pid(self, job):
        return self.procs[job].pid

    def stop(self):
        for p in self.procs.values():
            p.kill()
            p.wait()


@pytest.fixture
def node(tmp_path):
    """A daemon and its two processes, once both are visible on the process API."""
    daemon = Daemon(str(tmp_path))
    feeders = Feeders(daemon)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            rows = processes(daemon)["processes"]
            if len(rows) == 2 and all(r["step"] == 190 for r in rows) and any(
                    r["level"] == "warning" for r in rows):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the daemon did not see both processes: {rows}")
        yield daemon, feeders
    finally:
        feeders.stop()
        daemon.stop()


def processes(daemon):
    status, ctype, body = daemon.get("/api/v1/processes")
    assert status == 200 and ctype.startswith("application/json"), (status, ctype)
    return json.loads(body)


def api_socket(daemon):
    """Where `serve` puts its API socket by default: next to the agent socket."""
    return os.path.join(os.path.dirname(daemon.sock), "agent.api.sock")


def source(daemon, transport):
    """top's arguments that read `daemon` over `transport` (http or socket)."""
    if transport == "socket":
        return ["--socket", api_socket(daemon)]
    return ["--url", f"http://127.0.0.1:{daemon.port}"]


def top_once(daemon, *args, columns=80, env=None, transport="http"):
    return subprocess.run([BIN, "top", "--once", *source(daemon, transport), *args],
                          capture_output=True, text=True, timeout=30,
                          env=dict(env or os.environ, COLUMNS=str(columns), LANG="C.UTF-8"))


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket (as curl --unix-socket)."""

    def __init__(self, path):
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


def unix_get(path, target, method="GET"):
    conn = UnixHTTPConnection(path)
    try:
        conn.request(method, target)
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read().decode()
    finally:
        conn.close()


def row_of(lines, pid):
    for i, line in enumerate(lines):
        if re.search(rf"\s{pid}\s", line):
            return i
    return None


def test_the_process_api_serves_each_process_with_history_and_map(node):
    daemon, feeders = node
    doc = processes(daemon)
    assert doc["schema"] == "fragscope.processes" and doc["schema_version"] == 1
    assert doc["host"] == "itest"
    rows = {r["job"]: r for r in doc["processes"]}
    assert set(rows) == {"llama", "bert"}
    llama, bert = rows["llama"], rows["bert"]
    # Each process under its own pid (the daemon's SO_PEERCRED), with what its agent sent.
    assert llama["pid"] == feeders.pid("llama") and bert["pid"] == feeders.pid("bert")
    assert llama["rank"] == 0 and bert["rank"] == 1
    assert llama["host"] == "itest"
    assert llama["reserved_bytes"] == 6 * 2**30 + 190 * 8 * 2**20 + 512 * 2**20
    assert llama["largest_free_block_bytes"] == 64 << 20
    assert llama["largest_request_bytes"] == 96 << 20
    assert bert["fragmentation_ratio"] == 0.6
    # The daemon's own forecast: the leak is a warning with steps to OOM; the steady job is not.
    assert llama["level"] == "warning" and llama["steps_to_oom"] > 0
    assert bert["level"] in ("ok", "watch") and bert["steps_to_oom"] is None
    assert llama["oom_risk_horizon_steps"] == 100
    assert llama["oom_risk"] is None or 0 <= llama["oom_risk"] <= 1
    # The sparkline's history: the 20 steps of the burst, in order.
    steps = llama["history"]["step"]
    assert steps[:20] == list(range(0, 200, 10))
    assert len(llama["history"]["reserved_bytes"]) == len(steps)
    assert "free_blocks" not in llama
    # One process's map: the free-block histogram its agent sent.
    status, _, body = daemon.get(f"/api/v1/processes/{llama['id']}/map")
    assert status == 200
    buckets = json.loads(body)["process"]["free_blocks"]
    assert [(b["min_bytes"], b["count"]) for b in buckets] == [(4096, 1), (2 << 20, 2),
                                                                (64 << 20, 1)]
    with pytest.raises(urllib.error.HTTPError) as e:
        daemon.get("/api/v1/processes/1-00000000/map")
    assert e.value.code == 404
    assert "error" in json.loads(e.value.read())


def test_top_once_prints_one_frame_worst_first(node):
    daemon, feeders = node
    out = top_once(daemon)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "\x1b" not in out.stdout  # not a terminal: no colour
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("fragscope top - itest - 2 processes - sort: level")
    header = lines[2].split()
    assert header == ["JOB", "RANK", "PID", "RESV", "ALLOC", "FRAG", "FREE/REQ", "P100", "LEVEL",
                      "STEPS", "TREND"]
    llama, bert = row_of(lines, feeders.pid("llama")), row_of(lines, feeders.pid("bert"))
    assert llama is not None and bert is not None and llama < bert, lines
    cells = lines[llama].split()
    assert cells[:3] == ["llama", "0", str(feeders.pid("llama"))]
    assert "64M/96M!" in cells and "warning" in cells
    assert "64M/2.0M" in lines[bert].split()
    assert "q quit" not in out.stdout  # no key help in a script's frame
    # --sort and --job, as the keys do.
    out = top_once(daemon, "--sort", "fragmentation")
    lines = out.stdout.splitlines()
    assert row_of(lines, feeders.pid("bert")) < row_of(lines, feeders.pid("llama"))
    assert "sort: fragmentation" in lines[0]
    out = top_once(daemon, "--job", "ber")
    assert row_of(out.stdout.splitlines(), feeders.pid("llama")) is None
    assert "(1 shown)" in out.stdout
    # Wider: HOST, GPU and STEP come in.
    wide = top_once(daemon, columns=140).stdout.splitlines()
    assert wide[2].split()[:6] == ["JOB", "RANK", "PID", "HOST", "GPU", "STEP"]
    assert all(len(line) <= 140 for line in wide)


def test_top_once_over_the_api_socket_draws_the_same_rows(node):
    daemon, feeders = node
    # The same HTTP API on the socket as on the port.
    status, ctype, body = unix_get(api_socket(daemon), "/api/v1/processes")
    assert status == 200 and ctype.startswith("application/json")
    assert {r["pid"] for r in json.loads(body)["processes"]} == \
        {feeders.pid("llama"), feeders.pid("bert")}
    assert unix_get(api_socket(daemon), "/healthz")[2] == "ok\n"
    assert "fragscope_process_step{" in unix_get(api_socket(daemon), "/metrics")[2]
    over_socket = top_once(daemon, transport="socket", columns=200)
    assert over_socket.returncode == 0, over_socket.stderr
    over_http = top_once(daemon, columns=200)
    lines = over_socket.stdout.splitlines()
    assert lines[1] == f"from {api_socket(daemon)}"
    assert lines[2:] == over_http.stdout.splitlines()[2:]
    llama, bert = row_of(lines, feeders.pid("llama")), row_of(lines, feeders.pid("bert"))
    assert llama is not None and bert is not None and llama < bert, lines


class Tmux:
    """A detached tmux server of its own (its socket in a temporary folder)."""

    def __init__(self, width, height):
        self.dir = tempfile.mkdtemp(prefix="fstop")
        self.sock = os.path.join(self.dir, "tmux.sock")
        self.width, self.height = width, height

    def run(self, *args, check=True):
        return subprocess.run(["tmux", "-S", self.sock, "-f", "/dev/null", *args],
                              capture_output=True, text=True, timeout=10, check=check)

    def start(self, command, env):
        self.run("new-session", "-d", "-s", "top", "-x", str(self.width), "-y", str(self.height),
                 *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], command)

    def screen(self, colors=False):
        return self.run("capture-pane", "-p", *(["-e"] if colors else []), "-t", "top").stdout

    def keys(self, *keys):
        self.run("send-keys", "-t", "top", *keys)

    def wait_for(self, predicate, what, timeout=10):
        deadline = time.time() + timeout
        screen = ""
        while time.time() < deadline:
            screen = self.screen()
            if predicate(screen):
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{what}; the screen:\n{screen}")

    def close(self):
        self.run("kill-server", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("transport", ["http", "socket"])
def test_top_in_a_real_terminal(node, transport):
    require_tool("tmux", "tmux")
    daemon, feeders = node
    llama, bert = str(feeders.pid("llama")), str(feeders.pid("bert"))
    tmux = Tmux(80, 24)
    # After top: its exit status, and whether the terminal got its line mode back.
    command = (f"{BIN} top {' '.join(source(daemon, transport))} --interval 0.3; "
               "echo \"top exited $?\"; stty -a | grep -o -- '-\\?icanon'; sleep 60")
    env = {"LANG": "C.UTF-8", "TERM": "xterm-256color"}
    try:
        tmux.start(command, env)
        # Every wait names the whole state it expects: a capture may fall in a redraw.
        def first(s, a, b):
            lines = s.splitlines()
            return row_of(lines, a) is not None and row_of(lines, b) is not None and \
                row_of(lines, a) < row_of(lines, b)

        screen = tmux.wait_for(lambda s: first(s, llama, bert) and "q quit" in s,
                               "both processes on screen, worst first")
        lines = screen.splitlines()
        assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
        assert lines[0].startswith("fragscope top - itest - 2 processes - sort: level")
        assert row_of(lines, llama) < row_of(lines, bert)  # worst first
        assert lines[row_of(lines, llama)].startswith("> llama")  # selected
        assert "q quit" in lines[-1]
        # Colour on a terminal: the title reversed, the selected row reversed.
        assert "\x1b[1;7mfragscope top" in tmux.screen(colors=True) or \
            "\x1b[7m" in tmux.screen(colors=True)

        # f sorts by fragmentation: the steady job (60 %) above the leak (30 %).
        tmux.keys("f")
        tmux.wait_for(lambda s: "sort: fragmentation" in s and first(s, bert, llama),
                      "sorted by fragmentation")
        # / filters by job; Enter applies it.
        tmux.keys("/", "ber")
        tmux.wait_for(lambda s: "job: ber_" in s, "the filter prompt")
        tmux.keys("Enter")
        tmux.wait_for(lambda s: "job: ber " in s and llama not in s and "(1 shown)" in s and
                      bert in s, "filtered to bert")
        # An empty filter shows all again; l sorts worst first.
        tmux.keys("/", "BSpace", "BSpace", "BSpace", "Enter", "l")
        tmux.wait_for(lambda s: first(s, llama, bert) and "sort: level" in s and "job:" not in s,
                      "all processes again, worst first")
        # Enter opens the selected process's map (the first row, after Up at the top).
        tmux.keys("Up", "Up", "Enter")
        screen = tmux.wait_for(lambda s: "free blocks by size" in s and "64M-128M" in s and
                               "Enter/Esc back" in s, "the map")
        assert f"process {llama} - job llama - rank 0 - on itest" in screen
        assert "level warning" in screen
        assert re.search(r"64M-128M\s+1 block\s+64M", screen), screen
        assert "reserved [" in screen
        assert all(len(line) <= 80 for line in screen.splitlines())
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "FREE/REQ" in s and bert in s, "back to the list")

        # SIGWINCH: a wider window gets the HOST, GPU and STEP columns.
        tmux.run("resize-window", "-t", "top", "-x", "130", "-y", "30")
        screen = tmux.wait_for(lambda s: " HOST " in s, "the wider layout")
        assert all(len(line) <= 130 for line in screen.splitlines())

        # The daemon goes away: said on screen, the rows kept, top still running.
        daemon.stop()
        screen = tmux.wait_for(lambda s: "daemon unreachable" in s and llama in s,
                               "the daemon's absence")
        assert "retrying every 0.3 s" in screen
        if transport == "socket":  # serve removed its socket when it stopped
            assert not os.path.exists(api_socket(daemon))
        assert "top exited" not in screen
        tmux.keys("q")
        screen = tmux.wait_for(lambda s: "top exited" in s and "icanon" in s, "top's exit")
        assert "top exited 0" in screen
        assert re.search(r"^icanon$", screen, re.M), screen  # line mode restored
        assert "fragscope top -" not in screen  # the alternate screen is gone
    finally:
        tmux.close()


def test_sigterm_restores_the_terminal(tmp_path):
    require_tool("tmux", "tmux")
    tmux = Tmux(80, 24)
    # Nothing listens on this port: top shows the daemon's absence and keeps retrying.
    pid_file = os.path.join(tmux.dir, "top.pid")
    command = (f"{BIN} top --url http://127.0.0.1:9 --interval 0.3 </dev/tty & echo $! > {pid_file}; "
               "wait $!; echo \"top exited $?\"; stty -a | grep -o -- '-\\?icanon'; sleep 60")
    try:
        tmux.start(command, {"LANG": "C.UTF-8", "TERM": "xterm-256color", "NO_COLOR": "1"})
        screen = tmux.wait_for(lambda s: "daemon unreachable" in s, "the daemon's absence")
        assert "retrying every 0.3 s" in screen
        colors = tmux.screen(colors=True)
        assert "\x1b[7m" not in colors and "\x1b[1m" not in colors, "NO_COLOR: no colour"
        with open(pid_file) as f:
            pid = int(f.read())
        os.kill(pid, 15)
        screen = tmux.wait_for(lambda s: "top exited" in s and "icanon" in s,
                               "top's exit after SIGTERM")
        assert "top exited 143" in screen
        assert re.search(r"^icanon$", screen, re.M), screen
    finally:
        tmux.close()


def test_the_api_under_many_paths_and_a_head_request(tmp_path):
    # Each distinct path has its shared page; a client walking many paths must not grow the
    # daemon (the cache starts afresh past 64) nor stop it answering.
    daemon = Daemon(str(tmp_path))
    try:
        for i in range(300):
            with pytest.raises(urllib.error.HTTPError) as e:
                daemon.get(f"/api/v1/processes/{i}-00000000/map")
            assert e.value.code == 404
        assert processes(daemon)["processes"] == []
        assert daemon.get("/healthz")[2] == "ok\n"
        request = urllib.request.Request(f"http://127.0.0.1:{daemon.port}/api/v1/processes",
                                         method="HEAD")
        with urllib.request.urlopen(request, timeout=5) as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) > 0
            assert r.read() == b""
    finally:
        assert daemon.stop() == 0


def test_serve_puts_the_api_socket_next_to_the_agent_socket(tmp_path):
    daemon = Daemon(str(tmp_path))
    try:
        path = api_socket(daemon)
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert f"API socket {path} (mode 0660)" in daemon.read_log()
        assert json.loads(unix_get(path, "/api/v1/processes")[2])["processes"] == []
        # The same server as on the port: HEAD has no body, a request with one is refused.
        status, _, body = unix_get(path, "/api/v1/processes", method="HEAD")
        assert status == 200 and body == ""
        conn = UnixHTTPConnection(path)
        conn.request("GET", "/api/v1/processes", body="x" * 100)
        assert conn.getresponse().status == 413
        conn.close()
        # A second daemon cannot take a live API socket (exit 1, as for a port in use).
        other = subprocess.run([BIN, "serve", "--socket", str(tmp_path / "b" / "agent.sock"),
                                "--api-socket", path, "--listen", "127.0.0.1:0",
                                "--history", "none"],
                               capture_output=True, text=True, timeout=30)
        assert other.returncode == 1, other.stderr
        assert f"API socket {path} is in use" in other.stderr
        assert not os.path.exists(tmp_path / "b" / "agent.sock")  # the agent socket let go
    finally:
        assert daemon.stop() == 0
    assert not os.path.exists(path)  # removed on SIGTERM


def test_serve_api_socket_flags(tmp_path):
    # An explicit path with its own mode; "none" makes none; the agent's path is refused.
    own = str(tmp_path / "api" / "top.sock")
    daemon = Daemon(str(tmp_path), "--api-socket", own, "--api-socket-mode", "0600")
    try:
        assert stat.S_IMODE(os.lstat(own).st_mode) == 0o600
        assert not os.path.exists(api_socket(daemon))
        out = subprocess.run([BIN, "top", "--once", "--socket", own], capture_output=True,
                             text=True, timeout=30, env=dict(os.environ, COLUMNS="80"))
        assert out.returncode == 0 and "0 processes" in out.stdout, out.stderr
    finally:
        assert daemon.stop() == 0
    (tmp_path / "n").mkdir()
    daemon = Daemon(str(tmp_path / "n"), "--api-socket", "none")
    try:
        assert not os.path.exists(api_socket(daemon))
        assert "API socket" not in daemon.read_log()
    finally:
        assert daemon.stop() == 0
    sock = str(tmp_path / "y.sock")
    for args, error in ((["--api-socket", sock], "give the API its own path"),
                        (["--api-socket-mode", "rw"], "--api-socket-mode rw: expected an octal")):
        out = subprocess.run([BIN, "serve", "--listen", "127.0.0.1:0", "--history", "none",
                              "--socket", sock, *args],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and error in out.stderr, out.stderr
