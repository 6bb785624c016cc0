"""Tests of `fragscope check`, the CI gate, against the built binary.

Allocator traces come from test_history.write_trace (a 64 MiB segment per step whose free
remainder grows at a chosen rate), so peaks and fragmentation have known values; request
traces are the bundled captures; the history databases are made by `fragscope history record`
in temporary directories.
"""

import hashlib
import json
import re

import pytest

from test_forecast import write_leak_trace
from test_history import BIN, SEGMENT, run, write_trace  # noqa: F401  (BIN: skip marker)

pytestmark = pytest.mark.skipif(not BIN, reason="FRAGSCOPE_BIN is not set")

SAMPLE = "tests/data/sample/gpt_tiny_3steps.jsonl.gz"


def check(tmp_path, *args):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return run("check", *args, home=home)


def checks_by_name(stdout):
    report = json.loads(stdout)
    assert report["schema"] == "fragscope.check" and report["version"] == 1
    return report, {c["name"]: c for c in report["checks"]}


def test_passes_within_limits(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 0.001, steps=40)
    r = check(tmp_path, trace, "--max-peak-reserved", f"{40 * SEGMENT}",
              "--max-fragmentation", "0.5")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith("fragscope check: PASS")
    assert "pass  peak_reserved" in out and "pass  fragmentation" in out


def test_each_limit_fails_on_its_own(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 0.004, steps=40)
    # 40 segments of 64 MiB: one byte less than the peak fails the peak check only.
    r = check(tmp_path, trace, "--max-peak-reserved", f"{40 * SEGMENT - 1}", "--json")
    assert r.returncode == 1, r.stderr.decode()
    report, c = checks_by_name(r.stdout)
    assert report["verdict"] == "fail" and report["failed"] == 1
    assert c["peak_reserved"]["outcome"] == "fail"
    assert c["peak_reserved"]["measured"].startswith("2.50 GiB")
    assert c["oom"]["outcome"] == "pass"
    assert c["fragmentation"]["outcome"] == "skipped"

    # The ratio grows to about 0.004/2 * 39 + 2/64 ~ 0.11 at the last step.
    r = check(tmp_path, trace, "--max-fragmentation", "0.05", "--json")
    assert r.returncode == 1
    _, c = checks_by_name(r.stdout)
    assert c["fragmentation"]["outcome"] == "fail"
    # The figure says the moments it is taken from (docs/metrics.md, "Extremes").
    assert c["fragmentation"]["measured"].endswith(
        "at step 39 (over moments with at least 1.25 GiB reserved, half the peak)")
    r = check(tmp_path, trace, "--max-fragmentation", "0.2")
    assert r.returncode == 0, r.stdout.decode()
    # A percentage is the same limit (issue 29 item 11).
    assert check(tmp_path, trace, "--max-fragmentation", "20%").returncode == 0
    assert check(tmp_path, trace, "--max-fragmentation", "5%").returncode == 1


def test_a_bare_percentage_number_teaches_both_spellings(tmp_path):
    r = check(tmp_path, SAMPLE, "--max-fragmentation", "30")
    assert r.returncode == 2
    err = r.stderr.decode()
    assert "--max-fragmentation" in err and "30% or 0.3" in err, err
    r = check(tmp_path, SAMPLE, "--max-fragmentation", "130%")
    assert r.returncode == 2 and "not between 0% and 100%" in r.stderr.decode()


def test_capacity_of_an_allocator_trace(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 0.001, steps=10)
    r = check(tmp_path, trace, "--capacity", f"{10 * SEGMENT}", "--json")
    assert r.returncode == 0
    _, c = checks_by_name(r.stdout)
    assert c["capacity"]["outcome"] == "pass"
    r = check(tmp_path, trace, "--capacity", f"{10 * SEGMENT}", "--used-by-others", "1",
              "--json")
    assert r.returncode == 1
    _, c = checks_by_name(r.stdout)
    assert c["capacity"]["outcome"] == "fail"
    assert "more than the device has" in c["capacity"]["detail"]


def test_request_trace_is_replayed_at_the_capacity(tmp_path):
    r = check(tmp_path, SAMPLE, "--capacity", "200MiB", "--json")
    assert r.returncode == 1, r.stderr.decode()
    report, c = checks_by_name(r.stdout)
    assert report["mode"].startswith("request trace replayed")
    assert c["oom"]["outcome"] == "fail"
    assert c["oom"]["measured"] == "1 OOM at step 0"
    assert c["capacity"]["outcome"] == "skipped"
    assert any("replayed on a device of 200.0 MiB" in n for n in report["notes"])

    r = check(tmp_path, SAMPLE, "--capacity", "1GiB")
    assert r.returncode == 0, r.stdout.decode()
    # Without a capacity the device is unlimited and only the given limits can fail.
    r = check(tmp_path, SAMPLE, "--json")
    assert r.returncode == 0
    report, _ = checks_by_name(r.stdout)
    assert any("unlimited device" in n for n in report["notes"])


def test_snapshot_with_an_oom_fails(tmp_path):
    r = check(tmp_path, "tests/data/cli/snapshot_small.pickle", "--json")
    assert r.returncode == 1, r.stderr.decode()
    report, c = checks_by_name(r.stdout)
    assert report["mode"] == "analyzed"
    assert c["oom"]["outcome"] == "fail"
    assert c["oom"]["detail"].startswith("real shortage")


def test_predicted_oom_fails_the_check(tmp_path):
    # The leak of test_forecast.py: 2 MiB per step on a 1 GiB device, 300 steps. The replay
    # never runs out of memory, but the forecaster warns long before it would.
    write_leak_trace(tmp_path / "leak.jsonl")
    leak = tmp_path / "leak.jsonl"
    r = check(tmp_path, leak, "--fail-at", "warning", "--json")
    assert r.returncode == 1, r.stderr.decode()
    report, c = checks_by_name(r.stdout)
    assert report["verdict"] == "fail" and report["failed"] == 1
    assert c["oom"]["outcome"] == "pass"
    forecast = c["forecast"]
    assert forecast["outcome"] == "fail"
    assert forecast["limit"] == "below warning"
    assert re.match(r"warning at step \d+ \(~\d+ steps to OOM\)$", forecast["measured"])
    assert "steps to OOM" in forecast["detail"]

    r = check(tmp_path, leak, "--fail-at", "warning")
    assert r.returncode == 1, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith("fragscope check: FAIL")
    assert re.search(r"^ *FAIL +forecast ", out, re.M), out
    assert forecast["detail"] in out
    # "Output fits one screen" (docs/check.md): 24 lines at most for one device.
    assert len(out.splitlines()) <= 24, out

    # The default limit (critical) is not reached: the same run passes.
    r = check(tmp_path, leak)
    assert r.returncode == 0, r.stdout.decode()
    assert re.search(r"^ *pass +forecast ", r.stdout.decode(), re.M)


def test_a_check_asked_for_without_its_input_fails_unless_allowed(tmp_path):
    # Without a capacity there is a forecast level but no OOM risk (it needs the device's
    # capacity): the default gate passes, but an explicit --max-oom-risk cannot be judged, and a
    # gate that cannot judge must not pass. (With a capacity, since issue 31's third round, the
    # first step already has a risk: three steps are judged.)
    r = check(tmp_path, SAMPLE, "--json")
    assert r.returncode == 0, r.stdout.decode()
    _, c = checks_by_name(r.stdout)
    assert c["forecast"]["outcome"] == "pass"
    r = check(tmp_path, SAMPLE, "--capacity", "4GiB", "--max-oom-risk", "0.1", "--json")
    assert r.returncode == 0, r.stdout.decode()
    _, c = checks_by_name(r.stdout)
    assert "P(OOM within 100 steps)" in c["forecast"]["measured"], c["forecast"]
    r = check(tmp_path, SAMPLE, "--max-oom-risk", "0.1", "--json")
    assert r.returncode == 1, r.stdout.decode()
    _, c = checks_by_name(r.stdout)
    assert c["forecast"]["outcome"] == "fail"
    assert "gave no OOM risk" in c["forecast"]["detail"]
    assert "--allow-missing" in c["forecast"]["detail"]
    r = check(tmp_path, SAMPLE, "--max-oom-risk", "0.1", "--allow-missing", "--json")
    assert r.returncode == 0, r.stdout.decode()
    _, c = checks_by_name(r.stdout)
    assert c["forecast"]["outcome"] == "pass"  # the level's verdict stands
    assert "skipped (--allow-missing)" in c["forecast"]["detail"]


def test_a_young_tails_risk_does_not_gate(tmp_path):
    # Issue 31, third round: at every step the risk exists from step 0, where one step says
    # nothing of how the demand varies (the bundled 50-step sample on 1 GiB: 53% within 100
    # steps at step 0, a young tail, `watch` at most). Like its level, that number does not
    # gate: the healthy sample passes --max-oom-risk 0.1 at every period.
    for every in ("1", "50"):
        r = check(tmp_path, "tests/data/sample/gpt_tiny_50steps.jsonl.gz", "--capacity", "1GiB",
                  "--max-oom-risk", "0.1", "--forecast-every", every, "--json")
        assert r.returncode == 0, r.stdout.decode()
        _, c = checks_by_name(r.stdout)
        assert c["forecast"]["outcome"] == "pass", c["forecast"]


def test_baseline_regression(tmp_path):
    db = tmp_path / "h.sqlite"
    home = tmp_path / "home"
    home.mkdir()
    for i in range(3):
        trace = write_trace(tmp_path / f"base{i}.jsonl", 0.001, steps=120)
        r = run("history", "record", trace, "--run", f"base{i}", "--arch", "toy",
                "--history", db, home=home)
        assert r.returncode == 0, r.stderr.decode()

    fast = write_trace(tmp_path / "fast.jsonl", 0.004, steps=120)
    r = check(tmp_path, fast, "--baseline", "toy", "--history", db, "--json")
    assert r.returncode == 1, r.stderr.decode()
    _, c = checks_by_name(r.stdout)
    assert c["baseline"]["outcome"] == "fail"
    assert "faster than the last 3 runs of toy" in c["baseline"]["detail"]
    assert c["baseline"]["measured"].startswith("growth 4.0")

    same = write_trace(tmp_path / "same.jsonl", 0.001, steps=120)
    r = check(tmp_path, same, "--baseline", "toy", "--history", db)
    assert r.returncode == 0, r.stdout.decode()
    assert "pass  baseline" in r.stdout.decode()
    # A looser limit lets the fast run pass.
    r = check(tmp_path, fast, "--baseline", "toy", "--history", db, "--max-growth-ratio", "5")
    assert r.returncode == 0, r.stdout.decode()

    # A mistyped label has no runs: the check fails, naming the labels the history knows.
    r = check(tmp_path, same, "--baseline", "tyo", "--history", db, "--json")
    assert r.returncode == 1, r.stdout.decode()
    _, c = checks_by_name(r.stdout)
    assert c["baseline"]["outcome"] == "fail"
    assert "labels with runs: toy" in c["baseline"]["detail"]
    assert "did you mean 'toy'?" in c["baseline"]["detail"]


def test_missing_history_fails_unless_first_run_and_damaged_history_is_refused(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 0.001, steps=30)
    # No history: the gate must not turn itself off.
    r = check(tmp_path, trace, "--baseline", "toy", "--history", tmp_path / "none.sqlite",
              "--json")
    assert r.returncode == 1, r.stderr.decode()
    _, c = checks_by_name(r.stdout)
    assert c["baseline"]["outcome"] == "fail"
    assert c["baseline"]["detail"].startswith("no baseline for toy")
    assert "--allow-new-baseline" in c["baseline"]["detail"]
    assert not (tmp_path / "none.sqlite").exists()
    # A label's first run, said so: passes, the check skipped.
    r = check(tmp_path, trace, "--baseline", "toy", "--history", tmp_path / "none.sqlite",
              "--allow-new-baseline", "--json")
    assert r.returncode == 0, r.stderr.decode()
    _, c = checks_by_name(r.stdout)
    assert c["baseline"]["outcome"] == "skipped"
    assert not (tmp_path / "none.sqlite").exists()
    # --allow-new-baseline means nothing without --baseline.
    r = check(tmp_path, trace, "--allow-new-baseline")
    assert r.returncode == 2

    bad = tmp_path / "bad.sqlite"

    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all\n" * 100)
    digest = hashlib.sha256(bad.read_bytes()).hexdigest()
    r = check(tmp_path, trace, "--baseline", "toy", "--history", bad)
    assert r.returncode == 2
    assert str(bad) in r.stderr.decode()
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("args,message", [
    (["missing.jsonl"], "missing.jsonl"),
    ([SAMPLE, "--max-fragmentation", "2"], "--max-fragmentation"),
    ([SAMPLE, "--capacity", "lots"], "--capacity"),
    ([SAMPLE, "--fail-at", "sometimes"], "--fail-at"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    r = check(tmp_path, *args)
    assert r.returncode == 2
    assert message in r.stderr.decode()
