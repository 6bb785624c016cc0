"""The live loop end to end (issue 22, docs/live-monitoring.md): tools/live_incident.py runs a
2-rank torchrun job (gloo, CPU), each rank on a virtual GPU, rank 1 with the longer sequences.
Without the monitor rank 1 runs out of memory at step N and the job dies; with it, the ranks
agree on the warning before N, both checkpoint at the same step, torchrun restarts them, the
recommended PYTORCH_CUDA_ALLOC_CONF is applied and the job resumes and finishes."""
import json
import os
import shutil
import subprocess

import pytest

import conftest

pytest.importorskip("torch")
try:
    from fragscope import _native
    _native.load()
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)

STEPS = 380


def test_monitor_saves_the_job_that_otherwise_dies(tmp_path):
    # Through tools/demo_cluster.py (the node daemon and a real Prometheus with deploy/'s
    # rules around tools/live_incident.py) where Prometheus is installed (tools/install-deps.sh
    # installs it), so the job alert is checked too; live_incident.py alone elsewhere.
    prometheus = shutil.which("prometheus")
    if prometheus:
        cmd = [conftest.PYTHON, os.path.join(conftest.TOOLS_DIR, "demo_cluster.py"),
               "--bin", conftest.fragscope_bin()]
    else:
        cmd = [conftest.PYTHON, os.path.join(conftest.TOOLS_DIR, "live_incident.py")]
    out = subprocess.run(
        cmd + ["--out", str(tmp_path), "--ranks", "2", "--oom-rank", "1", "--steps", str(STEPS)],
        env=conftest.subprocess_env(), capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    facts = {k: v for k, v in summary.items() if k not in ("timeline", "recommendation")}
    assert out.returncode == 0, (facts, out.stderr[-3000:])
    # Without the monitor's action: rank 1's OOM kills the job at step N.
    n = summary["control_oom_step"]
    assert summary["control_oom_rank"] == 1 and n is not None and n < STEPS - 1, facts
    assert summary["control_exit_code"] != 0
    # With it: the warning comes at least 20 steps before N, from rank 1 ...
    assert summary["warning_step"] is not None and summary["warning_step"] <= n - 20, facts
    assert summary["warning_rank"] == 1
    # ... every rank checkpoints at that same step, torchrun restarts once ...
    assert summary["checkpoint_steps"] == [summary["warning_step"]] * 2, facts
    assert summary["restarts"] == 1
    # ... the restart applies the recommendation, resumes and finishes without an OOM.
    assert summary["alloc_conf_applied"] == summary["recommendation"]["alloc_conf"] != ""
    assert summary["ooms_monitored"] == 0
    assert summary["finished"] is True and summary["final_step"] == STEPS - 1, facts
    # The resumed ranks started after the checkpoint, not from 0.
    resumed = [json.loads(line) for r in (0, 1)
               for line in (tmp_path / "monitored" / "events-rank{}.jsonl".format(r)).open()
               if '"resume"' in line]
    assert sorted(e["step"] for e in resumed) == [summary["warning_step"] + 1] * 2
    if prometheus:
        # Prometheus fired the job alert on the job's worst rank.
        assert summary["alert_firing"] is True, summary["prometheus_alerts"]
        assert summary["alert_rank"] == 1, summary["prometheus_alerts"]


def test_a_failed_checkpoint_on_one_rank_stops_no_rank(tmp_path):
    # Rank 1's checkpoint raises at the warning: no rank claims a checkpoint or exits, so
    # torchrun restarts nothing and the job runs on to its end (it is short of the OOM here).
    import sys
    sys.path.insert(0, conftest.TOOLS_DIR)
    import live_incident
    steps = 200
    run_dir, rc, _ = live_incident.run_phase(
        "failing", str(tmp_path), 2,
        ["--steps", str(steps), "--oom-rank", "1", "--monitor", "--fail-checkpoint-rank", "1"],
        1, {}, 600)
    events = live_incident.read_events(run_dir)
    assert rc == 0, open(os.path.join(run_dir, "torchrun.log")).read()[-3000:]
    # Nothing claimed: no recommendation is written, so the run directory stays armed.
    assert not os.path.exists(os.path.join(run_dir, "fragscope-recommendation.json"))
    assert max(e["restart"] for e in events) == 0
    assert sorted(e["step"] for e in events if e["event"] == "finished") == [steps - 1] * 2


def test_a_rank_that_dies_does_not_hang_the_others(tmp_path):
    # Rank 1 dies just before a sample; rank 0 enters the monitor's all_reduce alone. torchrun
    # sees the dead worker, stops the group and restarts it; the job then finishes.
    import sys
    import time
    sys.path.insert(0, conftest.TOOLS_DIR)
    import live_incident
    steps = 60
    started = time.time()
    run_dir, rc, _ = live_incident.run_phase(
        "dying", str(tmp_path), 2,
        ["--steps", str(steps), "--monitor", "--every", "10", "--die-rank", "1",
         "--die-step", "30"], 1, {}, 300)
    events = live_incident.read_events(run_dir)
    assert rc == 0, open(os.path.join(run_dir, "torchrun.log")).read()[-3000:]
    assert [e["step"] for e in events if e["event"] == "died"] == [30]
    assert max(e["restart"] for e in events) == 1
    assert sorted(e["step"] for e in events if e["event"] == "finished") == [steps - 1] * 2
    assert time.time() - started < 240
