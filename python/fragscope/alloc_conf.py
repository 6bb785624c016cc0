"""PyTorch's allocator-settings variable as each torch version reads it (docs/allocator-config.md).

* torch < 2.9 reads ``PYTORCH_CUDA_ALLOC_CONF`` only.
* torch >= 2.9 also reads ``PYTORCH_ALLOC_CONF`` (the name its docs give) and keeps
  ``PYTORCH_CUDA_ALLOC_CONF`` as a deprecated alias. Which one wins when both are set changed
  between releases, so fragscope asks the running torch which string it took
  (``torch._C._accelerator_getAllocatorSettings``) rather than guessing.

The grammar itself (which keys, which values, in which version) is the C++ one, shared with the
CLI through fragscope._core: ``canonical(conf, version)``.

Nothing here imports torch; callers pass ``torch.__version__`` (and the module, to ask it).
"""
import os
import sys

NEW_NAME = "PYTORCH_ALLOC_CONF"
OLD_NAME = "PYTORCH_CUDA_ALLOC_CONF"
FIRST_WITH_NEW_NAME = (2, 9)
#: fragscope's modelled allocator versions (torch_version=), newest last.
MODELLED = ("1.13", "2", "newest")


def release(version):
    """(major, minor) of "2.13.0+cpu"; (99, 0) for what cannot be read (a newer build)."""
    parts = str(version).split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return 99, 0


def modelled_version(version):
    """The allocator fragscope models for torch `version`: "1.13" (1.x), "2" (2.0-2.8),
    "newest" (2.9 on)."""
    major, minor = release(version)
    if major < 2:
        return "1.13"
    if (major, minor) < FIRST_WITH_NEW_NAME:
        return "2"
    return "newest"


def names_read(version):
    """The variables torch `version` reads, the documented one first."""
    if release(version) >= FIRST_WITH_NEW_NAME:
        return (NEW_NAME, OLD_NAME)
    return (OLD_NAME,)


def read(version, environ=None, torch=None):
    """(settings, variable) the way torch `version` reads its environment: ("", None) when
    nothing is set. With both names set to different strings on torch >= 2.9, the one the running
    torch took (asked through `torch`, when given and it is that version) wins; else the alias,
    as torch 2.13 does. Logs once when only the deprecated alias is used on such a torch."""
    env = os.environ if environ is None else environ
    names = names_read(version)
    present = [(env[n], n) for n in names if env.get(n) is not None]
    if not present:
        return "", None
    if len(present) == 1 or present[0][0] == present[1][0]:
        conf, name = present[0]
        if name == OLD_NAME and len(names) == 2 and len(present) == 1:
            _note_once("{} is the deprecated name from torch 2.9 on; {} is the one torch {} "
                       "documents".format(OLD_NAME, NEW_NAME, version))
        return conf, name
    taken = None
    getter = getattr(getattr(torch, "_C", None), "_accelerator_getAllocatorSettings", None)
    if getter is not None and release(torch.__version__) == release(version):
        try:
            taken = getter()
        except Exception:  # an older build's binding; fall back to the rule below
            taken = None
    for conf, name in present:
        if conf == taken:
            return conf, name
    return env[OLD_NAME], OLD_NAME


def apply(conf, version, environ=None):
    """Sets `conf` under the name torch `version` reads and returns that name. On torch >= 2.9
    the deprecated alias is removed, so that whichever name that release prefers, `conf` is the
    one it reads."""
    env = os.environ if environ is None else environ
    names = names_read(version)
    env[names[0]] = conf
    if len(names) == 2 and env.pop(OLD_NAME, None) is not None:
        _note_once("removed {} so that {} is the one torch {} reads".format(
            OLD_NAME, NEW_NAME, version))
    return names[0]


def canonical(conf, version, running=None):
    """`conf` validated as the allocator `version` ("1.13", "2", "newest") validates it, in its
    canonical form. A ValueError names the fault; for a key that version lacks it also says how
    to model a version that has it (`running`: the torch the process runs, for the message)."""
    from fragscope import _native
    try:
        return _native.load().canonical_alloc_conf(conf, version)
    except ValueError as e:
        newer = [v for v in MODELLED[MODELLED.index(version) + 1:]
                 if _accepts(conf, v)] if version in MODELLED else []
        if not newer:
            raise
        raise ValueError("{}. The allocator modelled is torch {}'s{}; a newer PyTorch has this "
                         "setting: pass torch_version={!r} (or set "
                         "FRAGSCOPE_VIRTUAL_GPU_TORCH_VERSION) to model it".format(
                             e, version, "" if running is None else
                             " (this process runs torch {})".format(running), newer[0])) from None


def _accepts(conf, version):
    from fragscope import _native
    try:
        _native.load().canonical_alloc_conf(conf, version)
        return True
    except ValueError:
        return False


_noted = set()


def _note_once(message):
    if message not in _noted:
        _noted.add(message)
        print("fragscope: " + message, file=sys.stderr, flush=True)
