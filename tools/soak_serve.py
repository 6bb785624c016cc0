#!/usr/bin/python3
"""Load and fault test for `fragscope serve` (make soak; a short run is in the test suite).

Starts the daemon on a temporary socket and a free loopback port, then for --seconds:
  * --agents agents (in --procs worker processes) each send --rate samples/s on one
    connection, every sample numbered;
  * a fault injector opens extra connections a few times a second that send bad magic,
    an oversized length, half a frame then disconnect, or a flood beyond the rate limit;
  * a scraper GETs /metrics every --scrape-ms ms and times each answer.
Then it checks that nothing was lost: per agent, fragscope_process_samples_total equals what
the agent sent, and each rejection counter equals the faults injected of that kind; and that
the daemon still serves. Prints one JSON summary (scrape latency percentiles, the largest
page, daemon VmHWM, the load average at the end) and exits 1 on any mismatch or a scrape p99
above --p99-target-ms (10).

  tools/soak_serve.py --bin build/release/apps/fragscope/fragscope --agents 64 --rate 10 --seconds 60
"""

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

LINGER = 1.0  # serve --linger for the soak, seconds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fragscope_agent  # noqa: E402



def start_daemon(binary, workdir, extra=()):
    sock = os.path.join(workdir, "agent.sock")
    log = open(os.path.join(workdir, "serve.log"), "w+")
    proc = subprocess.Popen(
        [binary, "serve", "--socket", sock, "--listen", "127.0.0.1:0", "--hostname", "soak",
         "--interval", "1", "--history", os.path.join(workdir, "history.sqlite"),
         # Disconnected agents' series linger LINGER seconds (serve --linger); the soak checks
         # that they then leave.
         "--linger", str(LINGER),
         # One UID sends every sample here: the history rate bound is not what the soak measures.
         "--history-rate-per-uid", "64MiB", "--history-rate", "64MiB", *extra],
        stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.time() + 10
    port = None
    while time.time() < deadline and port is None:
        log.seek(0)
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read())
        if m:
            port = int(m.group(1))
        elif proc.poll() is not None:
            break
        else:
            time.sleep(0.05)
    if port is None:
        proc.kill()
        log.seek(0)
        raise RuntimeError("fragscope serve did not start:\n" + log.read())
    return proc, sock, port, log


def scrape(port, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}")
        return body
    finally:
        conn.close()


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value}"""
    out = {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = line_re.match(line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        labels = dict(label_re.findall(m.group(2) or ""))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def value(metrics, name, **labels):
    want = set(labels.items())
    found = [v for (n, ls), v in metrics.items() if n == name and want <= set(ls)]
    return sum(found) if found else None


def agent_worker(sock, first, count, rate, seconds, queue):
    """Runs agents first..first+count-1 as threads; reports {index: sent}."""
    sent = {}
    failures = {}

    def one(i):
        # The daemon records samples under their sender's pid (SO_PEERCRED): the agents of one
        # worker process share it, so each agent is its own device (series GPU-soak-<i>).
        client = fragscope_agent.AgentClient(sock, job="soak", rank=i)
        n = 0
        failed = 0
        start = time.monotonic()
        total = int(rate * seconds)
        for k in range(total):
            target = start + k / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # No forecast of the agent's own, as send_torch_state sends: the daemon runs its
            # forecaster on every sample (docs/forecast.md, "In the daemon").
            ok = client.send_sample({
                "device_uuid": f"GPU-soak-{i}", "step": k, "reserved_bytes": 1 << 30,
                "allocated_bytes": k, "peak_allocated_bytes": (1 << 29) + k,
                "largest_free_block": 1 << 20, "max_allocatable": 1 << 20,
                "device_free_bytes": 1 << 32, "free_block_count": [0] * 20 + [k % 7]})
            if ok:
                n += 1
            else:
                failed += 1
        sent[i] = n
        failures[i] = failed
        # Keep the connection open: the series must still be there for the final check.
        queue.put(("done", i, n, failed))
        hold.wait()
        client.close()

    hold = threading.Event()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(first, first + count)]
    for t in threads:
        t.start()
    # The parent says when to disconnect (after its final scrape).
    release.wait()
    hold.set()
    for t in threads:
        t.join()


release = None  # set per worker process (mp.Event)


def worker_main(sock, first, count, rate, seconds, queue, release_event):
    global release
    release = release_event
    agent_worker(sock, first, count, rate, seconds, queue)


def inject_faults(sock, stop, counts, max_rate, burst):
    kinds = ["bad_magic", "oversized", "truncated", "rate_limited"]
    k = 0
    good = fragscope_agent.encode_sample({"pid": 1, "device_uuid": "GPU-fault"})
    while not stop.is_set():
        kind = kinds[k % len(kinds)]
        k += 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(sock)
            if kind == "bad_magic":
                s.sendall(b"\x10\x00\x00\x00JUNK" + b"x" * 12)
            elif kind == "oversized":
                s.sendall(b"\xff\xff\xff\x7f")
            elif kind == "truncated":
                s.sendall(good[: len(good) // 2])
                time.sleep(0.02)
            else:  # flood: several times the burst, back to back
                try:
                    s.sendall(good * int(burst * 4 + max_rate))
                except OSError:
                    pass  # closed by the daemon mid-flood: expected
            if kind != "truncated":
                try:
                    s.recv(1)  # wait until the daemon closes us, so counts are settled
                except ConnectionResetError:
                    pass  # closed with our unread bytes pending: the same thing
            counts[kind] += 1
        except OSError as e:
            counts.setdefault("errors", []).append(f"{kind}: {e}")
        finally:
            s.close()
        stop.wait(0.25)


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.environ.get("FRAGSCOPE_BIN", "build/release/apps/fragscope/fragscope"))
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--rate", type=float, default=10.0, help="samples/s per agent")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--scrape-ms", type=float, default=100.0)
    ap.add_argument("--procs", type=int, default=4, help="agent worker processes")
    ap.add_argument("--p99-target-ms", type=float, default=10.0,
                    help="fail when the scrape latency p99 is above this (docs/benchmarks.md)")
    args = ap.parse_args()

    max_rate, burst = 50.0, 100.0  # the daemon's defaults
    summary = {"agents": args.agents, "rate": args.rate, "seconds": args.seconds,
               "scrape_ms": args.scrape_ms}
    problems = []
    with tempfile.TemporaryDirectory(prefix="fragscope_soak_") as workdir:
        proc, sock, port, log = start_daemon(args.bin, workdir)
        try:
            ctx = mp.get_context("fork")
            queue = ctx.Queue()
            release_event = ctx.Event()
            workers = []
            per = (args.agents + args.procs - 1) // args.procs
            for w in range(args.procs):
                first = w * per
                count = min(per, args.agents - first)
                if count <= 0:
                    break
                p = ctx.Process(target=worker_main,
                                args=(sock, first, count, args.rate, args.seconds, queue,
                                      release_event))
                p.start()
                workers.append(p)

            stop = threading.Event()
            faults = {"bad_magic": 0, "oversized": 0, "truncated": 0, "rate_limited": 0}
            injector = threading.Thread(target=inject_faults,
                                        args=(sock, stop, faults, max_rate, burst))
            injector.start()

            latencies = []
            max_bytes = 0
            scrape_errors = 0
            end = time.monotonic() + args.seconds
            next_scrape = time.monotonic()
            while time.monotonic() < end:
                t0 = time.perf_counter()
                try:
                    body = scrape(port)
                    latencies.append((time.perf_counter() - t0) * 1000.0)
                    max_bytes = max(max_bytes, len(body))
                except (OSError, RuntimeError) as e:
                    scrape_errors += 1
                    problems.append(f"scrape failed: {e}")
                next_scrape += args.scrape_ms / 1000.0
                time.sleep(max(0.0, next_scrape - time.monotonic()))
            stop.set()
            injector.join()

            sent = {}
            failed = {}
            while len(sent) < args.agents:
                _, i, n, f = queue.get(timeout=args.seconds + 60)
                sent[i] = n
                failed[i] = f
            time.sleep(0.5)  # the last frames reach the registry
            final = parse_metrics(scrape(port))

            # Every agent: what it sent is what the daemon counted for its series.
            lost = {}
            for i, n in sent.items():
                got = value(final, "fragscope_process_samples_total", UUID=f"GPU-soak-{i}")
                if got != n:
                    lost[i] = (n, got)
            if lost:
                problems.append(f"agents whose count differs (sent, counted): {dict(list(lost.items())[:5])}")
            if any(failed.values()):
                problems.append(f"sends that failed on the agent side: {sum(failed.values())}")
            total_sent = sum(sent.values())
            received = value(final, "fragscope_agent_samples_received_total")
            flood_accepted = received - total_sent if received is not None else None
            # Each flood connection gets at most its burst (+ refill while it lasts).
            if flood_accepted is None or flood_accepted < 0 or \
                    flood_accepted > faults["rate_limited"] * (burst + max_rate):
                problems.append(f"received_total {received} vs {total_sent} sent by agents")
            for kind, n in faults.items():
                if kind == "errors":
                    continue
                got = value(final, "fragscope_agent_samples_rejected_total", reason=kind)
                if got != n:
                    problems.append(f"rejected_total{{reason={kind}}} is {got}, injected {n}")
            if faults.get("errors"):
                problems.append(f"fault injector errors: {faults['errors'][:3]}")

            release_event.set()
            for p in workers:
                p.join(timeout=30)
            time.sleep(LINGER + 0.5)
            after = parse_metrics(scrape(port))
            series_left = value(after, "fragscope_agent_series")
            if series_left != 0:
                problems.append(f"{series_left} series left {LINGER} s after every agent "
                                "disconnected (the linger)")

            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu_seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            with open(f"/proc/{proc.pid}/status") as f:
                status = f.read()
            hwm_kb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))
            summary.update({
                "samples_sent": total_sent,
                "samples_received_total": received,
                "flood_samples_accepted": flood_accepted,
                "faults_injected": {k: v for k, v in faults.items() if k != "errors"},
                "scrapes": len(latencies),
                "scrape_errors": scrape_errors,
                "scrape_ms_p50": round(percentile(latencies, 50), 3) if latencies else None,
                "scrape_ms_p99": round(percentile(latencies, 99), 3) if latencies else None,
                "scrape_ms_max": round(max(latencies), 3) if latencies else None,
                "metrics_bytes_max": max_bytes,
                "daemon_vmhwm_mib": round(hwm_kb / 1024.0, 1),
                "daemon_cpu_seconds": round(cpu_seconds, 2),
                "daemon_alive": proc.poll() is None,
            })
            if latencies and percentile(latencies, 99) > args.p99_target_ms:
                problems.append(f"scrape p99 {percentile(latencies, 99):.1f} ms is above the "
                                f"target {args.p99_target_ms} ms (page {max_bytes} bytes)")
            with open("/proc/loadavg") as f:
                summary["load_average_at_end"] = float(f.read().split()[0])
            if proc.poll() is not None:
                problems.append("the daemon died")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=10)
                    if rc != 0:
                        problems.append(f"daemon exited with {rc}")
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    problems.append("daemon did not stop on SIGTERM")
            if os.path.exists(sock):
                problems.append("socket left behind")
            log.close()
        # Every accepted sample is also in the history once the daemon has stopped (the last
        # batch is written at shutdown).
        import sqlite3
        db = sqlite3.connect(os.path.join(workdir, "history.sqlite"))
        try:
            stored = db.execute("SELECT count(*) FROM samples").fetchone()[0]
        finally:
            db.close()
        summary["history_samples"] = stored
        if summary.get("samples_received_total") is not None and \
                stored != summary["samples_received_total"]:
            problems.append(f"history holds {stored} samples, the daemon received "
                            f"{summary['samples_received_total']}")
    summary["problems"] = problems
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
