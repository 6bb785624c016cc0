"""Finds and loads fragscope's native core, ``fragscope._core`` (python/native/, built by CMake;
it links no framework, so loading it imports nothing else).

Where it looks, first match wins:

1. an installed copy inside the package (``pip install .`` puts it there);
2. ``$FRAGSCOPE_NATIVE_DIR`` (a directory holding ``_core*.so``);
3. the build trees of the repository this package sits in: ``build/release/python/fragscope``
   (``make demo``), ``build/dev/python/fragscope`` (``make build``/``make test``),
   ``build/bench/python/fragscope``.

Every failure is an ImportError that says what is missing and how to get it.
"""
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import sys

_MODULE = "fragscope._core"
_HINT = ("install the package with `pip install .` from fragscope's source tree, or build it in "
         "the tree with `make build` (or `cmake --preset dev && cmake --build --preset dev "
         "--target fragscope_core`; it needs pybind11 and Python's headers, which "
         "tools/install-deps.sh installs on Debian)")


def search_dirs():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    dirs = []
    env = os.environ.get("FRAGSCOPE_NATIVE_DIR")
    if env:
        dirs.append(env)
    for preset in ("release", "dev", "bench"):
        dirs.append(os.path.join(repo, "build", preset, "python", "fragscope"))
    return dirs


def _find():
    for d in search_dirs():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(d, "_core" + suffix)
            if os.path.isfile(path):
                return path
    return None


def load():
    """The native core module. ImportError with a clear reason if it is not built or was built
    for another interpreter."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        return module
    here = os.path.dirname(os.path.abspath(__file__))
    installed = [p for s in importlib.machinery.EXTENSION_SUFFIXES
                 for p in [os.path.join(here, "_core" + s)] if os.path.isfile(p)]
    path = installed[0] if installed else _find()
    if path is None:
        others = [p for d in [here] + search_dirs() for p in glob.glob(os.path.join(d, "_core*"))]
        if others:
            raise ImportError(
                "fragscope: the native core was built for another Python ({}); this is {} "
                "{}.{}: {}".format(", ".join(sorted(others)), sys.executable,
                                   sys.version_info[0], sys.version_info[1], _HINT))
        raise ImportError("fragscope: the native core {} is not built (looked in {}); {}".format(
            _MODULE, ", ".join([here] + search_dirs()), _HINT))
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise ImportError("fragscope: cannot load {}: {}; {}".format(path, e, _HINT)) from None
    sys.modules[_MODULE] = module
    return module
