"""Two Lightning ranks (torchrun, gloo) on virtual GPUs under fragscope's Monitor; rank 1's batches
grow until the default allocator settings fragment its 48 MiB (docs/live-monitoring.md)."""
import importlib, os, random, sys  # noqa: E401
import torch
L = importlib.import_module(os.environ.get("FRAGSCOPE_TEST_LIGHTNING", "lightning"))  # or pytorch_lightning
from fragscope.torch import Monitor, virtual_gpu
from fragscope.torch.monitor_adapters import lightning_callback

run_dir, steps, monitored = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "monitor"
monitor = Monitor(run_dir=run_dir, every=10, apply_recommendation=True) if monitored else None
gpu = virtual_gpu("48MiB").start()  # after the Monitor: it reads the setting a restart applied
rank = int(os.environ["RANK"])

class Growing(torch.utils.data.IterableDataset):  # noqa: E302
    def __iter__(self):
        while True:
            step = trainer.global_step
            yield torch.randn(random.Random(step).randint(64, 64 + 16 * min(step, 170) if rank else 64), 128)

class Net(L.LightningModule):  # noqa: E302
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 128))
    def training_step(self, x, _): return self.net(x).pow(2).mean()  # noqa: E301,E704
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)  # noqa: E301,E704

trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, logger=False, enable_progress_bar=False,
                    default_root_dir=run_dir, enable_checkpointing=False,
                    enable_model_summary=False, callbacks=[lightning_callback(monitor)] if monitor else [])
saved = sorted((f for f in os.listdir(run_dir) if f.endswith(".ckpt")), key=lambda f: int(f[14:-5]))
try:
    trainer.fit(Net(), torch.utils.data.DataLoader(Growing(), batch_size=None),
                ckpt_path=os.path.join(run_dir, saved[-1]) if saved else None)
except torch.cuda.OutOfMemoryError as e:
    sys.exit("fragscope-test: rank {} out of memory at step {}: {}".format(rank, trainer.global_step, e))
print("fragscope-test: rank {} finished at step {} with {!r}".format(rank, trainer.global_step, gpu.alloc_conf))
if monitor:
    monitor.exit_if_stopped()  # destroys the process group before exiting 75
if torch.distributed.is_initialized():  # as PyTorch documents, before the end
    torch.distributed.destroy_process_group()
# Even so, the teardown of a gloo run can abort (PyTorch issue #190489): a job that finished
# would then fail. Leave without it, as the monitor's own exit does.
sys.stdout.flush()
os._exit(0)
