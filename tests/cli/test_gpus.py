"""`fragscope gpus` with the stand-in libnvidia-ml (tests/testing/fake_nvml, its path in
FRAGSCOPE_FAKE_NVML) answering from tests/data/nvml/*.txt, and /proc/driver/nvidia fixture
folders from tests/data/procfs.
"""

import ctypes
import json
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("FRAGSCOPE_BIN", "")
FAKE_NVML = os.environ.get("FRAGSCOPE_FAKE_NVML", "")
NVML_DATA = os.path.join(SOURCE_DIR, "tests", "data", "nvml")
PROCFS = os.path.join(SOURCE_DIR, "tests", "data", "procfs")
GiB = 1 << 30

pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN),
                                reason="FRAGSCOPE_BIN is not set to the built fragscope")
needs_fake = pytest.mark.skipif(not FAKE_NVML or not os.path.exists(FAKE_NVML),
                                reason="FRAGSCOPE_FAKE_NVML is not set to the stand-in library")


def run(*args, fixture=None):
    env = dict(os.environ)
    env.pop("FRAGSCOPE_FAKE_NVML_FIXTURE", None)
    if fixture is not None:
        env["FRAGSCOPE_FAKE_NVML_FIXTURE"] = os.path.join(NVML_DATA, fixture)
    return subprocess.run([BIN, "gpus", *args], capture_output=True, timeout=60, env=env)


def real_nvml_present():
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


@pytest.mark.skipif(real_nvml_present() or os.path.isdir("/proc/driver/nvidia"),
                    reason="this machine has an NVIDIA driver")
def test_no_driver_is_a_clear_state_and_exit_0():
    r = run()
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith("NVML not available: libnvidia-ml.so.1: ")
    assert "/proc/driver/nvidia not available: /proc/driver/nvidia: no such directory" in out
    assert "GPUs: 0" in out
    r = run("--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["nvml"]["available"] is False
    assert "libnvidia-ml.so.1" in doc["nvml"]["unavailable_reason"]
    assert doc["procfs"]["available"] is False
    assert doc["gpus"] == []


@needs_fake
def test_nvml_and_proc_joined_by_uuid_text():
    r = run("--nvml-lib", FAKE_NVML, "--proc-root", os.path.join(PROCFS, "node2"),
            fixture="node2.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "Driver: 535.104.05" in out
    assert "GPUs: 2" in out
    assert ("GPU 0  NVIDIA A100-SXM4-80GB  GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0  "
            "00000000:3B:00.0  (NVML + /proc)") in out
    assert "memory     80.00 GiB total, 20.00 GiB used, 59.50 GiB free" in out
    assert "processes  pid 4242 19.00 GiB, pid 4243 (memory not available)" in out
    assert "minor 1, IRQ 160, firmware 535.104.05" in out
    assert "not available" not in out.replace("(memory not available)", "")


@needs_fake
def test_json_keeps_gpus_only_proc_knows():
    r = run("--json", "--nvml-lib", FAKE_NVML, "--proc-root", os.path.join(PROCFS, "excluded"),
            fixture="mig.txt")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["nvml"]["available"] is True
    assert doc["nvml"]["library"] == FAKE_NVML
    gpus = doc["gpus"]
    assert len(gpus) == 2
    h100 = gpus[0]
    assert h100["from_nvml"] and h100["from_procfs"]
    assert h100["index"] == 0
    assert h100["mig_enabled"] is True
    assert [m["uuid"] for m in h100["mig_instances"]] == [
        "MIG-aaaaaaaa-1111-2222-3333-444444444444", "MIG-bbbbbbbb-1111-2222-3333-444444444444"]
    assert h100["mig_instances"][0]["memory_total_bytes"] == 40 * GiB
    assert h100["processes"][1] == {"pid": 1002, "used_memory_bytes": 4194304000,
                                    "gpu_instance_id": 5, "compute_instance_id": 0}
    assert h100["excluded"] is False
    excluded = gpus[1]
    assert not excluded["from_nvml"] and excluded["from_procfs"]
    assert excluded["index"] is None
    assert excluded["excluded"] is True
    assert excluded["memory_total_bytes"] is None
    assert excluded["uuid"] == "GPU-deadbeef-0000-1111-2222-333333333333"
    # What no source gave is null, never "": NVML does not know this GPU (no name, no PCI id
    # from NVML), and NVML being available has no unavailable_reason.
    assert doc["nvml"]["unavailable_reason"] is None
    for g in gpus:
        for key, value in g.items():
            assert value != "", (key, g)
    for key, value in list(doc["nvml"].items()) + list(doc["procfs"].items()):
        assert value != "", key



@needs_fake
def test_refused_calls_are_printed_per_gpu():
    r = run("--nvml-lib", FAKE_NVML, "--proc-root", os.path.join(PROCFS, "garbage"),
            fixture="errors.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert "error      nvmlDeviceGetMemoryInfo_v2(GPU 1): Insufficient Permissions (code 4)" in out
    assert "error      nvmlDeviceGetBAR1MemoryInfo(GPU 0): GPU is lost (code 15)" in out
    assert "information:3: IRQ: 'lots' is not a number" in out
    assert "error: " + os.path.join(PROCFS, "garbage", "version") in out


@needs_fake
def test_nvml_init_failure_is_a_state_not_an_error():
    r = run("--nvml-lib", FAKE_NVML, "--proc-root", os.path.join(PROCFS, "node2"),
            fixture="init_fails.txt")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert out.startswith(f"NVML not available: {FAKE_NVML}: nvmlInit_v2: Driver Not Loaded "
                          "(code 9)\n")
    assert "(/proc only)" in out
    assert "Driver: 535.104.05" in out


def test_paths_given_that_cannot_be_opened_are_bad_input(tmp_path):
    r = run("--nvml-lib", str(tmp_path / "libnvidia-ml.so.1"))
    assert r.returncode == 2
    assert "--nvml-lib: " + str(tmp_path / "libnvidia-ml.so.1") in r.stderr.decode()
    r = run("--proc-root", str(tmp_path / "nvidia"))
    assert r.returncode == 2
    assert "--proc-root: " + str(tmp_path / "nvidia") + ": no such directory" in r.stderr.decode()


def test_help_teaches():
    r = subprocess.run([BIN, "gpus", "--help"], capture_output=True, timeout=60)
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "Examples:" in out
    assert "--proc-root" in out and "--nvml-lib" in out and "--json" in out
    assert "caching allocator" in out
