"""The agent and the Monitor on PyPI's torch 2.13 reach the daemon of the same pip install
(issue 28 item 3): `fragscope serve` from the wheel's bin/, samples from a virtual GPU sent by
fragscope_agent.send_torch_state and by Monitor.step, read back from /metrics."""
import subprocess
import textwrap
import time
import urllib.request

import conftest
from conftest import metric

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


def test_the_agent_and_the_monitor_reach_the_installed_daemon(installed, first_use,
                                                              tmp_path):
    job = None
    with conftest.serve(installed, tmp_path) as (sock, url):
        try:
            job = subprocess.Popen([installed.python, "-c", JOB, sock], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=installed.env())
            assert job.stdout.readline().strip() == "sent", job.stderr.read()[-3000:]
            deadline = time.time() + 10
            while True:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                mon = metric(text, "fragscope_process_step", pid=str(job.pid),
                             job_name="user-env")
                agent = metric(text, "fragscope_process_step", pid=str(job.pid),
                               job_name="user-env-agent")
                if (mon, agent) == (10, 42) or time.time() > deadline:
                    break
                time.sleep(0.2)
            assert (mon, agent) == (10, 42), [line for line in text.splitlines()
                                              if "process_step" in line]
            # What the virtual GPU holds reached the daemon: 8 MiB of live tensors at least.
            held = metric(text, "fragscope_process_allocated_bytes", pid=str(job.pid),
                          job_name="user-env-agent")
            assert held is not None and held >= 8 << 20, held
        finally:
            if job is not None:
                job.communicate("\n", timeout=60)
