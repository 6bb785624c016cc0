#!/usr/bin/python3
"""The snapshot speed table (issue 34): `fragscope analyze` against the Python summary and
against `pickle.load` alone, wall time and peak resident memory, per snapshot size.

    /usr/bin/python3 bench/python/snapshot_table.py --bin build/bench/apps/fragscope/fragscope
        [--sizes 28,447] [--runs 3] [--dir /tmp/fragscope-bench] [--report]
        [--shape entries|factor]

Snapshots come from bench/python/make_big_snapshot.py (about 206 bytes a trace entry; a size
in MB asks for size * 1e6 / 206 entries), made once in --dir and kept there (never in the
repository). `--shape factor` makes the issue-34 shape instead (make_big_snapshot.py --factor:
many segments, short shared stacks, about 1.3 MB a unit, so a size in MB asks for factor
size / 1.315: 28 -> factor 21, 447 -> factor 340). A 2 GB file ("--sizes 28,447,2048") takes about 15 minutes to make and its Python
runs need about 9 GB of memory and a minute each, so it is opt-in.

Runs are paired: each round runs every command once on the same file, in a rotating order, so
that a change in the machine's load hits all of them alike; the table gives medians over the
rounds. Wall time and peak RSS are the whole process's (os.wait4's rusage), as /usr/bin/time
reports them. --report also times `fragscope report` (target: at most 1.5x analyze).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BYTES_PER_ENTRY = 206
MB_PER_FACTOR = 1.315


def run(argv):
    """(wall seconds, peak RSS bytes, CPU seconds) of one process; raises on failure."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit("failed (%d): %s\n%s" % (proc.returncode, " ".join(argv), err))
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def ensure_snapshot(directory, size_mb, shape):
    if shape == "factor":
        factor = max(1, round(size_mb / MB_PER_FACTOR))
        path = os.path.join(directory, "factor%d.pickle" % factor)
        what, flag = "factor %d" % factor, ["--factor", str(factor)]
    else:
        entries = int(size_mb * 1e6 / BYTES_PER_ENTRY)
        path = os.path.join(directory, "big%d.pickle" % size_mb)
        what, flag = "%d entries" % entries, ["--entries", str(entries)]
    if not os.path.exists(path):
        print("making %s (%s) ..." % (path, what), file=sys.stderr, flush=True)
        subprocess.run([sys.executable, os.path.join(HERE, "make_big_snapshot.py"), path] + flag,
                       check=True, stdout=subprocess.DEVNULL)
    return path


def mib(n):
    return "%d MiB" % round(n / (1 << 20))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", required=True, help="the fragscope binary (a Release build)")
    parser.add_argument("--sizes", default="28,447", help="snapshot sizes in MB, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="paired rounds per size")
    parser.add_argument("--dir", default="/tmp/fragscope-bench")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--report", action="store_true", help="also time `fragscope report`")
    parser.add_argument("--before", help="another fragscope binary to time alongside (e.g. main's)")
    parser.add_argument("--shape", choices=("entries", "factor"), default="entries",
                        help="the generator's shape: long stacks, 400 segments (entries) or "
                        "the issue's many segments and short stacks (factor)")
    parser.add_argument("--no-python", action="store_true",
                        help="time fragscope only (the Python runs take minutes at 447 MB)")
    args = parser.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    summary = os.path.join(HERE, "snapshot_summary.py")
    html = os.path.join(args.dir, "report.html")
    rows = []
    for size_mb in [int(s) for s in args.sizes.split(",") if s]:
        path = ensure_snapshot(args.dir, size_mb, args.shape)
        commands = {"fragscope analyze": [args.bin, "analyze", path, "--no-map"]}
        if not args.no_python:
            commands["Python summary"] = [args.python, summary, path]
            commands["pickle.load alone"] = [args.python, summary, "--load-only", path]
        if args.report:
            commands["fragscope report"] = [args.bin, "report", path, "-o", html]
        if args.before:
            commands["fragscope analyze, before"] = [args.before, "analyze", path, "--no-map"]
        results = {name: [] for name in commands}
        names = list(commands)
        for r in range(args.runs):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                results[name].append(run(commands[name]))
                wall, rss, cpu = results[name][-1]
                print("  %s round %d %-18s %.2f s (CPU %.2f s) %s" % (
                    os.path.basename(path), r + 1, name, wall, cpu, mib(rss)),
                      file=sys.stderr, flush=True)
        medians = {name: tuple(statistics.median(x[k] for x in v) for k in range(3))
                   for name, v in results.items()}
        rows.append((path, os.path.getsize(path), medians))

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print("Snapshot speed: medians of %d paired rounds, whole process (wall, CPU = user + "
          "system of all threads, peak RSS); load average %.1f at the end; %d CPUs" % (
              args.runs, load, os.cpu_count()))
    print()
    header = ["File", "Command", "Wall", "CPU", "Peak RSS", "RSS / file", "fragscope is (wall)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path, size, medians in rows:
        fs_wall = medians["fragscope analyze"][0]
        for name, (wall, rss, cpu) in medians.items():
            if name == "fragscope analyze":
                vs = ""
            elif name == "fragscope report":
                vs = "report = %.2fx analyze" % (wall / fs_wall)
            else:
                vs = "%.1fx faster" % (wall / fs_wall)
            print("| %s (%.1f MB) | %s | %.2f s | %.2f s | %s | %.2fx | %s |" % (
                os.path.basename(path), size / 1e6, name, wall, cpu, mib(rss), rss / size, vs))


if __name__ == "__main__":
    main(sys.argv[1:])
