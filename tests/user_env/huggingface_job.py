"""Two transformers Trainer ranks (torchrun, gloo) on virtual GPUs under fragscope's Monitor; rank 1's
activations grow until the default allocator settings fragment its 48 MiB (docs/live-monitoring.md)."""
import os, random, sys  # noqa: E401
import torch, transformers  # noqa: E401
from fragscope.torch import Monitor, virtual_gpu
from fragscope.torch.monitor_adapters import huggingface_callback

run_dir, steps, monitored = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "monitor"
monitor = Monitor(run_dir=run_dir, every=10, apply_recommendation=True) if monitored else None
gpu = virtual_gpu("48MiB").start()  # after the Monitor: it reads the setting a restart applied
rank = int(os.environ["RANK"])
_load = torch.load  # transformers < 5.24 resumes CPU DDP with map_location=cpu:0, which torch cannot restore
torch.load = lambda *a, map_location=None, **k: _load(*a, map_location="cpu" if str(map_location).startswith("cpu") else map_location, **k)  # noqa: E731,E501

class Tokens(torch.utils.data.Dataset):  # noqa: E302
    def __len__(self): return 1 << 20  # noqa: E301,E704
    def __getitem__(self, i): return {"x": torch.zeros(1)}  # noqa: E301,E704

class Net(torch.nn.Module):  # noqa: E302
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 128))
    def forward(self, x):  # noqa: E301
        step = trainer.state.global_step  # the batch of this step: rank 1's grow
        h = torch.randn(random.Random(step).randint(64, 64 + 16 * min(step, 170) if rank else 64), 128)
        return {"loss": self.net(h).pow(2).mean() + 0 * x.sum()}

args = transformers.TrainingArguments(  # noqa: E305
    output_dir=run_dir, max_steps=steps, per_device_train_batch_size=1, learning_rate=0.01, use_cpu=True,
    save_strategy="no", report_to="none", disable_tqdm=True, logging_strategy="no", ignore_data_skip=True)
trainer = transformers.Trainer(model=Net(), args=args, train_dataset=Tokens(),
                               callbacks=[huggingface_callback(monitor)] if monitor else [])
saved = sorted((f for f in os.listdir(run_dir) if f.startswith("checkpoint-")), key=lambda f: int(f[11:]))
try:
    trainer.train(resume_from_checkpoint=os.path.join(run_dir, saved[-1]) if saved else None)
except torch.cuda.OutOfMemoryError as e:
    sys.exit("fragscope-test: rank {} out of memory at step {}: {}".format(rank, trainer.state.global_step, e))
print("fragscope-test: rank {} finished at step {} with {!r}".format(rank, trainer.state.global_step, gpu.alloc_conf))
if monitor:
    monitor.exit_if_stopped()  # destroys the process group before exiting 75
if torch.distributed.is_initialized():  # as PyTorch documents, before the end
    torch.distributed.destroy_process_group()
# Even so, the teardown of a gloo run can abort (PyTorch issue #190489): a job that finished
# would then fail. Leave without it, as the monitor's own exit does.
sys.stdout.flush()
os._exit(0)
