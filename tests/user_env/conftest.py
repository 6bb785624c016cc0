"""The pip route in the user's own environment (issue 28, docs/python.md).

Run with the Python of tools/setup_user_env.sh's venv (PyPI's torch 2.13.0 CPU, Lightning,
transformers): tools/run_tests.sh does. The session builds a wheel from a clean copy of this tree
(`pip wheel`, scikit-build-core driving the CMake build), installs it into a throwaway venv that
sees the user env's packages through a .pth file (torch is not installed twice), and the tests run
the `fragscope` command, `import fragscope` and the Monitor from there. The virtual GPU's c10 hook
is compiled at its first use into a cache made for this session, so that path runs every time.
"""
import contextlib
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time

import pytest

SOURCE_DIR = os.environ.get("FRAGSCOPE_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(SOURCE_DIR, "tests", "data", "sample", "gpt_tiny_50steps.jsonl.gz")


def _tracked_files():
    out = subprocess.run(["git", "-C", SOURCE_DIR, "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f and not f.startswith("build/")]


class Installed:
    """A throwaway venv with the wheel installed."""

    def __init__(self, root):
        self.root = root
        self.venv = os.path.join(root, "venv")
        self.python = os.path.join(self.venv, "bin", "python")
        self.bin = os.path.join(self.venv, "bin")
        self.cache = os.path.join(root, "cache")

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FRAGSCOPE_", "PYTORCH_")) and k != "PYTHONPATH"}
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        env["FRAGSCOPE_CACHE_DIR"] = self.cache
        env["OMP_NUM_THREADS"] = "1"
        env.update(extra)
        return env

    def run(self, args, timeout=600, **extra):
        return subprocess.run(args, env=self.env(**extra), capture_output=True, text=True,
                              timeout=timeout)


def _venv(path, see_user_env):
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", path], check=True)
    if see_user_env:
        site = subprocess.run([os.path.join(path, "bin", "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, "fragscope_test_user_env.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("wheel"))
    copy = os.path.join(root, "src")
    for rel in _tracked_files():
        src = os.path.join(SOURCE_DIR, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(copy, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(copy, rel))
    dist = os.path.join(root, "dist")
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--disable-pip-version-check", "-w", dist, copy],
                          capture_output=True, text=True, env=env, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    wheels = glob.glob(os.path.join(dist, "fragscope-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)
    return wheels[0]


def _install(wheel, tmp_path_factory, name, see_user_env):
    inst = Installed(str(tmp_path_factory.mktemp(name)))
    _venv(inst.venv, see_user_env=see_user_env)
    proc = subprocess.run([inst.python, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", wheel],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return inst


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory):
    """The wheel in a venv that sees the user env's torch and frameworks."""
    return _install(wheel, tmp_path_factory, "installed", see_user_env=True)


@pytest.fixture(scope="session")
def bare(wheel, tmp_path_factory):
    """The wheel in a venv with no torch at all."""
    return _install(wheel, tmp_path_factory, "bare", see_user_env=False)


@pytest.fixture(scope="session")
def first_use(installed):
    """The first use of a virtual GPU in the installed venv, whichever test comes first: it
    compiles the c10 hook against the venv's torch into the session's cache and says so on
    stderr (returned)."""
    proc = installed.run([installed.python, "-c",
                          "from fragscope.torch import virtual_gpu\n"
                          "virtual_gpu('1GiB').start().stop()"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr



@contextlib.contextmanager
def serve(installed, tmp_path):
    """`fragscope serve` of the installed wheel on a socket in tmp_path, with no NVML and no
    /proc/driver: yields (socket path, /metrics URL)."""
    sock = str(tmp_path / "agent.sock")
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [os.path.join(installed.bin, "fragscope"), "serve", "--socket", sock,
         "--listen", "127.0.0.1:0", "--interval", "0.2",
         "--history", str(tmp_path / "history.sqlite"),
         "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--proc-root", str(tmp_path / "none")],
        stdout=subprocess.DEVNULL, stderr=log, env=installed.env())
    try:
        port = None
        deadline = time.time() + 20
        while port is None and time.time() < deadline:
            log.seek(0)
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read())
            port = int(found.group(1)) if found else None
            assert proc.poll() is None, open(tmp_path / "serve.log").read()
            time.sleep(0.05)
        assert port, open(tmp_path / "serve.log").read()
        yield sock, "http://127.0.0.1:{}/metrics".format(port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def metric(text, name, **labels):
    """The value of the first series `name` of Prometheus text with these labels, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all('{}="{}"'.format(k, v) in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None
