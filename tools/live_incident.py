"""The live-loop incident, end to end (docs/live-monitoring.md): a torchrun job of CPU ranks
(gloo), each on a virtual GPU, one of which runs out of memory through fragmentation.

1. control: without the monitor (--max-restarts 0): the OOM rank dies at step N and kills the job;
2. monitored: with fragscope.torch.Monitor (--max-restarts 1, FRAGSCOPE_APPLY_RECOMMENDATION=1):
   the ranks agree on the warning, all checkpoint at the same step and exit 75, torchrun
   restarts them, the recommended PYTORCH_CUDA_ALLOC_CONF is applied, the job resumes from the
   checkpoints and finishes.

Writes <out>/summary.json: control_oom_step, control_oom_rank, warning_step, checkpoint_steps
(one per rank), restarts, alloc_conf_applied, finished, final_step, and the timeline per rank.
Exit 0 when the monitored job finished, 1 otherwise.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "live_incident_job.py")


def read_events(run_dir):
    events = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events-rank*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            events.extend(json.loads(line) for line in f if line.strip())
    return events


def run_phase(name, out, ranks, job_args, max_restarts, extra_env, timeout):
    run_dir = os.path.join(out, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("FRAGSCOPE_VIRTUAL_GPU", None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra_env)
    # torchrun as `python -m torch.distributed.run`; PyTorch 1.13 knows only the underscore
    # spellings of the options (2.x accepts both). Its --redirects/--tee default "0" parses to
    # None under Python 3.11 (IntFlag iteration skips the zero member) and torchrun crashes:
    # "2" (stderr to a log file, teed to ours) works with every version.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2",
           "--log_dir", os.path.join(run_dir, "torchrun-logs"), "--nproc_per_node", str(ranks),
           "--max_restarts", str(max_restarts), "--master_port",
           str(29500 + os.getpid() % 1000), JOB, "--run-dir", run_dir] + job_args
    started = time.time()
    with open(os.path.join(run_dir, "torchrun.log"), "wb") as log:
        rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    return run_dir, rc, time.time() - started


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/live-incident")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--oom-rank", type=int, default=1)
    p.add_argument("--steps", type=int, default=380)
    p.add_argument("--growth", type=int, default=8)
    p.add_argument("--capacity", default="48MiB")
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--timeout", type=float, default=600, help="seconds per phase")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    job_args = ["--steps", str(args.steps), "--oom-rank", str(args.oom_rank), "--growth",
                str(args.growth), "--capacity", args.capacity, "--every", str(args.every)]

    control_dir, control_rc, control_s = run_phase("control", args.out, args.ranks, job_args, 0,
                                                   {}, args.timeout)
    control = read_events(control_dir)
    ooms = [e for e in control if e["event"] == "oom"]
    oom = min(ooms, key=lambda e: e["step"]) if ooms else None

    mon_dir, mon_rc, mon_s = run_phase("monitored", args.out, args.ranks,
                                       job_args + ["--monitor"], 1,
                                       {"FRAGSCOPE_APPLY_RECOMMENDATION": "1"}, args.timeout)
    events = read_events(mon_dir)
    rec = None
    try:
        with open(os.path.join(mon_dir, "fragscope-recommendation.json"), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        pass
    checkpoints = {}
    for e in events:
        if e["event"] == "checkpoint":
            checkpoints.setdefault(e["rank"], e["step"])
    restarts = max((e["restart"] for e in events), default=0)
    starts_after = [e for e in events if e["event"] == "start" and e["restart"] > 0]
    applied = sorted({e["applied"] for e in starts_after if e.get("applied")})
    finished = [e for e in events if e["event"] == "finished"]
    timeline = {}  # rank -> [step, level, P(OOM within 100 steps) or None]
    for e in events:
        if e["event"] == "sample":
            timeline.setdefault(str(e["rank"]), []).append(
                [e["step"], e["level"], e.get("risk100")])
        elif e["event"] == "checkpoint":  # the monitor's action (it exits inside step())
            timeline.setdefault(str(e["rank"]), []).append([e["step"], "checkpoint", None])
    summary = {
        "ranks": args.ranks,
        "control_oom_step": oom["step"] if oom else None,
        "control_oom_rank": oom["rank"] if oom else None,
        "control_exit_code": control_rc,
        "warning_step": rec["step"] if rec else None,
        "warning_rank": rec["worst_rank"] if rec else None,
        "recommendation": rec,
        "checkpoint_steps": [checkpoints.get(r) for r in range(args.ranks)],
        "restarts": restarts,
        "alloc_conf_applied": applied[0] if len(applied) == 1 else (applied or None),
        "ooms_monitored": sum(1 for e in events if e["event"] == "oom"),
        "finished": len(finished) == args.ranks and mon_rc == 0,
        "final_step": min((e["step"] for e in finished), default=None),
        "monitored_exit_code": mon_rc,
        "seconds": {"control": round(control_s, 1), "monitored": round(mon_s, 1)},
        "timeline": timeline,
    }
    path = os.path.join(args.out, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    short = {k: v for k, v in summary.items() if k not in ("timeline", "recommendation")}
    print(json.dumps(short, indent=1))
    print("wrote", path)
    return 0 if summary["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
