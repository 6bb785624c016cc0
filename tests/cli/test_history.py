"""Tests of `fragscope history` (record, list, show, compare, forget) against the built binary.

The traces are written by the tests: allocator traces whose fragmentation ratio grows at a
chosen rate per step, so that the baseline comparison has a known answer. Every test uses its
own temporary HOME and history file; none touches the real ~/.local/state.
"""

import hashlib
import json
import os
import re
import sqlite3
import stat
import subprocess

import pytest

BIN = os.environ.get("FRAGSCOPE_BIN", "")
SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MiB = 1 << 20

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args, home, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    full_env["HOME"] = str(home)
    full_env.update(env or {})
    return subprocess.run([BIN, *map(str, args)], cwd=SOURCE_DIR, env=full_env,
                          capture_output=True, timeout=120)


SEGMENT = 64 * MiB


def waste(rate, i):
    """Bytes left free in the segment of step i: over 1 MiB, so the allocator splits the block
    (a smaller remainder would stay inside the block as internal waste)."""
    return 2 * MiB + int(rate * i * SEGMENT) // 512 * 512


def write_trace(path, rate, steps=120, labels=None):
    """An allocator trace: at step i a new 64 MiB segment whose block leaves waste(rate, i)
    free, so the fragmentation ratio grows by about rate / 2 per step."""
    header = {"format": "fragscope-trace", "version": 1, "kind": "allocator",
              "devices": [{"device": 0, "name": "test", "capacity_bytes": 16 << 30}],
              "producer": "tests/cli/test_history.py", "labels": labels or {}}
    lines = [json.dumps(header)]
    base = 1 << 40
    t = 1000
    for i in range(steps):
        lines.append(json.dumps({"action": "step", "step": i}))
        addr = base + i * SEGMENT
        t += 10
        lines.append(json.dumps({"action": "segment_alloc", "addr": addr, "size": SEGMENT,
                                 "pool": "large", "time_us": t}))
        lines.append(json.dumps({"action": "alloc", "addr": addr,
                                 "size": SEGMENT - waste(rate, i), "time_us": t + 1}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    db = tmp_path / "h.sqlite"
    return home, db


def test_record_list_show_forget(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    r = run("history", "record", trace, "--run", "r1", "--arch", "toy-net", "--history", db,
            home=home)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert f"recorded run r1 (toy-net) in {db}" in out
    assert "no baseline for toy-net: no earlier runs are recorded" in out

    r = run("history", "list", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert re.search(r"^r1 +toy-net ", r.stdout.decode(), re.M)

    r = run("history", "show", "r1", "--json", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    shown = json.loads(r.stdout)
    assert shown["run"] == "r1" and shown["architecture"] == "toy-net"
    assert shown["steps"] == 120
    assert shown["peak_reserved_bytes"] == 120 * SEGMENT
    assert [m["step"] for m in shown["fragmentation_marks"]] == [10, 20, 50, 100]
    # The ratio at step 100: free bytes of segments 0..100 over their reserved bytes.
    wasted = sum(waste(0.001, i) for i in range(101))
    assert shown["fragmentation_marks"][3]["fragmentation_ratio"] == pytest.approx(
        wasted / (101 * SEGMENT))
    assert shown["fragmentation_growth_per_1000_steps"] == pytest.approx(0.5, rel=0.02)

    r = run("history", "show", "r1", "--history", db, home=home)
    assert "fragmentation ratio at step marks" in r.stdout.decode()

    r = run("history", "forget", "r1", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    r = run("history", "show", "r1", "--history", db, home=home)
    assert r.returncode == 2
    assert b"no run named r1" in r.stderr
    r = run("history", "forget", "r1", "--history", db, home=home)
    assert r.returncode == 2


def test_compare_says_how_much_faster(tmp_path, env):
    home, db = env
    for i in range(3):
        trace = write_trace(tmp_path / f"base{i}.jsonl", 0.001)
        r = run("history", "record", trace, "--run", f"base{i}", "--arch", "toy-net",
                "--history", db, home=home)
        assert r.returncode == 0, r.stderr.decode()
    # Another architecture must not count.
    other = write_trace(tmp_path / "other.jsonl", 0.004)
    assert run("history", "record", other, "--run", "o", "--arch", "cnn", "--history", db,
               home=home).returncode == 0

    fast = write_trace(tmp_path / "fast.jsonl", 0.0023)
    r = run("history", "compare", fast, "--arch", "toy-net", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert re.match(r"fragmenting 2\.[23]× faster than the last 3 runs of toy-net", out), out
    assert "step      now  baseline  runs" in out

    r = run("history", "compare", fast, "--arch", "toy-net", "--last", "2", "--json",
            "--history", db, home=home)
    report = json.loads(r.stdout)
    c = report["comparison"]
    assert c["baseline_runs"] == 2
    assert c["growth_ratio"] == pytest.approx(2.3, rel=0.03)
    assert [m["step"] for m in c["marks"]] == [10, 20, 50, 100]
    # compare records nothing.
    listed = json.loads(run("history", "list", "--json", "--history", db, home=home).stdout)
    assert sorted(x["run"] for x in listed) == ["base0", "base1", "base2", "o"]
    listed = json.loads(run("history", "list", "--arch", "cnn", "--json", "--history", db,
                            home=home).stdout)
    assert [x["run"] for x in listed] == ["o"]


def test_compare_without_history_has_no_baseline(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    r = run("history", "compare", trace, "--arch", "toy-net", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().startswith("no baseline for toy-net")
    assert not db.exists()
    r = run("history", "list", "--history", db, home=home)
    assert r.returncode == 0
    assert not db.exists()


def test_duplicate_run_needs_replace(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    args = ["history", "record", trace, "--run", "r", "--arch", "toy-net", "--history", db]
    assert run(*args, home=home).returncode == 0
    r = run(*args, home=home)
    assert r.returncode == 2
    assert b"already recorded" in r.stderr and b"--replace" in r.stderr
    assert run(*args, "--replace", home=home).returncode == 0
    listed = json.loads(run("history", "list", "--json", "--history", db, home=home).stdout)
    assert len(listed) == 1


def test_labels_give_run_and_arch(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001,
                        labels={"run": "from-label", "architecture": "gpt-x"})
    r = run("history", "record", trace, "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert b"recorded run from-label (gpt-x)" in r.stdout
    bare = write_trace(tmp_path / "b.jsonl", 0.001)
    r = run("history", "record", bare, "--run", "x", "--history", db, home=home)
    assert r.returncode == 2
    assert b"--arch" in r.stderr


def test_request_trace_is_replayed_as_check_does(tmp_path, env):
    # Issue 29 item 10: `history record` takes a request trace with --capacity, as `check`
    # does: the run recorded is the replay's, the same as recording the replay's own output.
    home, db = env
    req = "tests/data/cli/request_basic.jsonl"
    r = run("history", "record", req, "--capacity", "1GiB", "--run", "r", "--arch", "a",
            "--history", db, home=home)
    assert r.returncode == 0, r.stderr
    sim = tmp_path / "sim.jsonl"
    e = run("replay", req, "--capacity", "1GiB", "--emit", str(sim), "--no-map", home=home)
    assert e.returncode == 0, e.stderr
    r = run("history", "record", str(sim), "--run", "s", "--arch", "a", "--history", db,
            home=home)
    assert r.returncode == 0, r.stderr
    shown = [json.loads(run("history", "show", name, "--history", db, "--json",
                            home=home).stdout) for name in ("r", "s")]
    for key in ("peak_reserved_bytes", "peak_allocated_bytes"):
        assert shown[0][key] == shown[1][key] > 0, key
    bad = run("history", "record", req, "--capacity", "1GiB", "--used-by-others", "2GiB",
              "--run", "t", "--arch", "a", "--history", db, home=home)
    assert bad.returncode == 2 and b"more than --capacity" in bad.stderr


def test_bad_trace_is_refused_and_history_untouched(tmp_path, env):
    home, db = env
    r = run("history", "record", "tests/data/cli/bad_unknown_action.jsonl", "--run", "r",
            "--arch", "a", "--history", db, home=home)
    assert r.returncode == 2
    assert b"bad_unknown_action.jsonl:3" in r.stderr
    assert not db.exists()


def refused_untouched(home, db, trace, what):
    before = db.read_bytes()
    for args in (["record", trace, "--run", "r", "--arch", "a"], ["list"], ["show", "r"],
                 ["forget", "r"], ["compare", trace, "--arch", "a"]):
        r = run("history", *args, "--history", db, home=home)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        err = r.stderr.decode()
        assert str(db) in err and what in err, err
        assert db.read_bytes() == before, args
    assert not os.path.exists(str(db) + "-journal")


def test_garbage_file_is_refused_and_left_byte_identical(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    db.write_bytes(b"this is my thesis, not a database\n" * 200)
    refused_untouched(home, db, trace, "not a SQLite database")


def test_other_apps_database_is_refused_and_left_byte_identical(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE contacts(name TEXT)")
    con.execute("INSERT INTO contacts VALUES ('ada')")
    con.commit()
    con.close()
    refused_untouched(home, db, trace, "another application")


def test_truncated_history_is_refused_and_left_byte_identical(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    for i in range(3):
        r = run("history", "record", trace, "--run", f"r{i}", "--arch", "toy-net", "--history",
                db, home=home)
        assert r.returncode == 0, r.stderr.decode()
    # Grow it quickly with SQLite itself, as another fragscope would have.
    con = sqlite3.connect(db)
    con.executemany(
        "INSERT INTO runs(name, architecture, recorded_unix_s, source, device, steps, "
        "peak_allocated_bytes, peak_reserved_bytes, request_count, request_p50_bytes, "
        "request_p90_bytes, request_p99_bytes, request_max_bytes, num_ooms) "
        "VALUES (?, 'toy-net', 0, 'x', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)",
        [(f"filler-{i:05d}-" + "x" * 100,) for i in range(500)])
    con.commit()
    con.close()
    assert not os.path.exists(str(db) + "-wal") or os.path.getsize(str(db) + "-wal") == 0
    data = db.read_bytes()
    assert len(data) > 40000
    db.write_bytes(data[:len(data) // 2])
    refused_untouched(home, db, trace, "damaged")


def test_default_location_follows_xdg(tmp_path, env):
    home, _ = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    r = run("history", "record", trace, "--run", "r", "--arch", "a", home=home)
    assert r.returncode == 0, r.stderr.decode()
    default = home / ".local" / "state" / "fragscope" / "history.sqlite"
    assert default.exists()
    assert stat.S_IMODE(os.stat(default.parent).st_mode) == 0o700
    assert str(default).encode() in r.stdout

    state = tmp_path / "xdg-state"
    r = run("history", "record", trace, "--run", "r2", "--arch", "a", home=home,
            env={"XDG_STATE_HOME": str(state)})
    assert r.returncode == 0, r.stderr.decode()
    assert (state / "fragscope" / "history.sqlite").exists()
    listed = json.loads(run("history", "list", "--json", home=home,
                            env={"XDG_STATE_HOME": str(state)}).stdout)
    assert [x["run"] for x in listed] == ["r2"]
    # A relative XDG_STATE_HOME is ignored, as the spec says.
    listed = json.loads(run("history", "list", "--json", home=home,
                            env={"XDG_STATE_HOME": "relative/dir"}).stdout)
    assert [x["run"] for x in listed] == ["r"]


def test_history_option_overrides_the_default(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    r = run("history", "record", trace, "--run", "r", "--arch", "a", "--history", db, home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert db.exists()
    assert not (home / ".local").exists()


def test_help_teaches():
    r = run("history", "--help", home="/nonexistent")
    assert r.returncode == 0
    out = r.stdout.decode()
    for word in ("record", "list", "show", "compare", "forget", "Examples:", "XDG_STATE_HOME"):
        assert word in out
    r = run("history", "record", "--help", home="/nonexistent")
    assert b"--replace" in r.stdout and b"Examples:" in r.stdout
    r = run("history", home="/nonexistent")
    assert r.returncode == 2


def record_baseline(tmp_path, home, db, rate=0.001, runs=3, arch="toy-net"):
    for i in range(runs):
        trace = write_trace(tmp_path / f"base{i}.jsonl", rate)
        r = run("history", "record", trace, "--run", f"base{i}", "--arch", arch,
                "--history", db, home=home)
        assert r.returncode == 0, r.stderr.decode()


def test_analyze_forecast_compares_with_the_baseline(tmp_path, env):
    home, db = env
    record_baseline(tmp_path, home, db)
    fast = write_trace(tmp_path / "fast.jsonl", 0.004)
    # The same comparison as check --baseline and history compare.
    r = run("check", fast, "--baseline", "toy-net", "--history", db, "--json", home=home)
    expected = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["baseline"]["detail"]
    assert re.match(r"fragmenting 4\.\d× faster than the last 3 runs of toy-net", expected)
    r = run("history", "compare", fast, "--arch", "toy-net", "--history", db, home=home)
    assert r.stdout.decode().splitlines()[0] == expected

    r = run("analyze", fast, "--forecast", "--baseline", "toy-net", "--history", db,
            "--no-map", home=home)
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    section = out[out.index("Forecast (one verdict every"):]
    assert f"  baseline: {expected}\n" in section

    r = run("analyze", fast, "--forecast", "--baseline", "toy-net", "--history", db,
            "--json", "--no-map", home=home)
    assert r.returncode == 0, r.stderr.decode()
    b = json.loads(r.stdout)["devices"][0]["forecast"]["baseline"]
    assert b["sentence"] == expected
    assert b["architecture"] == "toy-net"
    assert b["baseline_runs"] == 3 and b["has_baseline"] is True
    assert b["growth_ratio"] == pytest.approx(4.0, rel=0.05)  # rates 0.004 vs 0.001

    # --last (as check's) narrows the baseline to the latest runs.
    r = run("analyze", fast, "--forecast", "--baseline", "toy-net", "--history", db, "--last",
            "2", "--json", "--no-map", home=home)
    assert r.returncode == 0, r.stderr.decode()
    b = json.loads(r.stdout)["devices"][0]["forecast"]["baseline"]
    assert b["baseline_runs"] == 2
    assert "the last 2 runs of toy-net" in b["sentence"]

    # A run as fast as its baseline says so; analyze records nothing.
    same = write_trace(tmp_path / "same.jsonl", 0.001)
    r = run("analyze", same, "--forecast", "--baseline", "toy-net", "--history", db,
            "--json", "--no-map", home=home)
    b = json.loads(r.stdout)["devices"][0]["forecast"]["baseline"]
    assert b["sentence"].startswith("fragmenting at the same rate as the last 3 runs of toy-net")
    assert b["growth_ratio"] == pytest.approx(1.0)
    listed = json.loads(run("history", "list", "--json", "--history", db, home=home).stdout)
    assert sorted(x["run"] for x in listed) == ["base0", "base1", "base2"]

    # Without --baseline the key is null.
    r = run("analyze", fast, "--forecast", "--json", "--no-map", home=home)
    assert json.loads(r.stdout)["devices"][0]["forecast"]["baseline"] is None


def test_analyze_baseline_without_history_and_with_a_damaged_one(tmp_path, env):
    home, db = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001)
    r = run("analyze", trace, "--forecast", "--baseline", "toy-net", "--history", db,
            "--no-map", home=home)
    assert r.returncode == 0, r.stderr.decode()
    assert "  baseline: no baseline for toy-net" in r.stdout.decode()
    assert not db.exists()

    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all\n" * 100)
    digest = hashlib.sha256(bad.read_bytes()).hexdigest()
    for extra in ([], ["--json"]):
        r = run("analyze", trace, "--forecast", "--baseline", "toy-net", "--history", bad,
                *extra, home=home)
        assert r.returncode == 2
        assert r.stdout == b""
        assert str(bad) in r.stderr.decode()
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("args,message", [
    (["--baseline", "toy-net"], b"--baseline requires --forecast"),
    (["--forecast", "--history", "h.sqlite"], b"--history requires --baseline"),
])
def test_analyze_baseline_usage(tmp_path, env, args, message):
    home, _ = env
    trace = write_trace(tmp_path / "a.jsonl", 0.001, steps=20)
    r = run("analyze", trace, *args, home=home)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr.decode()
