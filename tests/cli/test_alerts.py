"""`fragscope alerts check` and `fragscope alerts test`: rules files, samples, real hooks.

The exec hook is tests/data/alerts/record_hook.sh, which copies its stdin to ARG.json and
its environment to ARG.env (NUL-separated).
"""

import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
EXAMPLE = os.path.join(SOURCE_DIR, "deploy", "fragscope.toml.example")
RECORD_HOOK = os.path.join(SOURCE_DIR, "tests", "data", "alerts", "record_hook.sh")

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def write_config(tmp_path, rules, exit_status=0):
    out = tmp_path / "hook"
    config = tmp_path / "rules.toml"
    config.write_text(f"""
[hooks.record]
type = "exec"
command = [{json.dumps(RECORD_HOOK)}, {json.dumps(str(out))}, "{exit_status}"]
timeout = "10s"
{rules}
""")
    return config, out


def read_env(path):
    entries = open(path, "rb").read().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


FORECAST_RULE = """
[[rules]]
name = "ForecastCritical"
metric = "forecast_level"
op = ">="
value = "critical"
for = "1m"
severity = "critical"
hooks = ["record"]
"""

SAMPLE = {"pid": 42, "rank": 3, "job": "llama; rm -rf / $(id)", "device_uuid": "GPU-1",
          "forecast_level": "critical", "fragmentation_ratio": 0.6}


def test_check_prints_the_rules_of_the_example():
    r = run("alerts", "check", EXAMPLE)
    assert r.returncode == 0, r.stderr
    assert "8 rule(s):" in r.stdout
    assert "ForecastWarning [warning]: forecast_level >= warning for 1m -> oncall" in r.stdout
    assert "oncall: webhook POST http://127.0.0.1:9095/fragscope (timeout 5s)" in r.stdout
    assert r.stdout.rstrip().endswith(": OK")


def test_check_reports_place_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rules]]\nname = "a"\nmetric = "forecast_level"\nop = ">="\n'
                   'value = "warning"\nfor = 30\n')
    r = run("alerts", "check", str(bad))
    assert r.returncode == 2
    assert r.stderr == (f'fragscope: {bad}:6:7: rules[0].for: expected a duration like "30s", '
                        'got 30\n')
    r = run("alerts", "check", str(tmp_path / "missing.toml"))
    assert r.returncode == 2
    assert "cannot open the alert config" in r.stderr


def test_test_runs_the_hook_with_json_and_environment(tmp_path):
    config, out = write_config(tmp_path, FORECAST_RULE)
    r = run("alerts", "test", str(config), "--sample", json.dumps(SAMPLE))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("pending  ForecastCritical {")
    assert r.stdout.splitlines()[1].startswith("firing   ForecastCritical {")
    assert "recorded ForecastCritical firing" in r.stderr
    alert = json.load(open(f"{out}.json"))
    assert alert["alert"] == "ForecastCritical"
    assert alert["state"] == "firing"
    assert alert["series"]["job"] == SAMPLE["job"]
    assert alert["value"] == 4
    env = read_env(f"{out}.env")
    assert env["FRAGSCOPE_ALERT_NAME"] == "ForecastCritical"
    assert env["FRAGSCOPE_ALERT_JOB"] == SAMPLE["job"]
    assert env["FRAGSCOPE_ALERT_RANK"] == "3"
    assert env["FRAGSCOPE_ALERT_PID"] == "42"


def test_resolve_delivers_the_resolved_notification(tmp_path):
    config, out = write_config(tmp_path, FORECAST_RULE)
    r = run("alerts", "test", str(config), "--sample", json.dumps(SAMPLE), "--resolve")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("resolved ForecastCritical {")
    assert json.load(open(f"{out}.json"))["state"] == "resolved"


def test_dry_run_runs_nothing(tmp_path):
    config, out = write_config(tmp_path, FORECAST_RULE)
    r = run("alerts", "test", str(config), "--sample", json.dumps(SAMPLE), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dry-run: ForecastCritical firing -> hook record: would run " in r.stderr
    assert not os.path.exists(f"{out}.json")


def test_failing_hook_exits_1(tmp_path):
    config, out = write_config(tmp_path, FORECAST_RULE, exit_status=5)
    r = run("alerts", "test", str(config), "--sample", json.dumps(SAMPLE))
    assert r.returncode == 1
    assert "exit 5" in r.stderr


def test_counter_increase_needs_two_samples(tmp_path):
    config, out = write_config(tmp_path, """
[[rules]]
name = "OutOfMemory"
metric = "num_ooms"
increase_over = "5m"
op = ">"
value = 0
hooks = ["record"]
""")
    before = tmp_path / "before.json"
    before.write_text(json.dumps({"pid": 1, "device_uuid": "GPU-1", "num_ooms": 2}))
    after = {"pid": 1, "device_uuid": "GPU-1", "num_ooms": 3}
    r = run("alerts", "test", str(config), "--sample", str(before))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "no rule fires for this sample\n"
    r = run("alerts", "test", str(config), "--sample", str(before), "--sample", json.dumps(after),
            "--interval", "1m")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("firing   OutOfMemory {")
    assert json.load(open(f"{out}.json"))["value"] == 1


def test_gpu_series_from_the_sample_file(tmp_path):
    config, out = write_config(tmp_path, """
[[rules]]
name = "GpuFull"
metric = "gpu_memory_used_ratio"
op = ">"
value = 0.9
hooks = ["record"]
""")
    sample = {"samples": [], "gpus": [{"uuid": "GPU-9", "index": 3,
                                       "memory_total_bytes": 100, "memory_used_bytes": 95}]}
    r = run("alerts", "test", str(config), "--sample", json.dumps(sample))
    assert r.returncode == 0, r.stderr
    env = read_env(f"{out}.env")
    assert env["FRAGSCOPE_ALERT_DEVICE_UUID"] == "GPU-9"
    assert env["FRAGSCOPE_ALERT_GPU"] == "3"
    assert env["FRAGSCOPE_ALERT_VALUE"] == "0.95"


@pytest.mark.parametrize("sample,message", [
    ('{"pid": 1, "forecast_lvl": "ok"}', '"forecast_lvl": unknown field'),
    ('{"pid": -1}', '"pid": out of range'),
    ('{"pid": 1, "forecast_level": "bad"}', '"forecast_level": expected'),
    ('{"pid": 1, "fragmentation_ratio": "x"}', '"fragmentation_ratio": expected a number'),
    ('{"pid": 1,', "not valid JSON"),
    ('{"samples": 3}', '"samples": expected an array'),
    ('{"gpus": [{"index": 1}]}', 'gpus[0]: "uuid": missing'),
    ('/nonexistent/sample.json', "cannot open the sample file"),
])
def test_bad_samples_exit_2(tmp_path, sample, message):
    config, _ = write_config(tmp_path, FORECAST_RULE)
    r = run("alerts", "test", str(config), "--sample", sample)
    assert r.returncode == 2, r.stdout
    assert message in r.stderr
