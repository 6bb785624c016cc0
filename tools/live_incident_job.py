"""One rank of the live-loop incident (tools/live_incident.py; docs/live-monitoring.md).

Run under torchrun (gloo, CPU): every rank trains a small MLP on its own virtual GPU; rank
--oom-rank gets random sequences whose longest length grows with the step, the others short
ones, so that with PyTorch's default allocator settings rank --oom-rank runs out of memory
through fragmentation. With --monitor, a fragscope.torch.Monitor watches every rank, and they
all checkpoint at the same step, exit for torchrun to restart, and resume with the recommended
PYTORCH_CUDA_ALLOC_CONF. Each rank appends what happens to <run-dir>/events-rank<R>.jsonl.
"""
import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=380, help="the last step is steps - 1")
    p.add_argument("--oom-rank", type=int, default=1)
    p.add_argument("--growth", type=int, default=8, help="longest sequence: 64 + growth*step")
    p.add_argument("--capacity", default="48MiB")
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--monitor", action="store_true")
    p.add_argument("--die-rank", type=int, default=-1,
                   help="this rank dies (os._exit(9)) at --die-step (tests of the fault)")
    p.add_argument("--die-step", type=int, default=-1)
    p.add_argument("--fail-checkpoint-rank", type=int, default=-1,
                   help="this rank's checkpoint raises (tests of the fault)")
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.makedirs(args.run_dir, exist_ok=True)
    log_path = os.path.join(args.run_dir, "events-rank{}.jsonl".format(rank))

    def event(kind, **fields):
        fields.update(event=kind, rank=rank, restart=restart, time=time.time())
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields) + "\n")

    import torch
    import torch.distributed as dist
    import fragscope.torch as ft
    from fragscope.torch.monitor import Monitor

    ckpt = os.path.join(args.run_dir, "ckpt-rank{}.pt".format(rank))
    state = {"step": -1}
    model = opt = None

    def save(step):
        if rank == args.fail_checkpoint_rank:
            raise OSError("injected checkpoint failure")
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()},
                   ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
        event("checkpoint", step=step)

    monitor = None
    if args.monitor:  # made before the first allocation: it may set PYTORCH_CUDA_ALLOC_CONF
        monitor = Monitor(every=args.every, save_checkpoint=save, run_dir=args.run_dir,
                          job=os.environ.get("FRAGSCOPE_JOB", "live-incident"),
                          socket=os.environ.get("FRAGSCOPE_AGENT_SOCKET", "/nonexistent"))
    dist.init_process_group("gloo")
    gpu = ft.virtual_gpu(args.capacity, torch_version="newest", on_oom="raise").start()
    event("start", alloc_conf=gpu.alloc_conf,
          applied=monitor.applied if monitor is not None else None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        event("resume", step=start)
    warned = False
    step = start
    try:
        for step in range(start, args.steps):
            rng = random.Random(step)
            longest = 64 + args.growth * step if rank == args.oom_rank else 64
            x = torch.randn(rng.randint(64, longest), 128)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            gpu.step(step)
            if rank == args.die_rank and step == args.die_step and restart == 0:
                event("died", step=step)
                os._exit(9)  # no cleanup: as a crash or a kill would
            if monitor is not None:
                monitor.step(step)  # exits with monitor.exit_code after the checkpoint
                last = monitor.last
                if last and not warned and last["worst"] in ("warning", "critical"):
                    warned = True
                    event("warning", step=last["step"], level=last["level"],
                          worst=last["worst"], levels=last["levels"])
                if last and last["step"] == step:
                    risk = last.get("risk") or {}
                    event("sample", step=step, level=last["level"], worst=last["worst"],
                          risk100=risk.get(100))
    except torch.cuda.OutOfMemoryError as e:
        event("oom", step=step, message=str(e).splitlines()[0])
        print("rank {}: out of memory at step {}".format(rank, step), file=sys.stderr)
        sys.exit(1)
    event("finished", step=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
