"""fragscope._safe_file: the Python package's writes (the monitor's recommendation and OOM
snapshot, the virtual GPU's dumps) follow the C++ side's rule (issue 24 item 4;
docs/user-guide.md, "Files and links"). Needs neither torch nor the native module."""
import os

import pytest

import conftest  # noqa: F401  (sys.path)
from fragscope._safe_file import open_safely, write_file_safely

VICTIM = b"must stay as it is\n"


def test_replaces_the_file_through_a_new_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    with open_safely(path) as f:
        f.write(b"new")
        temps = [n for n in os.listdir(tmp_path) if n != "out.json"]
        assert len(temps) == 1 and temps[0].startswith(".out.json.") and temps[0].endswith(".tmp")
        assert path.read_bytes() == b"old"
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out.json"]


def test_an_error_leaves_no_temporary_and_the_old_file(tmp_path):
    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with open_safely(path) as f:
            f.write(b"half")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_link_at_a_name_the_program_chose_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    os.symlink(victim, tmp_path / "fragscope-recommendation.json")
    with pytest.raises(OSError, match="is a symbolic link"):
        write_file_safely(tmp_path / "fragscope-recommendation.json", b"{}")
    assert victim.read_bytes() == VICTIM
    assert sorted(os.listdir(tmp_path)) == ["fragscope-recommendation.json", "victim"]


def test_a_link_the_caller_named_is_followed_to_its_file(tmp_path):
    victim = tmp_path / "real.pickle"
    victim.write_bytes(b"old")
    os.symlink(victim, tmp_path / "snap.pickle")
    write_file_safely(tmp_path / "snap.pickle", b"new", named_by_user=True)
    assert os.path.islink(tmp_path / "snap.pickle")
    assert victim.read_bytes() == b"new"


def test_a_link_to_nothing_is_never_followed(tmp_path):
    os.symlink(tmp_path / "created", tmp_path / "snap.pickle")
    for named in (True, False):
        with pytest.raises(OSError):
            write_file_safely(tmp_path / "snap.pickle", b"x", named_by_user=named)
    assert not (tmp_path / "created").exists()
    assert os.listdir(tmp_path) == ["snap.pickle"]


def test_issue30_item10_a_replaced_file_keeps_its_mode_and_a_new_one_honours_the_umask(tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_bytes(b"old")
    os.chmod(kept, 0o600)
    write_file_safely(kept, b"new")
    assert (os.stat(kept).st_mode & 0o777) == 0o600
    old = os.umask(0o077)
    try:
        write_file_safely(tmp_path / "new.json", b"x")
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "new.json").st_mode & 0o777) == 0o600
    old = os.umask(0o022)
    try:
        write_file_safely(tmp_path / "open.json", b"x")
    finally:
        os.umask(old)
    assert (os.stat(tmp_path / "open.json").st_mode & 0o777) == 0o644
