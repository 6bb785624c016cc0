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


def torchrun(installed, script, run_dir, args, restarts, env=None, timeout=900):
    os.makedirs(run_dir, exist_ok=True)
    cmd = [installed.python, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           # A fresh rendezvous store per attempt: without it a restart of torch >= 2.5 can
           # read the last attempt's addresses and fail to connect (docs/live-monitoring.md).
           "--max-restarts", str(restarts), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:{}".format(29600 + os.getpid() % 300),
           "--log-dir", os.path.join(run_dir, "torchrun-logs"), "--redirects", "2", "--tee", "2",
           os.path.join(HERE, script), run_dir] + args
    # PYTHONFAULTHANDLER: a rank that aborts prints every thread's Python stack into the log.
    env = dict(env or {}, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.run(cmd, env=installed.env(**env), capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def finished(log):
    return sorted(re.findall(r"fragscope-test: rank (\d) finished at step (\d+) with '([^']*)'",
                             log))


@pytest.mark.parametrize("script,package,checkpoint", [
    ("lightning_job.py", "lightning", "fragscope-step{}.ckpt"),  # trainer.save_checkpoint
    # The same job on the older package name; its control run is the one above.
    ("lightning_job.py", "pytorch_lightning", "fragscope-step{}.ckpt"),
    # control.should_save. It failed intermittently until 2026-11-29: the teardown of a gloo
    # run aborted (SIGABRT, "terminate called without an active exception") after the monitor's
    # exit or the job's end (PyTorch issue #190489); the monitor's exit now skips that
    # teardown, and the job scripts end with destroy_process_group and os._exit(0).
    ("huggingface_job.py", "transformers", "checkpoint-{}"),
])
def test_the_job_that_dies_is_saved_restarted_with_the_fix_and_finishes(installed, first_use,
                                                                          tmp_path, script,
                                                                          package, checkpoint):
    env = {"FRAGSCOPE_TEST_LIGHTNING": package}
    steps = "260"
    if package != "pytorch_lightning":
        # Control: no monitor; rank 1 runs out of memory and the job dies.
        rc, log = torchrun(installed, script, str(tmp_path / "control"), [steps, "control"], 0,
                           env)
        assert rc != 0, log[-3000:]
        assert "CUDA out of memory" in log, log[-3000:]
    # Monitored: warning, checkpoint through the framework, exit 75, one restart, the fix.
    run_dir = str(tmp_path / "monitored")
    rc, log = torchrun(installed, script, run_dir, [steps, "monitor"], 1, env)
    assert rc == 0, log[-5000:]
    rec = json.load(open(os.path.join(run_dir, "fragscope-recommendation.json")))
    assert rec["worst_rank"] == 1 and rec["worst_level"] in ("warning", "critical"), rec
    assert rec["checkpoint_saved"] is True, rec
    assert rec["alloc_conf"], rec
    assert glob.glob(os.path.join(run_dir, checkpoint.format(rec["step"]))), \
        os.listdir(run_dir)
    assert len(re.findall(r"applied the recommendation of step {}".format(rec["step"]),
                          log)) == 2, log[-5000:]
    done = finished(log)
    # Both ranks of the restart finish every step, with the recommended setting in force.
    assert [(r, s) for r, s, _ in done if s == steps] == [("0", steps), ("1", steps)], done
    assert {c for _, s, c in done if s == steps} == {rec["alloc_conf"]}, done
    assert "CUDA out of memory" not in log
