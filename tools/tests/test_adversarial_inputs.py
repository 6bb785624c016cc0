"""A smoke run of tools/adversarial_inputs.py (make fuzz runs it for minutes): a few inputs of
every shape at their smallest size through the dev build's fragscope, each bounded."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "adversarial_inputs.py"
BIN = os.environ.get("FRAGSCOPE_BIN", str(REPO / "build" / "dev" / "apps" / "fragscope" /
                                          "fragscope"))


@pytest.mark.skipif(not os.path.exists(BIN), reason="no fragscope binary (build the dev preset)")
def test_a_short_run_finds_nothing_and_says_so(tmp_path):
    out = subprocess.run(
        [sys.executable, str(TOOL), "--bin", BIN, "--seconds", "60", "--iterations", "12",
         "--scale", "0", "--seed", "7", "--keep", str(tmp_path / "failures")],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 inputs, 0 failed (seed 7)" in out.stdout, out.stdout
    assert not (tmp_path / "failures").exists()


def test_a_failure_is_reported_and_kept(tmp_path):
    """The check can fail: a 'binary' that exits 3 on every input."""
    fake = tmp_path / "fake-fragscope"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    out = subprocess.run(
        [sys.executable, str(TOOL), "--bin", str(fake), "--iterations", "1", "--scale", "0",
         "--seed", "1", "--keep", str(tmp_path / "failures")],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "exit 3" in out.stdout and "1 failed" in out.stdout
    assert len(os.listdir(tmp_path / "failures")) == 1
