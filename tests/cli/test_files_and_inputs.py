"""Issue 24 items 4 and 5: no writes through links, and special inputs.

Item 4: every output goes to a new temporary file next to it (O_CREAT|O_EXCL|O_NOFOLLOW, a
random dot name) renamed into place; a link at a name fragscope chose (report's default name,
the daemon's textfile, a temporary) is refused with exit 2; a link the user named as the output
is followed to its existing file; a link to nothing is refused; --history refuses links; an
interrupted convert leaves no temporary. Item 5: FIFOs, -, /dev/stdin and process substitution
are read once (the format is sniffed from a buffer, never by reopening), and an endless input
ends at --max-input-bytes with exit 2. docs/user-guide.md, "Limits and safety".
"""

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

import bounds  # tests/cli/bounds.py: scaled for the sanitizer build

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
SAMPLE = os.path.join(SOURCE_DIR, "tests", "data", "sample", "gpt_tiny_50steps.jsonl.gz")
SMALL = os.path.join(SOURCE_DIR, "tests", "data", "cli", "snapshot_small.pickle")
VICTIM_TEXT = b"the link's target, which fragscope must not touch\n"

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args, timeout=120, **kwargs):
    return subprocess.run([BIN, *args], capture_output=True, timeout=timeout, **kwargs)


def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_bytes(VICTIM_TEXT)
    return path


def listing(path):
    return sorted(os.listdir(path))


# ---- Item 4: outputs and links ---------------------------------------------------------------

def test_convert_never_writes_through_a_link_at_a_temporary_name(tmp_path):
    # OUT.tmp was the temporary's fixed name: a link planted there was opened with O_TRUNC and
    # the file it points to overwritten.
    target = victim(tmp_path)
    os.symlink(target, tmp_path / "out.jsonl.tmp")
    r = run("convert", SAMPLE, "-o", str(tmp_path / "out.jsonl"))
    assert r.returncode == 0, r.stderr.decode()
    assert target.read_bytes() == VICTIM_TEXT
    assert os.readlink(tmp_path / "out.jsonl.tmp") == str(target)
    assert listing(tmp_path) == ["out.jsonl", "out.jsonl.tmp", "victim"]


def test_replay_emit_never_writes_through_a_link_at_a_temporary_name(tmp_path):
    target = victim(tmp_path)
    os.symlink(target, tmp_path / "sim.jsonl.tmp")
    r = run("replay", SAMPLE, "--capacity", "1GiB", "--emit", str(tmp_path / "sim.jsonl"))
    assert r.returncode == 0, r.stderr.decode()
    assert target.read_bytes() == VICTIM_TEXT
    assert (tmp_path / "sim.jsonl").read_bytes().startswith(b'{"format":"fragscope-trace"')


def test_report_refuses_a_link_at_its_default_name(tmp_path):
    target = victim(tmp_path)
    os.symlink("victim", tmp_path / "report.html")
    r = run("report", SMALL, cwd=tmp_path)
    assert r.returncode == 2, r.stderr.decode()
    err = r.stderr.decode()
    assert "report.html: is a symbolic link (to victim)" in err
    assert "name the output explicitly" in err
    assert target.read_bytes() == VICTIM_TEXT
    assert os.path.islink(tmp_path / "report.html")
    assert listing(tmp_path) == ["report.html", "victim"]  # no temporary left


def test_an_output_the_user_named_may_be_a_link_to_an_existing_file(tmp_path):
    # The documented rule: the user named the path, so its link is followed once; the file it
    # points to is replaced (atomically, next to it) and the link stays.
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "report.html"
    real.write_bytes(b"old")
    os.symlink(real, tmp_path / "mine.html")
    r = run("report", SMALL, "-o", str(tmp_path / "mine.html"))
    assert r.returncode == 0, r.stderr.decode()
    assert os.path.islink(tmp_path / "mine.html")
    assert real.read_bytes().startswith(b"<!DOCTYPE html>")
    assert listing(tmp_path / "real") == ["report.html"]


def test_a_link_to_nothing_is_refused_and_its_target_never_created(tmp_path):
    os.symlink(tmp_path / "created", tmp_path / "out.jsonl")
    r = run("convert", SAMPLE, "-o", str(tmp_path / "out.jsonl"))
    assert r.returncode == 2, r.stderr.decode()
    assert "which does not exist; fragscope does not create a link's target" in r.stderr.decode()
    assert not (tmp_path / "created").exists()
    assert listing(tmp_path) == ["out.jsonl"]


def test_history_refuses_links_and_never_creates_their_target(tmp_path):
    os.symlink(tmp_path / "elsewhere.sqlite", tmp_path / "h.sqlite")
    r = run("history", "record", SMALL, "--run", "r1", "--arch", "a",
            "--history", str(tmp_path / "h.sqlite"))
    assert r.returncode == 2, r.stderr.decode()
    assert "h.sqlite: is a symbolic link" in r.stderr.decode()
    assert not (tmp_path / "elsewhere.sqlite").exists()
    # A link to a real history is refused too (the history is opened only as itself).
    real = tmp_path / "real.sqlite"
    r = run("history", "record", SMALL, "--run", "r1", "--arch", "a", "--history", str(real))
    assert r.returncode == 0, r.stderr.decode()
    before = real.read_bytes()
    os.symlink(real, tmp_path / "link.sqlite")
    r = run("history", "list", "--history", str(tmp_path / "link.sqlite"))
    assert r.returncode == 2, r.stderr.decode()
    assert real.read_bytes() == before
    # And a file that is not SQLite is left as it is.
    other = tmp_path / "notes.txt"
    other.write_bytes(VICTIM_TEXT * 200)
    r = run("history", "list", "--history", str(other))
    assert r.returncode == 2
    assert "not a SQLite database" in r.stderr.decode()
    assert other.read_bytes() == VICTIM_TEXT * 200


def serve_args(tmp_path, textdir):
    return [BIN, "serve", "--socket", str(tmp_path / "run" / "agent.sock"), "--listen", "none",
            "--textfile-dir", str(textdir), "--interval", "0.1",
            "--history", str(tmp_path / "history.sqlite"),
            "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--proc-root",
            str(tmp_path / "no-proc")]


def test_serve_refuses_a_link_at_the_textfile(tmp_path):
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    target = victim(tmp_path)
    os.symlink(target, textdir / "fragscope.prom")
    r = subprocess.run(serve_args(tmp_path, textdir), capture_output=True, timeout=30)
    assert r.returncode == 2, r.stderr.decode()
    assert "fragscope.prom: is a symbolic link" in r.stderr.decode()
    assert target.read_bytes() == VICTIM_TEXT


def test_serve_never_writes_through_a_link_at_its_textfile_temporary(tmp_path):
    # The daemon's temporary was DIR/.fragscope.prom.PID.tmp: knowing the PID, a local user
    # could plant a link there. The child waits until the link is planted, then execs serve.
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    target = victim(tmp_path)
    log = open(tmp_path / "serve.log", "wb")
    args = serve_args(tmp_path, textdir)
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the go, then become the daemon
        try:
            os.close(go_w)
            os.read(go_r, 1)
            os.dup2(log.fileno(), 2)
            os.execv(BIN, args)
        finally:
            os._exit(127)
    os.close(go_r)
    os.symlink(target, textdir / f".fragscope.prom.{pid}.tmp")
    os.write(go_w, b"x")
    os.close(go_w)
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not (textdir / "fragscope.prom").exists():
            time.sleep(0.05)
        time.sleep(0.3)  # a few more intervals
    finally:
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text
    assert "textfile" in text
    assert target.read_bytes() == VICTIM_TEXT


def write_big_trace(path, events):
    """A request trace of `events` allocs and frees: big enough to take a while to convert."""
    with open(path, "w") as f:
        f.write('{"format": "fragscope-trace", "version": 1, "kind": "request"}\n')
        chunk = []
        for i in range(events // 2):
            addr = 0x7f0000000000 + (i % 1000) * 4096
            chunk.append(f'{{"action":"alloc","addr":{addr},"size":{512 + i % 9000}}}\n'
                         f'{{"action":"free_requested","addr":{addr}}}\n')
            if len(chunk) >= 10000:
                f.write("".join(chunk))
                chunk = []
        f.write("".join(chunk))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_convert_leaves_no_temporary(tmp_path, sig):
    big = tmp_path / "in" / "big.jsonl"
    big.parent.mkdir()
    write_big_trace(big, 3_000_000)
    outdir = tmp_path / "out"
    outdir.mkdir()
    proc = subprocess.Popen([BIN, "convert", str(big), "-o", str(outdir / "big.jsonl.gz")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Mid-write: once the temporary exists and has grown.
        deadline = time.time() + 30
        seen = False
        while time.time() < deadline and proc.poll() is None:
            names = os.listdir(outdir)
            if names and os.path.getsize(outdir / names[0]) > 0:
                seen = True
                break
            time.sleep(0.01)
        assert seen, "convert finished before it could be interrupted; make the input bigger"
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -sig
    assert listing(outdir) == []


# ---- Item 5: special inputs ----------------------------------------------------------------

def normalized(stdout, name):
    """The JSON report with the input's name (which differs: -, /dev/fd/63, ...) taken out;
    name None: process substitution's /dev/fd/N."""
    text = stdout.decode()
    if name is None:
        return json.loads(re.sub(r"/dev/fd/[0-9]+", "INPUT", text))
    if name == "-":  # only where it ends a string ("-1" is a number)
        return json.loads(re.sub(r'(?<=[" ])-(?=")', "INPUT", text))
    return json.loads(text.replace(json.dumps(name)[1:-1], "INPUT"))


def analyze_json(name, **kwargs):
    r = run("analyze", name, "--json", **kwargs)
    assert r.returncode == 0, r.stderr.decode()
    return normalized(r.stdout, name)


def bash(command, timeout=60):
    return subprocess.run(["bash", "-c", command], capture_output=True,
                          timeout=bounds.seconds(timeout))


def through_fifo(tmp_path, data, read):
    """read(path) of a FIFO that a thread fills with `data`."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "wb").write(data))
    writer.start()
    try:
        return read(str(fifo))
    finally:
        writer.join(timeout=30)


@pytest.mark.parametrize("path", [SAMPLE, SMALL], ids=["gzip-trace", "pickle-snapshot"])
def test_analyze_reads_standard_input_fifos_and_process_substitution(tmp_path, path):
    expected = analyze_json(path)
    with open(path, "rb") as f:
        assert analyze_json("-", stdin=f) == expected
    with open(path, "rb") as f:
        data = f.read()
    # A pipe, not a file, on standard input: through - and through /dev/stdin.
    for name in ("-", "/dev/stdin"):
        r = subprocess.run([BIN, "analyze", name, "--json"], input=data, capture_output=True,
                           timeout=120)
        assert r.returncode == 0, (name, r.stderr.decode())
        assert normalized(r.stdout, name) == expected, name
    # Process substitution (/dev/fd/N).
    r = bash(f"'{BIN}' analyze <(cat '{path}') --json")
    assert r.returncode == 0, r.stderr.decode()
    assert normalized(r.stdout, None) == expected
    # A FIFO.
    assert through_fifo(tmp_path, data, analyze_json) == expected


def test_replay_reads_standard_input_fifos_and_process_substitution(tmp_path):
    def replay(name, **kwargs):
        r = run("replay", name, "--capacity", "1GiB", "--json", **kwargs)
        assert r.returncode == 0, r.stderr.decode()
        return normalized(r.stdout, name)

    expected = replay(SAMPLE)
    with open(SAMPLE, "rb") as f:
        data = f.read()
    assert replay("-", input=data) == expected
    assert replay("/dev/stdin", input=data) == expected
    r = bash(f"'{BIN}' replay <(cat '{SAMPLE}') --capacity 1GiB --json")
    assert r.returncode == 0, r.stderr.decode()
    assert normalized(r.stdout, None) == expected
    assert through_fifo(tmp_path, data, replay) == expected


def test_convert_and_explain_read_pipes(tmp_path):
    out = tmp_path / "snap.json"
    r = bash(f"'{BIN}' convert <(cat '{SMALL}') -o '{out}'")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(out.read_text())["segments"]
    # explain looks at what standard input was when it holds no error text, from its buffer.
    with open(SMALL, "rb") as f:
        r = run("explain", "-", stdin=f)
    assert r.returncode == 2
    assert "this file is a PyTorch memory snapshot" in r.stderr.decode()


def assert_limit_error(r, started):
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "--max-input-bytes" in err, err
    assert "read more than" in err, err
    assert time.time() - started < bounds.seconds(30)


@pytest.mark.parametrize("command", [
    ["explain", "/dev/zero"],
    ["analyze", "/dev/zero"],
    ["alerts", "test", os.path.join(SOURCE_DIR, "deploy", "fragscope.toml.example"),
     "--sample", "/dev/zero"],
], ids=["explain", "analyze", "alerts-sample"])
def test_dev_zero_ends_with_exit_2_in_bounded_time(command):
    started = time.time()
    r = run(*command, timeout=60)
    assert r.returncode == 2, r.stderr.decode()
    assert time.time() - started < bounds.seconds(30)
    if command[0] == "explain":
        assert_limit_error(r, started)


def test_endless_text_and_endless_traces_end_at_the_limit():
    started = time.time()
    r = bash(f"yes | '{BIN}' explain -")
    assert_limit_error(r, started)
    assert "standard input: read more than 256.0 MiB" in r.stderr.decode()
    started = time.time()
    header = '{"format":"fragscope-trace","version":1,"kind":"request"}'
    # (A lower limit than the default keeps the sanitizer build quick; the default's own
    # message is checked above.)
    r = bash(f"(echo '{header}'; yes '{{\"action\":\"empty_cache\"}}') | '{BIN}' analyze - "
             "--max-input-bytes 32MiB")
    assert_limit_error(r, started)
    # The flag lowers (or raises) it.
    started = time.time()
    r = bash(f"yes | '{BIN}' explain - --max-input-bytes 1MiB")
    assert_limit_error(r, started)
    assert "read more than 1.0 MiB" in r.stderr.decode()
