"""make demo-cluster: the live-loop incident with 8 CPU ranks, the node daemon and Prometheus
(docs/live-monitoring.md, "The incident, end to end").

Starts `fragscope serve` (agent socket and /metrics in --out), a real Prometheus scraping it
every second with deploy/prometheus/alerts.yml, then tools/live_incident.py with 8 ranks on
virtual GPUs, rank 3 with the longest sequences: the control run dies of rank 3's OOM, the
monitored run checkpoints every rank at the same step, restarts with the recommended setting
and finishes. Prints a text timeline per rank and the alerts Prometheus saw, and writes
<out>/summary.json (live_incident.py's keys plus "prometheus_alerts", "alert_firing": whether
the job alert FragscopeJobRankAtRisk fired, and "alert_rank": the rank it named). Exits 0 when
the job finished and the alert fired.
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB_ALERT = "FragscopeJobRankAtRisk"  # deploy/prometheus/alerts.yml: the job's worst rank
LETTER = {"unknown": "?", "ok": ".", "watch": "w", "warning": "W", "critical": "C",
          "checkpoint": "S"}


def wait_for(pattern, path, proc, what, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(path, errors="replace") as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    with open(path, errors="replace") as f:
        raise SystemExit("demo-cluster: {} did not start:\n{}".format(what, f.read()[-2000:]))


def risk_digit(point):
    """One character for a timeline point [step, level, risk]: the risk in tenths."""
    if point[1] == "checkpoint":
        return "S"
    risk = point[2] if len(point) > 2 else None
    return "-" if risk is None else str(min(9, int(risk * 10)))


def watch_alerts(port, seen):
    """Records every alert's state in `seen`; returns the firing job alert's labels, if any."""
    firing = None
    for a in prometheus_alerts(port):
        key = (a["labels"].get("alertname"), a["labels"].get("rank"))
        if seen.get(key) != "firing":
            seen[key] = a["state"]
        if key[0] == JOB_ALERT and a["state"] == "firing":
            firing = dict(a["labels"], activeAt=a.get("activeAt"))
    return firing


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_alerts(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:{}/api/v1/alerts".format(port),
                                    timeout=2) as r:
            return json.load(r)["data"]["alerts"]
    except (OSError, ValueError, KeyError):
        return []


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(ROOT, "build/release/apps/fragscope/fragscope"))
    p.add_argument("--out", default=os.path.join(ROOT, "build/demo-cluster"))
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--oom-rank", type=int, default=3)
    p.add_argument("--prometheus", default=shutil.which("prometheus"))
    args, rest = p.parse_known_args()
    if not os.path.exists(args.bin):
        raise SystemExit("demo-cluster: no fragscope binary at {} (make release)".format(args.bin))
    if not args.prometheus:
        raise SystemExit("demo-cluster: prometheus is not installed (apt-get install "
                         "prometheus; tools/install-deps.sh)")
    out = os.path.abspath(args.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    sock = os.path.join(out, "agent.sock")
    procs = []
    try:
        serve_log = os.path.join(out, "serve.log")
        serve = subprocess.Popen(
            [args.bin, "serve", "--socket", sock, "--listen", "127.0.0.1:0", "--history",
             "none", "--interval", "1", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1",
             "--proc-root", os.path.join(out, "no-proc"), "--hostname", "demo-node"],
            stdout=subprocess.DEVNULL, stderr=open(serve_log, "w"))
        procs.append(serve)
        port = int(wait_for(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", serve_log, serve,
                            "fragscope serve").group(1))
        prom_port = free_port()
        config = os.path.join(out, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    "rule_files:\n  - {}\n"
                    "scrape_configs:\n  - job_name: fragscope\n    static_configs:\n"
                    "      - targets: ['127.0.0.1:{}']\n".format(
                        os.path.join(ROOT, "deploy/prometheus/alerts.yml"), port))
        prom_log = os.path.join(out, "prometheus.log")
        prom = subprocess.Popen(
            [args.prometheus, "--config.file", config, "--storage.tsdb.path",
             os.path.join(out, "prometheus-data"), "--web.listen-address",
             "127.0.0.1:{}".format(prom_port)],
            stdout=subprocess.DEVNULL, stderr=open(prom_log, "w"))
        procs.append(prom)
        wait_for(r"Server is ready to receive web requests", prom_log, prom, "prometheus", 60)
        print("demo-cluster: fragscope serve on :{}, Prometheus on :{}".format(port, prom_port))

        env = dict(os.environ, FRAGSCOPE_AGENT_SOCKET=sock, FRAGSCOPE_JOB="demo-cluster")
        incident = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "live_incident.py"), "--out", out,
             "--ranks", str(args.ranks), "--oom-rank", str(args.oom_rank)] + rest, env=env,
            stdout=subprocess.PIPE, text=True)
        seen = {}  # (alertname, rank) -> the most advanced state seen
        job_alert = None
        while incident.poll() is None:
            job_alert = watch_alerts(prom_port, seen) or job_alert
            time.sleep(1)
        incident.stdout.read()
        # The rule evaluates every second here; the daemon keeps an exited rank's last sample
        # (--linger), so the job alert is seen firing shortly after the run if not during it.
        deadline = time.time() + 20
        while not job_alert and time.time() < deadline:
            job_alert = watch_alerts(prom_port, seen)
            time.sleep(1)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    summary["prometheus_alerts"] = [{"alert": k[0], "rank": k[1], "state": v}
                                    for k, v in sorted(seen.items(), key=str)]
    summary["alert_firing"] = job_alert is not None
    summary["alert_rank"] = int(job_alert["rank"]) if job_alert and job_alert.get("rank") else None
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)

    print("\nTimeline of the monitored run, one letter per sample "
          "(. ok, w watch, W warning, C critical, S checkpoint and restart):")
    ranks = sorted(summary["timeline"].items(), key=lambda kv: int(kv[0]))
    for rank, points in ranks:
        print("  rank {:>2}: {}".format(rank, "".join(LETTER.get(p[1], "?") for p in points)))
    print("\nP(OOM within 100 steps) per sample, in tenths (0: < 10%, 9: >= 90%; - not yet "
          "known, S checkpoint and restart):")
    for rank, points in ranks:
        print("  rank {:>2}: {}".format(rank, "".join(risk_digit(p) for p in points)))
    keys = ("control_oom_step", "control_oom_rank", "warning_step", "checkpoint_steps",
            "restarts", "alloc_conf_applied", "finished", "final_step", "alert_firing",
            "alert_rank", "prometheus_alerts")
    print(json.dumps({k: summary.get(k) for k in keys}, indent=1))
    print("wrote", os.path.join(out, "summary.json"))
    if not summary["alert_firing"]:
        print("demo-cluster: Prometheus never fired {} (see {})".format(
            JOB_ALERT, os.path.join(out, "prometheus.log")), file=sys.stderr)
    return 0 if summary["finished"] and summary["alert_firing"] else 1


if __name__ == "__main__":
    sys.exit(main())
