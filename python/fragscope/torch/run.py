"""Runs a Python script on a virtual GPU, unchanged (docs/virtual-gpu.md):

    python -m fragscope.torch.run --capacity 80GiB [options] train.py [script args]
    FRAGSCOPE_VIRTUAL_GPU=80GiB python -m fragscope.torch.run train.py [script args]

Options override the FRAGSCOPE_VIRTUAL_GPU* variables.  At exit it prints the virtual GPU's
peak figures and the OOM, if one happened, on stderr.
"""
import argparse
import os
import runpy
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fragscope.torch.run",
        description="Run a PyTorch script on the CPU with a virtual GPU: its allocations go "
                    "through fragscope's model of PyTorch's CUDA caching allocator.")
    parser.add_argument("--capacity", help="GPU memory, e.g. 80GiB (or $FRAGSCOPE_VIRTUAL_GPU)")
    parser.add_argument("--alloc-conf", help="PYTORCH_CUDA_ALLOC_CONF to model")
    parser.add_argument("--torch-version", choices=("1.13", "2", "newest"))
    parser.add_argument("--used-by-others", help="memory the allocator cannot have, e.g. 600MiB")
    parser.add_argument("--on-oom", choices=("raise", "record"))
    parser.add_argument("--snapshot", help="write a memory snapshot (pickle) here at exit")
    parser.add_argument("--trace", help="write the request trace here at exit")
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = parser.parse_args(argv)
    names = {"capacity": "", "alloc_conf": "_ALLOC_CONF", "torch_version": "_TORCH_VERSION",
             "used_by_others": "_USED_BY_OTHERS", "on_oom": "_ON_OOM",
             "snapshot": "_SNAPSHOT", "trace": "_TRACE"}
    for attr, suffix in names.items():
        value = getattr(args, attr)
        if value is not None:
            os.environ["FRAGSCOPE_VIRTUAL_GPU" + suffix] = value
    if not os.environ.get("FRAGSCOPE_VIRTUAL_GPU"):
        parser.error("give --capacity or set FRAGSCOPE_VIRTUAL_GPU")
    try:
        import fragscope.torch as fst
        gpu = fst.current() if fst.current() is not None else fst.from_environment()
    except (ImportError, ValueError) as e:
        print("fragscope.torch.run: {}".format(e), file=sys.stderr)
        return 2
    sys.argv = [args.script] + list(args.args)
    code = 0
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        stats = gpu.memory_stats()
        print("fragscope.torch.run: virtual GPU of {} bytes: reserved peak {}, allocated peak "
              "{}, OOMs {}".format(gpu.capacity, stats["reserved_bytes.all.peak"],
                                   stats["allocated_bytes.all.peak"], stats["num_ooms"]),
              file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
