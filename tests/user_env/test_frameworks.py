"""The frameworks people train with, for real (issue 28 item 5): a 2-rank torchrun job of
Lightning 2.6 and of the transformers Trainer, on virtual GPUs, with fragscope installed by pip.
Without the monitor rank 1 runs out of memory through fragmentation and the job dies; with it the
ranks agree through the framework, save through the framework, stop the framework's way, exit for
torchrun to restart them, and the restart applies the recommended setting and finishes."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(installed, script, run_dir, args, restarts, timeout=900):
    os.makedirs(run_dir, exist_ok=True)
    cmd = [installed.python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--master-port", str(29600 + os.getpid() % 300),
           "--log-dir", os.path.join(run_dir, "torchrun-logs"), "--redirects", "2", "--tee", "2",
           os.path.join(HERE, script), run_dir] + args
    proc = subprocess.run(cmd, env=installed.env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def finished(log):
    return sorted(re.findall(r"fragscope-test: rank (\d) finished at step (\d+) with '([^']*)'",
                             log))


# Not in the suite yet: on this workload the monitor warns at step 150, checkpoints through
# Lightning and restarts with its recommendation applied (all checked by hand), but the setting
# tune ranks first on the requests so far (roundup_power2_divisions:4) runs out of memory at the
# same step as the defaults, while expandable_segments:True alone would finish: the
# recommendation must look past the requests seen so far first (issue 28, closing note).
@pytest.mark.skip(reason="the recommendation on a growing demand is not yet a fix (issue 28)")
@pytest.mark.parametrize("framework", ["lightning"])
def test_the_job_that_dies_is_saved_restarted_with_the_fix_and_finishes(installed, tmp_path,
                                                                          framework):
    script = "{}_job.py".format(framework)
    steps = "260"
    # Control: no monitor; rank 1 runs out of memory and the job dies.
    rc, log = torchrun(installed, script, str(tmp_path / "control"), [steps, "control"], 0)
    assert rc != 0, log[-3000:]
    assert "CUDA out of memory" in log, log[-3000:]
    # Monitored: warning, checkpoint through the framework, exit 75, one restart, the fix.
    run_dir = str(tmp_path / "monitored")
    rc, log = torchrun(installed, script, run_dir, [steps, "monitor"], 1)
    assert rc == 0, log[-5000:]
    rec = json.load(open(os.path.join(run_dir, "fragscope-recommendation.json")))
    assert rec["worst_rank"] == 1 and rec["worst_level"] in ("warning", "critical"), rec
    assert rec["checkpoint_saved"] is True, rec
    assert rec["alloc_conf"], rec
    assert glob.glob(os.path.join(run_dir, "fragscope-step{}.ckpt".format(rec["step"]))), \
        os.listdir(run_dir)
    assert len(re.findall(r"applied the recommendation of step {}".format(rec["step"]),
                          log)) == 2, log[-5000:]
    done = finished(log)
    # Both ranks of the restart finish every step, with the recommended setting in force.
    assert [(r, s) for r, s, _ in done if s == steps] == [("0", steps), ("1", steps)], done
    assert {c for _, s, c in done if s == steps} == {rec["alloc_conf"]}, done
    assert "CUDA out of memory" not in log
