"""Issue 19 items 2, 4, 7 and 11: what a new user types and pastes, against the built binary.

* Allocator settings: every string PyTorch accepts (lists, a pasted PYTORCH_CUDA_ALLOC_CONF=
  line) goes through every command that takes --alloc-conf, and the settings survive into the
  header of the simulated trace and back (one parser, one printer: src/model/alloc_conf.h).
* Sizes as people write them (src/common/units.h).
* Errors that teach: a file of the wrong kind says what it is and which command takes it;
  mistyped commands and options get a suggestion.
* A request of 1 EiB or more is PyTorch's own OOM, not a reader error.
"""

import json
import os
import random
import subprocess
import zipfile

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
EXPLAIN_TRACE = "tests/data/explain/fragmented_oom.jsonl"
EXPLAIN_MESSAGE = "tests/data/explain/fragmented_oom.txt"
SNAPSHOT = "tests/data/cli/snapshot_small.pickle"
MiB = 1 << 20
GiB = 1 << 30

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args, **kwargs):
    return subprocess.run([BIN, *args], cwd=SOURCE_DIR, capture_output=True, timeout=300,
                          **kwargs)


def request_trace(path, settings=None, capacity=GiB, sizes=(4 * MiB, 30 * MiB, 700 * 1024)):
    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "devices": [{"device": 0, "capacity_bytes": capacity}]}
    if settings is not None:
        header["allocator_settings"] = settings
    lines = [json.dumps(header)]
    for i, size in enumerate(sizes):
        lines.append(json.dumps({"action": "alloc", "addr": i + 1, "size": size}))
    for i, size in enumerate(sizes):
        lines.append(json.dumps({"action": "free_requested", "addr": i + 1, "size": size}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def header_of(path):
    with open(path) as f:
        return json.loads(f.readline())


def joined(settings):
    """A header's allocator_settings (object or string) as one conf string."""
    if isinstance(settings, str):
        return settings
    return ",".join(f"{k}:{v}" for k, v in settings.items())


# ---- Item 2: allocator settings ---------------------------------------------------------------

def generated_confs(count, seed=19):
    """Strings newest PyTorch accepts: lists with and without '>', spaces, pasted prefixes."""
    rng = random.Random(seed)

    def pow2(max_log):
        return 1 << rng.randint(0, max_log)

    def roundup_list():
        entries = [f"{pow2(16)}:{0 if rng.random() < 0.2 else pow2(6)}"
                   for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.5:
            entries.append(f">:{pow2(6)}")
        return "[" + ",".join(entries) + "]"

    makers = [
        lambda: f"max_split_size_mb:{rng.randint(20, 4096)}",
        lambda: f"roundup_power2_divisions:{pow2(5)}",
        lambda: "roundup_power2_divisions:" + roundup_list(),
        lambda: f"garbage_collection_threshold:0.{rng.randint(1, 99)}",
        lambda: "expandable_segments:" + rng.choice(["True", "False"]),
        lambda: f"max_non_split_rounding_mb:{rng.randint(20, 1024)}",
        lambda: f"per_process_memory_fraction:0.{rng.randint(50, 99)}",
    ]
    out = ["roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",  # the issue's own example
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,roundup_power2_divisions:[>:4]"]
    while len(out) < count:
        items = [rng.choice(makers)() for _ in range(rng.randint(1, 4))]
        conf = rng.choice([",", ", ", " ,"]).join(items)
        prefix = rng.choice(["", "", "PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF="])
        out.append(prefix + conf)
    return out


def strip_prefix(conf):
    for name in ("PYTORCH_CUDA_ALLOC_CONF=", "PYTORCH_ALLOC_CONF="):
        if conf.startswith(name):
            return conf[len(name):]
    return conf


def test_every_accepted_conf_survives_every_command(tmp_path):
    req = request_trace(tmp_path / "req.jsonl")
    for i, conf in enumerate(generated_confs(24)):
        # replay: the simulator runs with it, and the simulated trace's header carries it.
        emitted = str(tmp_path / f"sim{i}.jsonl")
        r = run("replay", req, "--alloc-conf", conf, "--emit", emitted, "--json", "--no-map")
        assert r.returncode == 0, (conf, r.stderr.decode())
        canonical = json.loads(r.stdout)["devices"][0]["alloc_conf"]
        assert joined(header_of(emitted).get("allocator_settings", {})) == canonical, conf
        # The emitted trace's header reads back (analyze), and a request trace whose header
        # carries the settings, in either of the header's forms, replays under them.
        assert run("analyze", emitted, "--no-map").returncode == 0, conf
        for settings in (canonical, header_of(emitted).get("allocator_settings", {})):
            again = request_trace(tmp_path / f"again{i}.jsonl", settings=settings)
            r = run("replay", again, "--json", "--no-map")
            assert r.returncode == 0, (conf, settings, r.stderr.decode())
            assert json.loads(r.stdout)["devices"][0]["alloc_conf"] == canonical, conf
        # The pasted form and the canonical form are the same settings.
        r = run("replay", req, "--alloc-conf", canonical, "--json", "--no-map")
        assert json.loads(r.stdout)["devices"][0]["alloc_conf"] == canonical
        # check and tune take it too.
        r = run("check", req, "--alloc-conf", conf)
        assert r.returncode == 0, (conf, r.stderr.decode())
        r = run("tune", req, "--capacity", "1GiB", "--setting", conf, "--json")
        assert r.returncode == 0, (conf, r.stderr.decode())
        assert json.loads(r.stdout)["ranked"][0]["alloc_conf"] == strip_prefix(conf)
        # explain replays the job under it.
        r = run("explain", EXPLAIN_MESSAGE, "--trace", EXPLAIN_TRACE, "--alloc-conf", conf)
        assert r.returncode == 0, (conf, r.stderr.decode())


@pytest.mark.parametrize("version", ["1.13", "2", "newest"])
def test_tune_and_explain_work_on_their_own_grid_for_every_version(tmp_path, version):
    req = request_trace(tmp_path / "req.jsonl")
    r = run("tune", req, "--capacity", "1GiB", "--torch-version", version, "--json")
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)["ranked"]
    assert len(rows) == (36 if version == "1.13" else 72)
    if version != "newest":
        assert not any("per_process_memory_fraction" in row["alloc_conf"] for row in rows)
    r = run("explain", EXPLAIN_MESSAGE, "--trace", EXPLAIN_TRACE, "--torch-version", version)
    assert r.returncode == 0, r.stderr.decode()


def test_version_ranges_in_help_agree_with_messages(tmp_path):
    help_text = run("replay", "--help").stdout.decode()
    req = request_trace(tmp_path / "req.jsonl")
    r = run("replay", req, "--torch-version", "2", "--alloc-conf",
            "per_process_memory_fraction:0.5")
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "PyTorch 2.0-2.5 does not have it" in err, err
    assert "PyTorch 2.0-2.5" in help_text, help_text
    assert "2.0-2.8" not in help_text


def test_a_pasted_prefix_keeps_error_offsets_on_the_whole_line(tmp_path):
    req = request_trace(tmp_path / "req.jsonl")
    r = run("replay", req, "--alloc-conf", "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:10")
    assert r.returncode == 2
    assert "at offset 42" in r.stderr.decode(), r.stderr.decode()


def test_the_formats_doc_header_example_replays(tmp_path):
    # docs/formats.md: {"expandable_segments": true, "max_split_size": -1}, a snapshot's keys.
    req = request_trace(tmp_path / "req.jsonl",
                        settings={"expandable_segments": True, "max_split_size": -1})
    r = run("replay", req, "--json", "--no-map")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["devices"][0]["alloc_conf"] == "expandable_segments:True"


# ---- Item 4: sizes -------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("21.94GiB", 23557895619),
    ("11.03 GiB", 11843372319),
    ("40GiB", 40 * GiB),
])
def test_capacities_as_pytorch_prints_them(tmp_path, text, expected):
    req = request_trace(tmp_path / "req.jsonl")
    r = run("replay", req, "--capacity", text, "--json", "--no-map")
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["devices"][0]["capacity_bytes"] == expected


# Every command that takes a device's size: the same grammar, the same note and refusals
# (issue 29 item 10). `report` writes a page: -o goes to tmp_path.
CAPACITY_COMMANDS = ["replay", "tune", "check", "report", "analyze", "history record"]


def capacity_command(command, req, tmp_path, *args):
    extra = []
    if command == "report":
        extra = ["-o", str(tmp_path / "r.html")]
    elif command == "history record":
        extra = ["--run", "r1", "--arch", "a", "--history", str(tmp_path / "h.sqlite")]
    return run(*command.split(), req, *args, *extra)


@pytest.mark.parametrize("command", CAPACITY_COMMANDS)
def test_a_bare_small_capacity_is_refused_with_a_hint(tmp_path, command):
    req = request_trace(tmp_path / "req.jsonl")
    r = capacity_command(command, req, tmp_path, "--capacity", "40")
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "40GiB" in err and "40 bytes" in err, err


@pytest.mark.parametrize("command", CAPACITY_COMMANDS)
def test_a_decimal_capacity_gets_a_note(tmp_path, command):
    req = request_trace(tmp_path / "req.jsonl")
    r = capacity_command(command, req, tmp_path, "--capacity", "40GB")
    assert r.returncode in (0, 1), r.stderr.decode()
    err = r.stderr.decode()
    assert "note: --capacity" in err and "40GiB = 42949672960 bytes" in err, err
    (tmp_path / "h.sqlite").unlink(missing_ok=True)
    err = capacity_command(command, req, tmp_path, "--capacity", "40GiB").stderr.decode()
    assert "note: --capacity" not in err, err


@pytest.mark.parametrize("command", ["replay", "tune", "check", "report", "history record"])
def test_more_used_by_others_than_capacity_is_refused(tmp_path, command):
    req = request_trace(tmp_path / "req.jsonl")
    r = capacity_command(command, req, tmp_path, "--capacity", "1GiB",
                         "--used-by-others", "2GiB")
    assert r.returncode == 2, (r.stdout.decode(), r.stderr.decode())
    err = r.stderr.decode()
    assert "--used-by-others: 2.00 GiB" in err and "more than --capacity, 1.00 GiB" in err, err
    ok = capacity_command(command, req, tmp_path, "--capacity", "1GiB",
                          "--used-by-others", "1GiB")
    assert "more than --capacity" not in ok.stderr.decode()


def test_explain_refuses_more_used_by_others_than_capacity():
    r = run("explain", EXPLAIN_MESSAGE, "--trace", EXPLAIN_TRACE, "--capacity", "1GiB",
            "--used-by-others", "3GiB")
    assert r.returncode == 2
    assert "more than --capacity" in r.stderr.decode(), r.stderr.decode()


def test_analyze_capacity_gives_the_forecast_its_device(tmp_path):
    # A trace whose header has no capacity: without --capacity the forecast has no device
    # (no OOM risk); with it, the device and the risk are there.
    req = request_trace(tmp_path / "req.jsonl")
    alloc = tmp_path / "alloc.jsonl"
    emitted = run("replay", req, "--emit", str(alloc), "--no-map")
    assert emitted.returncode == 0, emitted.stderr.decode()
    lines = alloc.read_text().splitlines()
    header = json.loads(lines[0])
    for d in header.get("devices", []):
        d.pop("capacity_bytes", None)
    bare = tmp_path / "bare.jsonl"
    bare.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    without = json.loads(run("analyze", str(bare), "--forecast", "--json", "--no-map").stdout)
    assert without["devices"][0]["capacity_bytes"] is None
    r = run("analyze", str(bare), "--capacity", "2GiB", "--forecast", "--json", "--no-map")
    assert r.returncode == 0, r.stderr.decode()
    dev = json.loads(r.stdout)["devices"][0]
    assert dev["capacity_bytes"] == 2 * GiB
    assert "capacity unknown" not in json.dumps(dev["forecast"])
    assert "capacity unknown" in json.dumps(without["devices"][0]["forecast"])


def test_history_records_a_request_trace_replayed_on_capacity(tmp_path):
    req = request_trace(tmp_path / "req.jsonl")
    db = str(tmp_path / "h.sqlite")
    r = run("history", "record", req, "--capacity", "1GiB", "--run", "r1", "--arch", "a",
            "--history", db, "--json")
    assert r.returncode == 0, r.stderr.decode()
    shown = run("history", "show", "r1", "--history", db, "--json")
    assert shown.returncode == 0, shown.stderr.decode()
    assert json.loads(shown.stdout)["peak_reserved_bytes"] > 0


# ---- Item 7: errors that teach -------------------------------------------------------------------

def test_wrong_files_given_to_analyze_say_what_they_are(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("epoch 1 loss 0.51\ntorch.OutOfMemoryError: CUDA out of memory. Tried to "
                   "allocate 20.00 MiB. GPU 0 has a total capacity of 7.93 GiB\n")
    text = tmp_path / "notes.txt"
    text.write_text("hello world\n")
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    model = tmp_path / "model.pt"
    with zipfile.ZipFile(model, "w") as z:  # what torch.save writes
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    cases = [
        (log, ["out-of-memory message (line 2", f"fragscope explain {log}"]),
        (text, ["text (first line: \"hello world\")", "fragscope explain"]),
        (empty, ["this file is empty"]),
        (model, ["ZIP archive", "torch.save", "torch.cuda.memory._dump_snapshot"]),
    ]
    for path, words in cases:
        for command in ("analyze", "replay"):
            r = run(command, str(path))
            assert r.returncode == 2
            err = r.stderr.decode()
            assert err.startswith(f"fragscope: {path}: expected a fragscope trace"), err
            assert "PyTorch memory snapshot" in err, err
            for w in words:
                assert w in err, (w, err)


def test_a_snapshot_given_to_explain_says_which_command_takes_it():
    r = run("explain", SNAPSHOT)
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "expected the text of an out-of-memory error" in err, err
    assert "PyTorch memory snapshot" in err, err
    assert f"fragscope analyze {SNAPSHOT}" in err and "--snapshot" in err, err


def test_explain_on_a_zip_and_an_empty_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    r = run("explain", str(empty))
    assert r.returncode == 2 and "this file is empty" in r.stderr.decode(), r.stderr.decode()
    model = tmp_path / "model.pt"
    with zipfile.ZipFile(model, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    r = run("explain", str(model))
    assert r.returncode == 2 and "torch.save" in r.stderr.decode(), r.stderr.decode()


def test_explain_says_it_reads_standard_input_on_a_terminal():
    import pty
    leader, follower = pty.openpty()
    try:
        p = subprocess.Popen([BIN, "explain"], cwd=SOURCE_DIR, stdin=follower,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        os.write(leader, b"\x04")  # Ctrl-D: end of input
        _, err = p.communicate(timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    assert "reading the error text from standard input" in err.decode(), err.decode()
    # Not on a pipe: the text would get in the way of scripts.
    r = run("explain", input=b"")
    assert "reading the error text" not in r.stderr.decode()


@pytest.mark.parametrize("args,words", [
    (["anlyze", "x"], "unknown command 'anlyze' (did you mean 'analyze'?)"),
    (["expalin"], "(did you mean 'explain'?)"),
    (["replay", "x", "--capacty", "1GiB"], "replay: unknown option '--capacty' (did you mean "
                                           "'--capacity'?)"),
    (["analyze", "x", "--jsn"], "(did you mean '--json'?)"),
    (["tune", "x", "--alloc_conf=a"], "unknown option '--alloc_conf'"),
    # A nested command's options are its own: a bad value is not an unknown option.
    (["history", "record", "x", "--capacty", "1GiB"],
     "history record: unknown option '--capacty' (did you mean '--capacity'?)"),
    (["history", "record", "x", "--capacity", "40"], "40 bytes is not a GPU's memory"),
])
def test_mistyped_commands_and_options_get_a_suggestion(args, words):
    r = run(*args)
    assert r.returncode == 2
    assert words in r.stderr.decode(), r.stderr.decode()
    assert "unknown option '--capacity'" not in r.stderr.decode()


# ---- Item 11: a request of 1 EiB or more -------------------------------------------------------

def test_a_request_of_one_exbibyte_is_pytorchs_own_oom(tmp_path):
    req = request_trace(tmp_path / "req.jsonl", sizes=(4 * MiB, 1 << 60))
    r = run("replay", req, "--no-map")
    assert r.returncode == 1, r.stderr.decode()
    assert "CUDA out of memory. Tried to allocate more than 1EB memory." in r.stdout.decode()
    r = run("replay", req, "--json", "--no-map")
    doc = json.loads(r.stdout)
    assert doc["oom"]["message"] == "CUDA out of memory. Tried to allocate more than 1EB memory."
    assert doc["oom"]["requested_bytes"] == 1 << 60
    assert doc["oom"]["rounded_bytes"] is None  # the allocator never ran
    # The largest 64-bit size too; one more is not a size at all.
    req = request_trace(tmp_path / "max.jsonl", sizes=((1 << 64) - 1,))
    assert run("replay", req, "--no-map").returncode == 1
    req = request_trace(tmp_path / "over.jsonl", sizes=(1 << 64,))
    r = run("replay", req, "--no-map")
    assert r.returncode == 2
    assert "does not fit in 64 bits" in r.stderr.decode(), r.stderr.decode()
