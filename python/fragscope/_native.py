"""Finds and loads the native module ``_fragscope_native`` (python/native/, built by CMake).

Where it looks, first match wins:

1. ``$FRAGSCOPE_NATIVE_DIR`` (a directory holding ``_fragscope_native*.so``);
2. next to this package (an installed copy: ``python/_fragscope_native*.so``);
3. the build trees of the repository this package sits in: ``build/release/python``
   (``make demo``), ``build/dev/python`` (``make build``/``make test``), ``build/bench/python``.

Every failure is an ImportError that says what is missing and how to get it.
"""
import glob
import importlib.machinery
import importlib.util
import os
import sys

_MODULE = "_fragscope_native"
_HINT = ("build it with `make demo` (release build) or `cmake --preset dev && cmake --build "
         "--preset dev --target _fragscope_native`; it needs Debian's libtorch-dev, "
         "pybind11-dev and python3-dev (tools/install-deps.sh installs them)")


def search_dirs():
    here = os.path.dirname(os.path.abspath(__file__))
    python_dir = os.path.dirname(here)
    repo = os.path.dirname(python_dir)
    dirs = []
    env = os.environ.get("FRAGSCOPE_NATIVE_DIR")
    if env:
        dirs.append(env)
    dirs.append(python_dir)
    for preset in ("release", "dev", "bench"):
        dirs.append(os.path.join(repo, "build", preset, "python"))
    return dirs


def _find():
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for d in search_dirs():
        for suffix in suffixes:
            path = os.path.join(d, _MODULE + suffix)
            if os.path.isfile(path):
                return path
    return None


def _torch_series(version):
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


def load():
    """The native module, with torch imported first.  ImportError with a clear reason if the
    module is not built, was built for another interpreter, or for another torch."""
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    try:
        import torch
    except ImportError as e:
        raise ImportError("fragscope.torch needs PyTorch, which this interpreter ({}) cannot "
                          "import: {}; on Debian use /usr/bin/python3 with python3-torch".format(
                              sys.executable, e)) from None
    path = _find()
    if path is None:
        others = [p for d in search_dirs() for p in glob.glob(os.path.join(d, _MODULE + "*"))]
        if others:
            raise ImportError(
                "fragscope.torch: the native module was built for another Python ({}); this is "
                "{} {}.{}: {}".format(", ".join(sorted(others)), sys.executable,
                                      sys.version_info[0], sys.version_info[1], _HINT))
        raise ImportError("fragscope.torch: the native module {} is not built (looked in {}); "
                          "{}".format(_MODULE, ", ".join(search_dirs()), _HINT))
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ImportError("fragscope.torch: cannot load {}: {} (it was built against another "
                          "libtorch than this torch {}?); {}".format(
                              path, e, torch.__version__, _HINT)) from None
    built = module.TORCH_BUILD_VERSION
    if _torch_series(built) != _torch_series(torch.__version__):
        raise ImportError(
            "fragscope.torch: the native module {} was built against libtorch {}, but this "
            "process runs torch {}; rebuild it against the torch you run ({})".format(
                path, built, torch.__version__, _HINT))
    sys.modules[_MODULE] = module
    return module
