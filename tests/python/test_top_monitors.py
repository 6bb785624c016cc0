"""`fragscope top` against a daemon fed by two real Monitors (issue 33 item 3, "Done when"): two
training processes, ranks 0 and 1 of one job, each a fragscope.torch.Monitor on a virtual GPU
whose allocations are real CPU tensors, report to `fragscope serve`; `fragscope top --once`,
read over the daemon's API socket and over HTTP, shows both ranks with the figures each
Monitor sent: reserved and allocated bytes as the process's own allocator counts them, its
step, and the level its own forecaster gave."""
import json
import os
import re
import subprocess
import time

import conftest

conftest.native_or_skip()
Daemon = conftest.integration_daemon()

# One rank: rank 0 keeps what it allocates (a leak its forecaster sees coming), rank 1 frees it
# every step. The action waits for "critical", so both sample to the end. Both print what
# their allocator holds after the last sample and the Monitor's verdict, then stay connected.
JOB = """
import json, os, sys, torch
import fragscope.torch as ft
from fragscope.torch.monitor import Monitor, LEVELS
m = Monitor(every=5, run_dir=sys.argv[1], socket=sys.argv[2], action="stop", level="critical",
            job="top2", request_signal=None, distributed=False)
gpu = ft.virtual_gpu("64MiB").start()
leak = m.rank == 0
keep = []
for step in range(41):
    x = torch.empty((1400 if leak else 3072) << 10, dtype=torch.uint8)
    if leak:
        keep.append(x)
    del x
    gpu.step(step)
    m.step(step)
stats = gpu.memory_stats()
print(json.dumps({"pid": os.getpid(), "rank": m.rank, "step": m.last["step"],
                  "level": m.last["level"], "level_index": LEVELS.index(m.last["level"]),
                  "reserved": stats["reserved_bytes.all.current"],
                  "allocated": stats["allocated_bytes.all.current"]}), flush=True)
sys.stdin.readline()  # stay connected (the daemon drops a process's series when it leaves)
"""


def compact(n):
    """The byte counts of top's columns, from their definition (docs/live-monitoring.md)."""
    if n < 1000:
        return f"{n}B"
    x = float(n)
    for unit in "KMGTPE":
        x /= 1024
        if x < 9.95:
            return f"{x:.1f}{unit}"
        if x < 999.5:
            return f"{x:.0f}{unit}"
    return f"{x:.0f}E"


def start_rank(tmp_path, sock, rank):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run_dir = tmp_path / f"rank{rank}"
    run_dir.mkdir()
    return subprocess.Popen([conftest.PYTHON, str(script), str(run_dir), sock],
                            env=conftest.subprocess_env(RANK=str(rank), LOCAL_RANK=str(rank)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def top_once(*args):
    out = subprocess.run([conftest.fragscope_bin(), "top", "--once", *args],
                         capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, COLUMNS="140", LANG="C.UTF-8"))
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_top_shows_both_monitored_ranks_with_their_figures(tmp_path):
    conftest.fragscope_bin()
    daemon = Daemon(str(tmp_path))
    procs = []
    try:
        procs = [start_rank(tmp_path, daemon.sock, rank) for rank in (0, 1)]
        ranks = {}
        for p in procs:
            line = p.stdout.readline()
            if not line:
                p.wait(timeout=60)
                raise AssertionError(p.stderr.read())
            last = json.loads(line)
            ranks[last["rank"]] = last
        assert sorted(ranks) == [0, 1] and all(r["step"] == 40 for r in ranks.values())
        # The Monitor sends without waiting: wait until the daemon has both last samples.
        deadline = time.time() + 30
        while time.time() < deadline:
            rows = json.loads(daemon.get("/api/v1/processes")[2])["processes"]
            if len(rows) == 2 and all(r["step"] == 40 for r in rows):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the daemon did not get both ranks' last samples: {rows}")

        api_sock = os.path.join(str(tmp_path), "run", "agent.api.sock")
        frames = {"socket": top_once("--socket", api_sock),
                  "http": top_once("--url", f"http://127.0.0.1:{daemon.port}")}
        for transport, lines in frames.items():
            assert lines[0].startswith("fragscope top - itest - 2 processes"), (transport, lines)
            header = lines[2].split()
            assert header[:6] == ["JOB", "RANK", "PID", "HOST", "GPU", "STEP"], header
            col = {name: i for i, name in enumerate(header)}
            for rank, last in ranks.items():
                row = [i for i, line in enumerate(lines) if re.search(rf"\s{last['pid']}\s", line)]
                assert len(row) == 1, (transport, rank, lines)
                cells = lines[row[0]].split()
                assert cells[:3] == ["top2", str(rank), str(last["pid"])], cells
                assert cells[col["STEP"]] == "40"
                # What this rank's own allocator held at its last sample, as top draws it.
                assert cells[col["RESV"]] == compact(last["reserved"]), (cells, last)
                assert cells[col["ALLOC"]] == compact(last["allocated"]), (cells, last)
                # The Monitor's own verdict, not a guess of the daemon's.
                assert cells[col["LEVEL"]] == last["level"], (cells, last)
            # Worst first: the leaking rank, whose Monitor sees the OOM coming, above the other.
            assert lines[3].split()[:2] == ["top2", "0"] and lines[4].split()[:2] == ["top2", "1"]
        assert ranks[0]["level_index"] > ranks[1]["level_index"], ranks
        assert ranks[0]["allocated"] > ranks[1]["allocated"]
        # Both transports draw the same rows.
        assert frames["socket"][2:] == frames["http"][2:]
    finally:
        for p in procs:
            try:
                p.communicate("\n", timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        daemon.stop()
