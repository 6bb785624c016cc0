"""Writing a file safely, by the rule fragscope's C++ side follows (src/common/safe_file.h;
docs/user-guide.md, "Files and links"; issue 24 item 4).

The bytes go to a new temporary file next to the target (tempfile.mkstemp: O_CREAT|O_EXCL,
and O_NOFOLLOW where the system has it, under a random dot name) and are renamed onto the
target when complete, so a reader never sees half a file and a planted temporary is never
opened. A symbolic link at the target is refused when the program chose the path (the
monitor's recommendation and OOM snapshot in its run directory); when the caller named the path
(dump_snapshot(path)) a link to an existing regular file is followed and that file replaced. A
link to nothing is always refused: its target is never created.

Modes: a replaced file keeps its mode; a new one gets 0666 less the process's umask, as
open(2) would give it (issue 30 item 10).
"""

import contextlib
import errno
import os
import stat
import tempfile


def _target(path, named_by_user):
    """Where the rename goes, or OSError saying why not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISREG(st.st_mode):
        return path
    if not stat.S_ISLNK(st.st_mode):
        raise OSError(errno.EEXIST, "{}: exists and is not a regular file; refusing to replace "
                      "it".format(path))
    points_to = os.readlink(path)
    if not named_by_user:
        raise OSError(errno.ELOOP, "{}: is a symbolic link (to {}); fragscope does not write "
                      "through a link at a path it chose itself".format(path, points_to))
    real = os.path.realpath(path)
    try:
        target_st = os.stat(real)
    except FileNotFoundError:
        raise OSError(errno.ENOENT, "{}: is a symbolic link to {}, which does not exist; "
                      "fragscope does not create a link's target".format(path, points_to))
    if not stat.S_ISREG(target_st.st_mode):
        raise OSError(errno.EEXIST, "{}: is a symbolic link to {}, which is not a regular "
                      "file; refusing to replace it".format(path, real))
    return real


def _umask():
    """The process's umask, read without changing it where Linux tells (/proc, >= 4.7)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # the portable way: set and restore
    os.umask(mask)
    return mask


def _mode_for(target, mode):
    if mode is not None:
        return mode
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def open_safely(path, named_by_user=False, mode=None):
    """A binary file object for the new content of `path`; renamed onto it when the block
    ends normally, removed when it raises. Raises OSError for a refused target. `mode`: None
    keeps the replaced file's mode, or gives a new file 0666 less the umask."""
    target = _target(os.fspath(path), named_by_user)
    directory, name = os.path.split(target)
    fd, temp = tempfile.mkstemp(dir=directory or ".", prefix="." + name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_for(target, mode))
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def write_file_safely(path, data, named_by_user=False, mode=None):
    """Replaces `path` with `data` (bytes) through open_safely."""
    with open_safely(path, named_by_user=named_by_user, mode=mode) as f:
        f.write(data)
