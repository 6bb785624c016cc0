"""Terminal safety (issue 24 item 3): no command lets an input's control characters reach the
terminal.

Every input-derived string (a trace's producer, labels and device names, frame names and file
names, a snapshot's call sites and recorded settings, OOM message text, history run names,
alert rule names, NVML and /proc strings, the daemon's metric labels, file names on the command
line) is fed with ESC, OSC, CSI, BEL, NUL, DEL and C1 controls, through every command's text
output (and --json), and stdout and stderr are checked byte by byte: no C0 control other than
newline and tab, no DEL, no C1 control (raw 0x80-0x9f or its UTF-8 form C2 80-9F), and nothing
that is not valid UTF-8. docs/user-guide.md, "Terminal safety", documents the escapes.

ctest runs this file through tests/cli/tests.cmake (FRAGSCOPE_BIN, FRAGSCOPE_FAKE_NVML).
"""

import gzip
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
FAKE_NVML = os.environ.get("FRAGSCOPE_FAKE_NVML", "")
SNAPSHOT_JSON = os.path.join(SOURCE_DIR, "tests", "data", "snapshots", "g3_snapshot.json")
SAMPLE = os.path.join(SOURCE_DIR, "tests", "data", "sample", "gpt_tiny_3steps.jsonl.gz")

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")

# A string that would retitle the window (OSC ... BEL), clear the screen and color the text
# (CSI), ring the bell, cut a C string (NUL), and use the C1 forms of CSI and NEL (in UTF-8).
EVIL = ("\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m<nul>\x00<bs>\x08<del>\x7f"
        "<c1>\u009b31m\u0085<cr>\r<nl>\n<tab>\t|")
# Without NUL, for readers that refuse it.
EVIL_NO_NUL = EVIL.replace("\x00", "")
# Raw bytes, where an input can hold any: raw C1 (0x9b CSI), invalid UTF-8, OSC 52 (clipboard).
EVIL_BYTES = (b"\x1b]52;c;cHduZWQ=\x07\x9b31m\x9d0;title\x9c\xc3\x28\xff\x1b[5m|"
              + EVIL_NO_NUL.encode("utf-8"))
# For file names (no NUL, no '/').
EVIL_NAME = "evil\x1b]0;name\x07\x1b[31m\u009b\x7f\x01"


def run(*args, env=None, stdin=None):
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)
    full_env.update(env or {})
    return subprocess.run([BIN, *args], cwd=SOURCE_DIR, env=full_env, capture_output=True,
                          timeout=120, input=stdin)


FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f]")


def bad_bytes(data):
    """Where `data` holds a byte a terminal acts on, or bytes that are not UTF-8: a list of
    (offset, excerpt) pairs."""
    problems = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return [(e.start, data[max(0, e.start - 20):e.start + 20])]
    for m in FORBIDDEN.finditer(text):
        problems.append((m.start(), text[max(0, m.start() - 30):m.start() + 30]))
    return problems


def assert_safe(r, what):
    for stream, data in (("stdout", r.stdout), ("stderr", r.stderr)):
        problems = bad_bytes(data)
        assert not problems, f"{what}: raw control bytes on {stream}: {problems[:3]}"


def assert_ran(r, what, codes=(0,)):
    assert r.returncode in codes, (
        f"{what}: exit {r.returncode}\n{r.stderr.decode('utf-8', 'replace')[:2000]}")


# ---- Fixtures -----------------------------------------------------------------------------


def write_trace(path, kind):
    header = {"format": "fragscope-trace", "version": 1, "kind": kind,
              "producer": "producer " + EVIL,
              "devices": [{"device": 0, "name": "device " + EVIL, "capacity_bytes": 1 << 30}],
              "labels": {"model": "model " + EVIL, "architecture": "arch " + EVIL_NO_NUL,
                         "run": "run " + EVIL, EVIL_NO_NUL: "key"},
              "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}
    lines = [header,
             {"action": "frame", "id": 0, "name": "frame " + EVIL,
              "filename": "file " + EVIL + ".py", "line": 7},
             {"action": "frame", "id": 1, "name": EVIL_NO_NUL, "filename": EVIL, "line": 9}]
    base = 139637976727552
    mib = 1 << 20
    if kind == "allocator":
        lines.append({"action": "segment_alloc", "addr": base, "size": 20 * mib,
                      "pool": "large", "frame": 0})
    for step in range(4):
        lines.append({"action": "step", "step": step})
        addrs = []
        offset = 0
        for i in range(6):
            size = (1 + i % 3) * mib
            if kind == "allocator":  # carved one after another from the segment's start
                addr, offset = base + offset, offset + size
            else:
                addr, size = base + i * 4 * mib, size + i * 4096
            lines.append({"action": "alloc", "addr": addr, "size": size, "frame": i % 2})
            addrs.append((addr, size))
        # The last step keeps every other block live: the free gaps between them strand.
        for addr, size in addrs[::2] if step == 3 else addrs:
            lines.append({"action": "free_requested", "addr": addr, "size": size, "frame": 1})
            if kind == "allocator":
                lines.append({"action": "free_completed", "addr": addr})
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def write_snapshot(path):
    with open(SNAPSHOT_JSON, encoding="utf-8") as f:
        doc = json.load(f)
    count = [0]

    def poison(frames):
        for frame in frames:
            count[0] += 1
            if count[0] % 3 == 0:
                frame["name"] = "name " + EVIL
                frame["filename"] = "file " + EVIL
    for seg in doc["segments"]:
        poison(seg.get("frames", []))
        for block in seg.get("blocks", []):
            poison(block.get("frames", []))
    for trace in doc["device_traces"]:
        for entry in trace:
            poison(entry.get("frames", []))
    doc["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:" + EVIL
    for a in doc.get("external_annotations", []):
        a["name"] = "annotation " + EVIL
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


OOM_LOG = (
    b"[rank0]: Traceback " + EVIL_BYTES + b"\n"
    b"[rank0]: torch.OutOfMemoryError" + EVIL_BYTES + b": CUDA out of memory. Tried to allocate "
    b"2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.50 GiB is free. Process 1234 "
    b"has 77.60 GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and "
    b"6.00 GiB is reserved by PyTorch but unallocated. " + EVIL_BYTES + b" If reserved but "
    b"unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    b"to avoid fragmentation.\n"
    b"RuntimeError" + EVIL_BYTES + b": HIP out of memory" + EVIL_BYTES + b"\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("evil")
    paths = {
        "allocator": d / "allocator.jsonl",
        "request": d / "request.jsonl",
        "snapshot": d / "snapshot.json",
        "oom": d / "oom.log",
        "dir": d,
    }
    write_trace(paths["allocator"], "allocator")
    write_trace(paths["request"], "request")
    write_snapshot(paths["snapshot"])
    paths["oom"].write_bytes(OOM_LOG)
    return {k: str(v) for k, v in paths.items()}


# ---- The commands -------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["allocator", "request", "snapshot"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_analyze(inputs, which, json_flag):
    r = run("analyze", inputs[which], "--color", "never", *json_flag)
    assert_ran(r, f"analyze {which}")
    assert_safe(r, f"analyze {which} {json_flag}")
    if json_flag:
        json.loads(r.stdout)  # the escapes keep it JSON
    elif which != "snapshot":
        out = r.stdout.decode("utf-8")
        # Escaped visibly, on the line it belongs to.
        assert "producer: producer \\x1b]0;pwned\\x07\\x1b[2J" in out
        assert "<nl>\\x0a<tab>\\x09|" in out


SGR = re.compile(rb"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("command", [["analyze", "allocator"], ["analyze", "snapshot"],
                                     ["replay", "request", "--capacity", "1GiB"],
                                     ["check", "allocator", "--max-fragmentation", "0.01"]])
def test_colored_text_keeps_only_its_own_colors(inputs, command, tmp_path):
    r = run(command[0], inputs[command[1]], *command[2:], "--color", "always",
            *(["--history", str(tmp_path / "h.sqlite")] if command[0] == "check" else []))
    assert_ran(r, f"{command[0]} --color always", codes=(0, 1))
    assert SGR.search(r.stdout), "no colors: the test does not test what it should"
    r.stdout = SGR.sub(b"", r.stdout)
    assert_safe(r, f"{command[0]} --color always, without its SGR sequences")


@pytest.mark.parametrize("which", ["request", "snapshot"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_replay(inputs, which, json_flag):
    r = run("replay", inputs[which], "--capacity", "1GiB", "--color", "never", *json_flag)
    assert_ran(r, f"replay {which}")
    assert_safe(r, f"replay {which} {json_flag}")


def test_replay_echoes_a_bad_alloc_conf_safely(inputs):
    r = run("replay", inputs["request"], "--capacity", "1GiB",
            "--alloc-conf", "max_split_size_mb:" + EVIL_NO_NUL)
    assert_ran(r, "replay --alloc-conf", codes=(2,))
    assert_safe(r, "replay --alloc-conf")
    r = run("replay", inputs["request"], "--capacity", "1GiB", "--alloc-conf", EVIL_NO_NUL + ":1")
    assert_ran(r, "replay --alloc-conf key", codes=(2,))
    assert_safe(r, "replay --alloc-conf key")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_tune(inputs, json_flag):
    r = run("tune", inputs["request"], "--capacity", "1GiB", "--threads", "1",
            "--setting", "expandable_segments:True", "--setting", "max_split_size_mb:64",
            *json_flag)
    assert_ran(r, "tune")
    assert_safe(r, f"tune {json_flag}")
    r = run("tune", inputs["request"], "--capacity", "1GiB", "--setting", EVIL_NO_NUL)
    assert_ran(r, "tune --setting", codes=(2,))
    assert_safe(r, "tune --setting")


def test_tune_snapshot(inputs):
    r = run("tune", inputs["snapshot"], "--capacity", "1GiB", "--threads", "1",
            "--setting", "expandable_segments:True")
    assert_ran(r, "tune snapshot", codes=(0, 2))
    assert_safe(r, "tune snapshot")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_check(inputs, json_flag, tmp_path):
    history = str(tmp_path / "h.sqlite")
    r = run("check", inputs["allocator"], "--history", history, "--max-fragmentation", "0.01",
            *json_flag)
    assert_ran(r, "check", codes=(0, 1))
    assert_safe(r, f"check {json_flag}")
    r = run("check", inputs["allocator"], "--history", history, "--baseline", EVIL_NO_NUL,
            *json_flag)
    assert_ran(r, "check --baseline", codes=(0, 1, 2))
    assert_safe(r, f"check --baseline {json_flag}")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_explain(inputs, json_flag):
    r = run("explain", inputs["oom"], *json_flag)
    assert_ran(r, "explain")
    assert_safe(r, f"explain {json_flag}")
    r = run("explain", *json_flag, stdin=OOM_LOG)
    assert_ran(r, "explain -")
    assert_safe(r, f"explain - {json_flag}")


def test_explain_with_a_replay(inputs):
    r = run("explain", inputs["oom"], "--snapshot", inputs["snapshot"])
    assert_ran(r, "explain --snapshot", codes=(0, 2))
    assert_safe(r, "explain --snapshot")
    r = run("explain", inputs["oom"], "--trace", inputs["request"])
    assert_ran(r, "explain --trace", codes=(0, 2))
    assert_safe(r, "explain --trace")
    r = run("explain", inputs["oom"], "--trace", SAMPLE, "--alloc-conf", EVIL_NO_NUL)
    assert_ran(r, "explain --alloc-conf", codes=(2,))
    assert_safe(r, "explain --alloc-conf")


def test_convert(inputs):
    d = inputs["dir"]
    for source, name in ((inputs["snapshot"], "out.jsonl"), (inputs["snapshot"], "out.json"),
                         (inputs["allocator"], "out.perfetto.json"),
                         (inputs["allocator"], EVIL_NAME + ".jsonl"),
                         (inputs["snapshot"], "req " + EVIL_NAME + ".jsonl")):
        to = ["--to", "requests"] if name.startswith("req ") else []
        r = run("convert", source, "-o", os.path.join(d, name), *to)
        assert_ran(r, f"convert {name!r}")
        assert_safe(r, f"convert -> {name!r}")


def test_report(inputs):
    d = inputs["dir"]
    r = run("report", inputs["allocator"], "-o", os.path.join(d, EVIL_NAME + ".html"))
    assert_ran(r, "report")
    assert_safe(r, "report")
    r = run("report", inputs["request"], "-o", os.path.join(d, "r.html"), "--alloc-conf",
            EVIL_NO_NUL)
    assert_ran(r, "report --alloc-conf", codes=(2,))
    assert_safe(r, "report --alloc-conf")


def test_history(inputs, tmp_path):
    history = str(tmp_path / "h.sqlite")
    r = run("history", "record", inputs["allocator"], "--history", history,
            "--run", "run " + EVIL_NO_NUL, "--arch", "arch " + EVIL_NO_NUL)
    assert_ran(r, "history record")
    assert_safe(r, "history record")
    r = run("history", "record", inputs["request"], "--history", history, "--capacity", "1GiB")
    assert_ran(r, "history record (labels)", codes=(0, 2))
    assert_safe(r, "history record (labels)")
    for args in (["list"], ["list", "--json"], ["show", "run " + EVIL_NO_NUL],
                 ["show", "run " + EVIL_NO_NUL, "--json"], ["show", EVIL_NAME],
                 ["compare", inputs["allocator"], "--arch", "arch " + EVIL_NO_NUL],
                 ["forget", "run " + EVIL_NO_NUL]):
        r = run("history", *args, "--history", history)
        assert_ran(r, f"history {args[0]}", codes=(0, 1, 2))
        assert_safe(r, f"history {args}")


def test_file_names_in_errors(inputs):
    d = inputs["dir"]
    for command in (["analyze"], ["replay"], ["tune"], ["check"], ["explain"],
                    ["report", "-o", os.path.join(d, "x.html")],
                    ["convert", "-o", os.path.join(d, "x.jsonl")]):
        r = run(*command[:1], os.path.join(d, "nothing " + EVIL_NAME), *command[1:])
        assert r.returncode != 0
        assert_safe(r, f"{command[0]} of a missing file")
    bad = os.path.join(d, "bad " + EVIL_NAME + ".jsonl")
    with open(bad, "wb") as f:
        f.write(b'{"format":"fragscope-trace","version":1,"producer":"' + EVIL_BYTES.replace(
            b'"', b"") + b'"}\n{"action":"' + EVIL_BYTES.replace(b'"', b"") + b'"}\n')
    for command in ("analyze", "replay", "tune", "check"):
        r = run(command, bad)
        assert r.returncode != 0
        assert_safe(r, f"{command} of a bad file")


def test_an_error_is_one_line(inputs):
    """A newline in a quoted path or value cannot forge a line of its own on stderr."""
    r = run("analyze", os.path.join(inputs["dir"], "a\nfragscope: forged\tline"))
    assert r.returncode == 2
    assert_safe(r, "analyze of a missing file with a newline")
    assert r.stderr.count(b"\n") == 1 and r.stderr.endswith(b"\n"), r.stderr
    assert b"a\\x0afragscope: forged\\x09line" in r.stderr


def test_unknown_option_and_command_are_echoed_safely():
    r = run("anal" + EVIL_NO_NUL)
    assert r.returncode == 2
    assert_safe(r, "unknown command")
    r = run("analyze", "--evil" + EVIL_NO_NUL, SAMPLE)
    assert r.returncode == 2
    assert_safe(r, "unknown option")


# ---- Strings from the machine and the daemon ----------------------------------------------


def write_procfs(root):
    gpu = root / "gpus" / "0000:3b:00.0"
    gpu.mkdir(parents=True)
    (root / "version").write_bytes(
        b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05 " + EVIL_BYTES + b"\n")
    (gpu / "information").write_bytes(
        b"Model: \t\t NVIDIA " + EVIL_BYTES + b"\n"
        b"GPU UUID: \t GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0\n"
        b"Bus Location: \t 0000:3b:00.0\nDevice Minor: \t 0\n"
        b"GPU Firmware: \t 535 " + EVIL_BYTES + b"\nGPU Excluded:\t No\n")


@pytest.mark.skipif(not FAKE_NVML or not os.path.exists(FAKE_NVML),
                    reason="FRAGSCOPE_FAKE_NVML is not set to the stand-in library")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_gpus(tmp_path, json_flag):
    fixture = tmp_path / "nvml.txt"
    fixture.write_bytes(
        b"driver 535.104.05 " + EVIL_BYTES + b"\nnvml 12.535 " + EVIL_BYTES + b"\ncuda 12020\n"
        b"gpu GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0\n"
        b"name NVIDIA " + EVIL_BYTES + b"\npci 00000000:3B:00.0\n"
        b"memory total=85899345920 used=21474836480 free=63887343616 reserved=537165824\n"
        b"process pid=4242 used=20401094656\n")
    write_procfs(tmp_path / "proc")
    r = run("gpus", "--nvml-lib", FAKE_NVML, "--proc-root", str(tmp_path / "proc"), *json_flag,
            env={"FRAGSCOPE_FAKE_NVML_FIXTURE": str(fixture)})
    assert_ran(r, "gpus")
    assert_safe(r, f"gpus {json_flag}")
    r = run("gpus", "--nvml-lib", str(tmp_path / EVIL_NAME), "--proc-root",
            str(tmp_path / EVIL_NAME))
    assert_safe(r, "gpus with missing paths")


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_probe(json_flag):
    evil = EVIL_BYTES.replace(b"\\", b"").replace(b'"', b"").replace(b"\n", b"")
    labels = (b'pid="42' + evil + b'",rank="' + evil + b'",gpu="' + evil
              + b'",UUID="GPU-1",device_uuid="GPU-1",Hostname="' + evil + b'"')
    _Metrics.body = (b"# HELP fragscope_up up\nfragscope_up 1\n"
                     b"fragscope_process_forecast_level{" + labels + b"} 4\n"
                     b"fragscope_process_fragmentation_ratio{" + labels + b"} 0.6\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        r = run("probe", "--url", url, *json_flag)
        assert r.returncode == 2, r.stdout
        assert_safe(r, f"probe {json_flag}")
        r = run("probe", "--url", url + "/" + EVIL_NAME, *json_flag)
        assert_safe(r, f"probe of a bad url {json_flag}")
        r = run("probe", "--url", "ftp://" + EVIL_NAME, *json_flag)
        assert_safe(r, f"probe of a bad scheme {json_flag}")
    finally:
        server.shutdown()
        server.server_close()


def test_alerts(tmp_path):
    config = tmp_path / "rules.toml"
    evil_toml = json.dumps(EVIL_NO_NUL)  # a TOML basic string accepts JSON's escapes
    config.write_text(
        f"[hooks.h1]\ntype = \"exec\"\ncommand = [\"/bin/true\", {evil_toml}]\n"
        f"[[rules]]\nname = {json.dumps('Rule' + EVIL_NO_NUL)}\nmetric = \"fragmentation_ratio\"\n"
        f"op = \">\"\nvalue = 0.1\nsummary = {evil_toml}\nhooks = [\"h1\"]\n"
        f"labels = {{ team = {evil_toml} }}\n", encoding="utf-8")
    r = run("alerts", "check", str(config))
    assert_safe(r, "alerts check")
    sample = {"pid": 42, "device_uuid": "GPU-" + EVIL_NO_NUL, "rank": 0,
              "forecast_level": "critical", "fragmentation_ratio": 0.6,
              "hostname": EVIL_NO_NUL, "run": EVIL_NO_NUL}
    r = run("alerts", "test", str(config), "--sample", json.dumps(sample), "--dry-run")
    assert_safe(r, "alerts test")
    bad = tmp_path / "bad.toml"
    bad.write_text(f"[[rules]]\nname = {evil_toml}\nmetric = {evil_toml}\n", encoding="utf-8")
    r = run("alerts", "check", str(bad))
    assert r.returncode == 2
    assert_safe(r, "alerts check of a bad file")
    r = run("alerts", "test", str(config), "--sample", '{"pid": "' + EVIL_NAME + '"')
    assert_safe(r, "alerts test of a bad sample")


def test_the_sample_is_unchanged_by_the_escaping():
    """Plain text (no control characters) comes out as before: UTF-8 kept, nothing escaped."""
    r = run("analyze", SAMPLE, "--color", "never")
    assert r.returncode == 0
    assert b"\\x" not in r.stdout
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as f:
        producer = json.loads(f.readline())["producer"]
    assert f"producer: {producer}" in r.stdout.decode("utf-8")


# ---- The daemon's log ----------------------------------------------------------------------


def test_serve_log_lines(tmp_path):
    """The daemon's log echoes agent-provided strings (a device UUID with C1 controls, which
    the agent protocol lets through; it refuses C0 and DEL), its --hostname and its paths:
    each log message is escaped as one field, newlines included."""
    sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
    import fragscope_agent  # python/fragscope_agent.py, the agent's client

    sock = str(tmp_path / "agent.sock")
    log_path = tmp_path / "serve.log"
    uuid = "GPU-\u009b31m\u0085\u009d0;t\u009c-" + "\u00e9\u663e"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [BIN, "serve", "--socket", sock, "--listen", "127.0.0.1:0", "--interval", "0.2",
             "--hostname", "host" + EVIL_NO_NUL, "--history", str(tmp_path / "h.sqlite"),
             "--nvml-lib", str(tmp_path / ("nvml" + EVIL_NAME)),
             "--proc-root", str(tmp_path / ("proc" + EVIL_NAME))],
            stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 10
        while b"metrics on http://" not in log_path.read_bytes():
            assert proc.poll() is None, log_path.read_bytes()
            assert time.time() < deadline, log_path.read_bytes()
            time.sleep(0.05)
        with fragscope_agent.AgentClient(sock) as agent:  # recorded under our pid (SO_PEERCRED)
            for step in range(0, 200, 10):
                peak = (6 << 30) + step * (8 << 20)
                assert agent.send_sample(fragscope_agent.sample_from_memory_stats(
                    {"reserved_bytes.all.current": peak + (512 << 20),
                     "allocated_bytes.all.current": peak // 2,
                     "reserved_bytes.all.peak": peak + (512 << 20),
                     "allocated_bytes.all.peak": peak, "num_alloc_retries": 0},
                    device_uuid=uuid, step=step, device_free_bytes=(10 << 30) - peak - (512 << 20)))
        # A frame the daemon refuses: its error names the field.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        s.sendall(fragscope_agent.encode_frame(
            json.dumps({"pid": "x" + EVIL_NO_NUL, "device_uuid": uuid}).encode()))
        s.close()
        deadline = time.time() + 10
        while b"forecast: pid %d" % os.getpid() not in log_path.read_bytes() and time.time() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    log = log_path.read_bytes()
    assert b"forecast: pid %d on GPU-" % os.getpid() + b"\\xc2\\x9b31m\\xc2\\x85" in log, log
    assert "\u00e9\u663e".encode() in log  # UTF-8 that is not a control stays as it is
    assert b"host\\x1b]0;pwned\\x07" in log
    problems = bad_bytes(log)
    assert not problems, f"serve's log: raw control bytes: {problems[:3]}"
    lines = log.decode().splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\dT", line) for line in lines), "a message split a line"
