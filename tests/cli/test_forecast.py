"""CLI tests of `fragscope analyze --forecast` (docs/forecast.md), run against the built binary.

The traces are written by the tests themselves (a request trace that leaks 2 MiB per step on a
1 GiB device, and the allocator trace `fragscope replay --emit` makes of it), into a temporary
directory the binary runs in, so the goldens hold relative names only.
FRAGSCOPE_UPDATE_GOLDEN=1 rewrites the goldens, as for test_analyze.py.
"""

import json
import os
import random

import pytest

from test_analyze import BIN, DATA, SOURCE_DIR, check_golden, run

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")

MIB = 1 << 20
GIB = 1 << 30


def write_leak_trace(path, steps=300, capacity=GIB, with_steps=True):
    """A request trace: per step 2 MiB that is never freed and a 100 MiB activation."""
    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "producer": "tests/cli/test_forecast.py",
              "devices": [{"device": 0, "name": "virtual", "capacity_bytes": capacity}]}
    lines = [json.dumps(header)]
    next_id = 0
    for step in range(steps):
        if with_steps:
            lines.append(json.dumps({"action": "step", "step": step}))
        next_id += 1
        lines.append(json.dumps({"action": "alloc", "addr": next_id, "size": 2 * MIB}))
        next_id += 1
        lines.append(json.dumps({"action": "alloc", "addr": next_id, "size": 100 * MIB}))
        lines.append(json.dumps({"action": "free_requested", "addr": next_id}))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def leak(tmp_path):
    write_leak_trace(tmp_path / "leak.jsonl")
    return tmp_path


@pytest.fixture
def leak_allocator(leak):
    result = run("replay", "leak.jsonl", "--emit", "leak_sim.jsonl", cwd=leak)
    assert result.returncode == 0, result.stderr.decode()
    return leak


def test_request_trace_forecast_golden(leak):
    result = run("analyze", "leak.jsonl", "--forecast", "--forecast-every", "10", cwd=leak)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    check_golden("forecast_leak_request.txt", result.stdout.decode("utf-8"))


def test_allocator_trace_forecast_golden(leak_allocator):
    result = run("analyze", "leak_sim.jsonl", "--forecast", "--no-map", cwd=leak_allocator)
    assert result.returncode == 0, result.stderr.decode()
    check_golden("forecast_leak_allocator.txt", result.stdout.decode("utf-8"))


def test_allocator_trace_forecast_json_golden(leak_allocator):
    result = run("analyze", "leak_sim.jsonl", "--forecast", "--forecast-every", "1", "--json",
                 "--no-map", cwd=leak_allocator)
    assert result.returncode == 0, result.stderr.decode()
    doc = json.loads(result.stdout)
    f = doc["devices"][0]["forecast"]
    check_golden("forecast_leak_allocator.json",
                 json.dumps(f, indent=2, sort_keys=True) + "\n")


def test_json_forecast_object(leak_allocator):
    result = run("analyze", "leak_sim.jsonl", "--forecast", "--json", "--no-map",
                 cwd=leak_allocator)
    assert result.returncode == 0, result.stderr.decode()
    f = json.loads(result.stdout)["devices"][0]["forecast"]
    assert f["unit"] == "step"
    assert f["every"] == 50
    assert f["enough_data"] is True
    assert f["steps_covered"] == 300
    assert f["samples"] == 6
    # 2 MiB per step leaks toward 1 GiB / 1.10: a warning comes, and it comes long before.
    assert f["first_warning_step"] is not None and f["first_warning_step"] < 300
    assert f["worst_level"] in ("warning", "critical")
    levels = ["unknown", "ok", "watch", "warning", "critical"]
    for change in f["changes"]:
        assert change["level"] in levels
        assert isinstance(change["reason"], str) and change["reason"]
    for a, b in zip(f["changes"], f["changes"][1:]):
        assert a["level"] != b["level"] and a["step"] < b["step"]


def test_every_one_and_fifty_agree_within_a_period(leak_allocator):
    first = {}
    for every in ("1", "50"):
        result = run("analyze", "leak_sim.jsonl", "--forecast", "--forecast-every", every,
                     "--json", "--no-map", cwd=leak_allocator)
        assert result.returncode == 0, result.stderr.decode()
        first[every] = json.loads(result.stdout)["devices"][0]["forecast"]["first_warning_step"]
    assert first["1"] is not None and first["50"] is not None
    assert abs(first["1"] - first["50"]) <= 50, first


def test_without_forecast_the_json_key_is_null(leak):
    result = run("analyze", "leak.jsonl", "--json", cwd=leak)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["devices"][0]["forecast"] is None


def test_thresholds_change_the_verdict(leak_allocator):
    # With warnings only at <= 0 steps to OOM, the leak never reaches "warning" in 300 steps.
    result = run("analyze", "leak_sim.jsonl", "--forecast", "--json", "--no-map",
                 "--forecast-warning-steps", "0", "--forecast-critical-steps", "0",
                 cwd=leak_allocator)
    assert result.returncode == 0, result.stderr.decode()
    f = json.loads(result.stdout)["devices"][0]["forecast"]
    assert f["first_warning_step"] is None


def test_single_step_says_not_enough_data(tmp_path):
    write_leak_trace(tmp_path / "one.jsonl", steps=1)
    result = run("analyze", "one.jsonl", "--forecast", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    f = json.loads(result.stdout)["devices"][0]["forecast"]
    assert f["enough_data"] is False
    assert f["last"] is None and f["changes"] == []
    assert f["notes"][0].startswith("not enough data: 1 step")
    text = run("analyze", "one.jsonl", "--forecast", cwd=tmp_path)
    assert b"note: not enough data: 1 step" in text.stdout


def test_empty_trace_does_not_crash(tmp_path):
    write_leak_trace(tmp_path / "empty.jsonl", steps=0)
    result = run("analyze", "empty.jsonl", "--forecast", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert b"note: not enough data for a forecast: no device had an event" in result.stdout
    result = run("analyze", "empty.jsonl", "--forecast", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["devices"] == []
    assert any(n.startswith("not enough data for a forecast") for n in report["notes"])
    # Without --forecast nothing is said about one.
    result = run("analyze", "empty.jsonl", "--json", cwd=tmp_path)
    assert not any("forecast" in n for n in json.loads(result.stdout)["notes"])


def write_retry_trace(path, steps=30, capacity=GIB):
    """A request trace that makes the allocator release its cache and retry at every step:
    step i allocates and frees one block of 600 + 10 i MiB. The block cached from step i - 1
    is too small for it, and cudaMalloc of the new size fails while that block is held
    (600 + 610 MiB > 1 GiB), so the allocator frees its cached segments and tries again."""
    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "producer": "tests/cli/test_forecast.py",
              "devices": [{"device": 0, "name": "virtual", "capacity_bytes": capacity}]}
    lines = [json.dumps(header)]
    for step in range(steps):
        lines.append(json.dumps({"action": "step", "step": step}))
        lines.append(json.dumps({"action": "alloc", "addr": step + 1,
                                 "size": (600 + 10 * step) * MIB}))
        lines.append(json.dumps({"action": "free_requested", "addr": step + 1}))
    path.write_text("\n".join(lines) + "\n")


def test_replay_timeline_counts_the_simulators_retries(tmp_path):
    write_retry_trace(tmp_path / "retry.jsonl")
    result = run("replay", "retry.jsonl", "--json", "--no-map", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    j = json.loads(result.stdout)
    retries = j["devices"][0]["memory_stats"]["num_alloc_retries"]
    assert retries > 0
    timeline = j["analysis"]["devices"][0]["timeline"]
    assert all(s["alloc_retries"] is not None for s in timeline)
    # Every retry the simulator counted is in exactly one timeline row.
    assert sum(s["alloc_retries"] for s in timeline) == retries
    # The allocator trace the replay writes does not record retries: unknown, not 0.
    result = run("replay", "retry.jsonl", "--emit", "retry_sim.jsonl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    result = run("analyze", "retry_sim.jsonl", "--json", "--no-map", cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    timeline = json.loads(result.stdout)["devices"][0]["timeline"]
    assert all(s["alloc_retries"] is None for s in timeline)


def test_replayed_retries_reach_the_forecast(tmp_path):
    write_retry_trace(tmp_path / "retry.jsonl")
    result = run("check", "retry.jsonl", "--fail-at", "watch", "--forecast-every", "1",
                 "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr.decode()
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["oom"]["outcome"] == "pass"
    forecast = checks["forecast"]
    assert forecast["outcome"] == "fail"
    assert forecast["measured"].startswith("watch at step ")
    assert "allocation retr" in forecast["detail"], forecast["detail"]
    assert "released cached segments and retried" in forecast["detail"]


def test_without_step_markers_falls_back_to_windows(tmp_path):
    write_leak_trace(tmp_path / "nosteps.jsonl", with_steps=False)
    result = run("analyze", "nosteps.jsonl", "--forecast", "--every", "3", "--json",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    f = json.loads(result.stdout)["devices"][0]["forecast"]
    assert f["unit"] == "window"
    assert any(n.startswith("no step markers") for n in f["notes"])
    text = run("analyze", "nosteps.jsonl", "--forecast", "--every", "3", cwd=tmp_path)
    assert b"no step markers: the forecast counts each timeline window as one step" in text.stdout


def test_unknown_capacity_is_said(tmp_path):
    result = run("analyze", f"{SOURCE_DIR}/{DATA}/request_basic.jsonl", "--forecast",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert b"device capacity unknown" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--forecast-every", "5"], b"--forecast-every requires --forecast"),
    (["--forecast", "--forecast-every", "0"], b"--forecast-every"),
    (["--forecast", "--forecast-fragmentation", "1.5"], b"--forecast-fragmentation"),
    (["--forecast", "--forecast-warning-steps", "10"], b"--forecast: steps-to-OOM thresholds"),
    (["--forecast", "--forecast-allowance", "0.5"], b"--forecast-allowance"),
])
def test_bad_forecast_options(leak, args, message):
    result = run("analyze", "leak.jsonl", *args, cwd=leak)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr.decode()


def test_help_teaches_forecast():
    result = run("analyze", "--help")
    assert result.returncode == 0
    assert b"--forecast " in result.stdout and b"--forecast-every" in result.stdout
    assert b"docs/forecast.md" in result.stdout


SAMPLE = "tests/data/sample/gpt_tiny_50steps.jsonl.gz"


@pytest.mark.parametrize("every", ["1", "50"])
def test_the_sample_at_its_healthy_capacity_is_ok(tmp_path, every):
    # Issue 29 item 3: the bundled sample caches 81-100% of what it reserves at every step's
    # end, on a 1 GiB device where it fits with room to spare. A ratio alone is information:
    # replay's forecast and the report's are "ok" at every sample. The ratio sets a level only
    # against a threshold given on the command line.
    r = run("replay", SAMPLE, "--capacity", "1GiB", "--forecast", "--forecast-every", every,
            "--json", "--no-map")
    assert r.returncode == 0, r.stderr.decode()
    dev = json.loads(r.stdout)["analysis"]["devices"][0]
    assert max(row["fragmentation_ratio"] for row in dev["timeline"]) > 0.8  # the premise
    f = dev["forecast"]
    # Since issue 31's third round the risk exists from step 0, where one step says nothing of
    # how the demand varies: its first steps may be `watch` (a young tail, never more), not later.
    young = [c for c in f["changes"] if c["level"] != "ok"]
    assert all(c["level"] == "watch" and c["step"] < 40 and "a young tail" in c["reason"]
               for c in young), f["changes"]
    assert f["last"]["level"] == "ok" or f["last"]["reason"].startswith("held at watch"), f["last"]
    if every != "1":
        assert f["worst_level"] == "ok", f["changes"]
    out = tmp_path / "report.html"
    r = run("report", SAMPLE, "--capacity", "1GiB", "--forecast", "--forecast-every", every,
            "-o", str(out))
    assert r.returncode == 0, r.stderr.decode()
    page = out.read_text().replace(" ", "")
    assert f'"worst":"{f["worst_level"]}"' in page
    if not young:
        assert '"level":"watch"' not in page
    # (Sampled every 50 steps the one sample ends with nothing allocated: no ratio to judge.)
    if every != "1":
        return
    asked = run("replay", SAMPLE, "--capacity", "1GiB", "--forecast", "--forecast-every", every,
                "--forecast-fragmentation", "0.3", "--json", "--no-map")
    assert json.loads(asked.stdout)["analysis"]["devices"][0]["forecast"]["worst_level"] == "watch"


def test_a_leak_still_warns_with_the_ratio_left_out(leak_allocator):
    r = run("analyze", "leak_sim.jsonl", "--forecast", "--forecast-every", "1", "--json",
            "--no-map", cwd=leak_allocator)
    f = json.loads(r.stdout)["devices"][0]["forecast"]
    assert f["worst_level"] in ("warning", "critical"), f["last"]
    assert f["first_warning_step"] is not None


def write_varlen_trace(path, seed, steps=400, scale=64):
    """A decoder-like request trace with variable shapes: 384 MiB of weights, then per step the
    activations of a random sequence length L = 16 + Exp(mean 40) (at most 320): four tensors
    of L x 768 KiB and one attention score tensor of L^2 x 3 KiB (up to 300 MiB)."""
    rng = random.Random(seed)
    header = {"format": "fragscope-trace", "version": 1, "kind": "request",
              "producer": "tests/cli/test_forecast.py"}
    lines = [json.dumps(header)]
    next_id = 0
    for _ in range(4):
        next_id += 1
        lines.append(json.dumps({"action": "alloc", "addr": next_id, "size": scale * 1536 * 1024}))
    for step in range(steps):
        lines.append(json.dumps({"action": "step", "step": step}))
        length = min(int(16 + rng.expovariate(1 / 40)), 320)
        live = []
        for size in [length * scale * 12 * 1024] * 4 + [length * length * scale * 48]:
            next_id += 1
            lines.append(json.dumps({"action": "alloc", "addr": next_id, "size": size}))
            live.append(next_id)
        for i in reversed(live):
            lines.append(json.dumps({"action": "free_requested", "addr": i}))
    path.write_text("\n".join(lines) + "\n")


def replay_json(path, capacity, *extra):
    r = run("replay", str(path), "--capacity", str(capacity), "--json", "--no-map", *extra)
    assert r.returncode in (0, 1), r.stderr.decode()  # 1: the replay ran out of memory
    return json.loads(r.stdout)


def smallest_fit(trace):
    """The smallest capacity (to 1 MiB) at which the replay of `trace` does not run out."""
    low, high = MIB, 16 * GIB
    while high - low > MIB:
        mid = (low + high) // 2
        if replay_json(trace, mid)["oom"]:
            low = mid
        else:
            high = mid
    return high


VARLEN_SEEDS = range(1, 21)  # every seed of the range: no picking


def test_issue31_a_variable_shape_trace_at_99_percent_is_warned_well_before(tmp_path):
    # Issue 31's done-when: `replay --forecast` at 99% of the capacity a variable-shape trace
    # needs warns well before the OOM at the default period (every 50). Over every seed of
    # VARLEN_SEEDS: of the seeds whose OOM comes after step 60 (a 20-step lead from the sample
    # at step 49 is possible from step 69), at least 80% are warned >= 20 steps before it. The
    # per-seed figures are printed (pytest -s) and recorded in docs/benchmarks.md ("Held-out
    # test set, third round"); this generator is not the test set.
    rows, late, in_time = [], 0, 0
    for seed in VARLEN_SEEDS:
        trace = tmp_path / f"varlen{seed}.jsonl"
        write_varlen_trace(trace, seed)
        d = replay_json(trace, int(0.99 * smallest_fit(trace)), "--forecast")
        forecast = d["analysis"]["devices"][0]["forecast"]
        assert forecast["every"] == 50
        oom_step = d["oom"]["step"] if d["oom"] else None
        first = forecast["first_warning_step"]
        warned = oom_step is not None and first is not None and first <= oom_step - 20
        if oom_step is not None and oom_step > 60:
            late += 1
            in_time += warned
        if warned:
            reason = next(c for c in forecast["changes"] if c["step"] == first)["reason"]
            assert "P(OOM within" in reason or "steps to OOM" in reason, reason
        # The cache's measured overhead and where it comes from (issue 31, third round).
        overhead = forecast["last"]["risk"]["overhead"]
        assert overhead["ratio"] >= 1.10 and overhead["ratio"] >= overhead["measured_ratio"] - 1e-9
        assert overhead["measured_ratio"] == pytest.approx(
            overhead["reserved_bytes"] / overhead["demand_bytes"], rel=1e-6)
        assert 0 <= overhead["step"] <= forecast["last"]["step"]
        rows.append(f"seed {seed}: OOM at {oom_step}, first warning {first}, "
                    f"lead {None if oom_step is None or first is None else oom_step - first}"
                    f"{'' if warned else ' (not >= 20)'}")
    print("\n".join(rows))
    assert late >= 10, rows  # the premise: most seeds fail late enough for a lead
    assert in_time >= 0.8 * late, (in_time, late, rows)
