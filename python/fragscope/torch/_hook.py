"""The virtual GPU's hook into c10 (fragscope/torch/csrc/, docs/virtual-gpu.md), compiled against
the torch this process runs.

A hook built for one torch cannot serve another (c10's allocator interface and its C++ ABI change
between releases), and a wheel cannot know which torch its user will run. So the hook is built
here, once per torch version, with Torch's own CMake package (``torch.utils.cmake_prefix_path``),
and kept in a cache:

1. ``$FRAGSCOPE_TORCH_HOOK``: a built ``libfragscope_torch_hook.so`` to use as it is;
2. the repository's build trees (``build/<preset>/python/torch_hook``, built against Debian's
   libtorch-dev), when it was built for this torch;
3. ``$FRAGSCOPE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fragscope``, i.e. ``~/.cache/fragscope``)
   ``/torch-hook/<torch version>-<digest of the sources>/``;
4. else it is compiled into that cache (CMake >= 3.18 and a C++20 compiler; about a minute),
   saying so on stderr. Concurrent processes (the ranks of one job) wait for one build.

Every failure is an ImportError that names what is missing, the log, and how to fix it.
"""
import ctypes
import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
LIBRARY = "libfragscope_torch_hook.so"
ENV_HOOK = "FRAGSCOPE_TORCH_HOOK"
ENV_CACHE = "FRAGSCOPE_CACHE_DIR"
BUILD_TIMEOUT_S = 1800


def _series(version):
    """"2.13" of "2.13.0+cpu"."""
    return ".".join(version.split("+")[0].split(".")[:2])


def cache_dir():
    root = os.environ.get(ENV_CACHE)
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "fragscope")
    return os.path.join(root, "torch-hook")


def _digest():
    h = hashlib.sha256()
    for name in sorted(os.listdir(SOURCE_DIR)):
        if name.endswith((".cc", ".h", ".txt")):
            h.update(name.encode())
            with open(os.path.join(SOURCE_DIR, name), "rb") as f:
                h.update(f.read())
    return h.hexdigest()[:12]


def _key(torch):
    version = re.sub(r"[^0-9A-Za-z.+_-]", "_", torch.__version__)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return "{}-{}-abi{}-{}".format(version, platform.machine(), abi, _digest())


def _repo_builds():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(SOURCE_DIR))))
    return [os.path.join(repo, "build", preset, "python", "torch_hook", LIBRARY)
            for preset in ("release", "dev", "bench")]


class Hook:
    """The loaded library, its C functions typed."""

    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        lib.fragscope_hook_torch_version.restype = ctypes.c_char_p
        lib.fragscope_hook_api_version.restype = ctypes.c_uint32
        lib.fragscope_hook_start.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.fragscope_hook_start.restype = ctypes.c_int
        lib.fragscope_hook_stop.restype = None
        lib.fragscope_user_scope_new.argtypes = [ctypes.c_char_p]
        lib.fragscope_user_scope_new.restype = ctypes.c_void_p
        for name in ("enter", "exit", "delete"):
            fn = getattr(lib, "fragscope_user_scope_" + name)
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = None
        lib.fragscope_scopes_entered_on_this_thread.restype = ctypes.c_uint64
        self.lib = lib
        self.torch_version = lib.fragscope_hook_torch_version().decode()
        self.api_version = lib.fragscope_hook_api_version()

    def start(self, api_address, track_scopes):
        rc = self.lib.fragscope_hook_start(ctypes.c_void_p(api_address), int(track_scopes))
        if rc == -1:
            raise RuntimeError("fragscope.torch: the hook {} speaks another version of the core's "
                               "interface; delete it to rebuild".format(self.path))
        if rc == -2:
            raise RuntimeError("virtual GPU: cannot start in a forked child process")
        if rc != 0:
            raise RuntimeError("fragscope.torch: torch refused the virtual GPU's allocator "
                               "({})".format(self.path))

    def stop(self):
        self.lib.fragscope_hook_stop()

    def scopes_entered_on_this_thread(self):
        return self.lib.fragscope_scopes_entered_on_this_thread()


class UserScope:
    """A record_function range that allocates nothing (cpu_only.h): Optimizer.step#... stays
    visible to profilers and to the CPU-only rules."""

    def __init__(self, hook, name):
        self._lib = hook.lib
        self._scope = self._lib.fragscope_user_scope_new(name.encode("utf-8", "replace"))
        if not self._scope:
            raise MemoryError("fragscope.torch: cannot make a record_function scope")

    def enter(self):
        self._lib.fragscope_user_scope_enter(self._scope)

    def exit(self):
        self._lib.fragscope_user_scope_exit(self._scope)

    def __del__(self):
        scope, self._scope = getattr(self, "_scope", None), None
        if scope:
            self._lib.fragscope_user_scope_delete(scope)


def built_for(path):
    """The torch version a hook was built against, from the file CMake writes beside it, or None.
    Read before loading: a hook of another torch would pull that torch's libraries in."""
    try:
        with open(path + ".torch-version") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _matches(path, torch):
    """The Hook at `path` if it was built for this torch's major.minor and loads, else None."""
    version = built_for(path)
    if version is None or _series(version) != _series(torch.__version__):
        return None
    try:
        hook = Hook(path)
    except (OSError, AttributeError):
        return None
    if _series(hook.torch_version) != _series(torch.__version__):
        return None
    return hook


def _tool(name, module):
    """The path of a command: on PATH, else from the PyPI package of that name."""
    path = shutil.which(name)
    if path:
        return path
    try:
        mod = __import__(module)
        candidate = os.path.join(mod.BIN_DIR, name)
        return candidate if os.path.exists(candidate) else None
    except (ImportError, AttributeError):
        return None


def _build(torch, target_dir):
    cmake = _tool("cmake", "cmake")
    if cmake is None:
        raise ImportError("fragscope.torch: the virtual GPU's hook must be compiled against torch "
                          "{} once, and that needs CMake (>= 3.18): `pip install cmake ninja` or "
                          "`apt-get install cmake`".format(torch.__version__))
    ninja = _tool("ninja", "ninja")
    os.makedirs(os.path.dirname(target_dir), exist_ok=True)
    work = tempfile.mkdtemp(prefix="build-", dir=os.path.dirname(target_dir))
    log_path = os.path.join(work, "build.log")
    prefix = getattr(torch.utils, "cmake_prefix_path", "")
    configure = [cmake, "-S", SOURCE_DIR, "-B", os.path.join(work, "build"),
                 "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_PREFIX_PATH=" + prefix]
    if ninja:
        configure += ["-G", "Ninja", "-DCMAKE_MAKE_PROGRAM=" + ninja]
    build = [cmake, "--build", os.path.join(work, "build"), "--parallel", "2"]
    print("fragscope.torch: compiling the virtual GPU's hook against torch {} (once; about a "
          "minute; cached in {})".format(torch.__version__, target_dir), file=sys.stderr,
          flush=True)
    env = dict(os.environ)
    env.pop("CMAKE_CXX_COMPILER_LAUNCHER", None)  # the user's launcher may not be installed
    with open(log_path, "w") as log:
        for command in (configure, build):
            log.write("$ {}\n".format(" ".join(command)))
            log.flush()
            try:
                rc = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                tail = _tail(log_path)
                raise ImportError(
                    "fragscope.torch: compiling the virtual GPU's hook against torch {} failed "
                    "({}; the log: {}). It needs a C++20 compiler (g++ >= 10 or clang >= 12) "
                    "and torch's CMake package ({}).{}".format(
                        torch.__version__, "step '{}' exited {}".format(command[1], rc),
                        log_path, prefix or "torch.utils.cmake_prefix_path is missing",
                        "\n" + tail if tail else ""))
    built = os.path.join(work, "build", LIBRARY)
    staged = os.path.join(work, "out")
    os.makedirs(staged)
    shutil.copy2(built, os.path.join(staged, LIBRARY))
    shutil.copy2(built + ".torch-version", os.path.join(staged, LIBRARY + ".torch-version"))
    shutil.copy2(log_path, os.path.join(staged, "build.log"))
    os.rename(staged, target_dir)  # atomic: a reader sees the whole directory or none
    shutil.rmtree(work, ignore_errors=True)


def _tail(path, lines=12):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def load(torch):
    """The Hook for the running torch, built first if needed (see the module's doc)."""
    explicit = os.environ.get(ENV_HOOK)
    if explicit:
        version = built_for(explicit)
        if version is not None and _series(version) != _series(torch.__version__):
            raise ImportError("fragscope.torch: ${}={} was built against torch {}, but this "
                              "process runs torch {}; unset it to build one for this torch"
                              .format(ENV_HOOK, explicit, version, torch.__version__))
        try:
            hook = Hook(explicit)
        except (OSError, AttributeError) as e:
            raise ImportError("fragscope.torch: ${}={} cannot be loaded: {}".format(
                ENV_HOOK, explicit, e)) from None
        if _series(hook.torch_version) != _series(torch.__version__):
            raise ImportError("fragscope.torch: ${}={} was built against torch {}, but this "
                              "process runs torch {}; unset it to build one for this torch"
                              .format(ENV_HOOK, explicit, hook.torch_version, torch.__version__))
        return hook
    for path in _repo_builds():
        if os.path.exists(path):
            hook = _matches(path, torch)
            if hook is not None:
                return hook
    target = os.path.join(cache_dir(), _key(torch))
    library = os.path.join(target, LIBRARY)
    if not os.path.exists(library):
        os.makedirs(cache_dir(), exist_ok=True)
        with open(target + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build; the other ranks wait for it
            if not os.path.exists(library):
                _build(torch, target)
    hook = _matches(library, torch)
    if hook is None:
        raise ImportError("fragscope.torch: the hook {} does not load into this torch {}; delete "
                          "{} to rebuild it".format(library, torch.__version__, target))
    return hook
