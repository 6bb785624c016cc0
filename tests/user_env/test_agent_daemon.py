"""The agent and the Monitor on PyPI's torch 2.13 reach the daemon of the same pip install
(issue 28 item 3): `fragscope serve` from the wheel's bin/, samples from a virtual GPU sent by
fragscope_agent.send_torch_state and by Monitor.step, read back from /metrics."""
import os
import re
import subprocess
import textwrap
import time
import urllib.request

JOB = textwrap.dedent("""
    import sys, torch
    import fragscope_agent
    from fragscope.torch import Monitor, virtual_gpu
    sock = sys.argv[1]
    m = Monitor(every=5, socket=sock, job="user-env", action="stop")
    with virtual_gpu("1GiB"):
        kept = [torch.randn(256, 1024) for _ in range(8)]
        for step in range(11):
            m.step(step)
        agent = fragscope_agent.AgentClient(sock, job="user-env-agent", rank=3)
        assert agent.send_torch_state(42, device_uuid="GPU-user-env-agent"), agent.last_error
        print("sent", flush=True)
        sys.stdin.readline()  # the series live while the connections are open
""")


def metric(text, name, **labels):
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all('{}="{}"'.format(k, v) in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_agent_and_the_monitor_reach_the_installed_daemon(installed, first_use,
                                                              tmp_path):
    sock = str(tmp_path / "agent.sock")
    log = open(tmp_path / "serve.log", "w+")
    serve = subprocess.Popen(
        [os.path.join(installed.bin, "fragscope"), "serve", "--socket", sock,
         "--listen", "127.0.0.1:0", "--interval", "0.2",
         "--history", str(tmp_path / "history.sqlite"),
         "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--proc-root", str(tmp_path / "none")],
        stdout=subprocess.DEVNULL, stderr=log, env=installed.env())
    job = None
    try:
        port = None
        deadline = time.time() + 20
        while port is None and time.time() < deadline:
            log.seek(0)
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read())
            port = int(found.group(1)) if found else None
            assert serve.poll() is None, open(tmp_path / "serve.log").read()
            time.sleep(0.05)
        assert port, open(tmp_path / "serve.log").read()
        job = subprocess.Popen([installed.python, "-c", JOB, sock], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=installed.env())
        assert job.stdout.readline().strip() == "sent", job.stderr.read()[-3000:]
        url = "http://127.0.0.1:{}/metrics".format(port)
        deadline = time.time() + 10
        while True:
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            mon = metric(text, "fragscope_process_step", pid=str(job.pid), job_name="user-env")
            agent = metric(text, "fragscope_process_step", pid=str(job.pid),
                           job_name="user-env-agent")
            if (mon, agent) == (10, 42) or time.time() > deadline:
                break
            time.sleep(0.2)
        assert (mon, agent) == (10, 42), [l for l in text.splitlines() if "process_step" in l]
        # What the virtual GPU holds reached the daemon: 8 MiB of live tensors at least.
        held = metric(text, "fragscope_process_allocated_bytes", pid=str(job.pid),
                      job_name="user-env-agent")
        assert held is not None and held >= 8 << 20, held
    finally:
        if job is not None:
            job.communicate("\n", timeout=60)
        serve.terminate()
        serve.wait(timeout=30)
        log.close()
