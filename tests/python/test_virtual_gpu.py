"""The virtual GPU with real PyTorch: figures, OOM, bad input, CPU-only allocations, threads,
fork, the environment switch and the import errors (docs/virtual-gpu.md)."""
import gc
import os
import subprocess
import sys
import threading

import pytest

from conftest import PYTHON, fragscope_bin, replay_json, subprocess_env

torch = pytest.importorskip("torch")

MiB = 1 << 20


def test_figures_follow_allocations_and_frees(fst):
    with fst.virtual_gpu("1GiB", torch_version="1.13") as gpu:
        a = torch.empty(1000, dtype=torch.uint8)
        s = gpu.memory_stats()
        assert s["allocated_bytes.all.current"] == 1024  # rounded to 512
        assert s["requested_bytes.all.current"] == 1000
        assert s["reserved_bytes.small_pool.current"] == 2 * MiB
        assert s["allocation.all.current"] == 1
        big = torch.empty(3 * MiB, dtype=torch.uint8)
        assert gpu.memory_stats()["reserved_bytes.large_pool.current"] == 20 * MiB
        assert gpu.mem_get_info() == ((1 << 30) - 22 * MiB, 1 << 30)
        segments = gpu.memory_snapshot()
        assert sorted(seg["segment_type"] for seg in segments) == ["large", "small"]
        del a, big
        s = gpu.memory_stats()
        assert s["allocated_bytes.all.current"] == 0
        assert s["reserved_bytes.all.current"] == 22 * MiB  # cached, as PyTorch keeps it
        gpu.empty_cache()
        assert gpu.memory_stats()["reserved_bytes.all.current"] == 0
        gpu.reset_peak_memory_stats()
        assert gpu.memory_stats()["allocated_bytes.all.peak"] == 0
        assert fst.current() is gpu and fst.max_memory_reserved() == 0
        assert fst.memory_allocated() == 0 and fst.memory_reserved() == 0
        assert gpu.counters()["allocs"] == 2 and gpu.counters()["frees"] == 2


def test_storages_from_before_the_session_are_not_seen(fst):
    before = torch.ones(1 << 16)
    with fst.virtual_gpu("1GiB") as gpu:
        del before
        x = torch.ones(10)
        s = gpu.memory_stats()
        assert s["allocation.all.allocated"] == 1
        assert s["allocation.all.freed"] == 0
        del x
    # After the session: allocations pass through, the figures stay.
    y = torch.ones(1 << 16)
    assert gpu.memory_stats()["allocation.all.allocated"] == 1
    del y


def test_oom_raises_pytorchs_error_at_the_failing_request(fst, tmp_path):
    with fst.virtual_gpu("64MiB", torch_version="1.13") as gpu:
        keep = torch.empty(40 * MiB, dtype=torch.uint8)
        with pytest.raises(fst.OutOfMemoryError) as info:
            torch.empty(30 * MiB, dtype=torch.uint8)
        assert isinstance(info.value, RuntimeError)
        ooms = gpu.ooms()
        assert len(ooms) == 1
        assert str(info.value) == ooms[0]["message"]
        assert str(info.value).startswith("CUDA out of memory. Tried to allocate 30.00 MiB")
        assert gpu.memory_stats()["num_ooms"] == 1
        trace = str(tmp_path / "oom.jsonl")
        gpu.dump_trace(trace)
        del keep
    replay = replay_json(trace, "--torch-version", "1.13")
    assert replay["oom"]["message"] == ooms[0]["message"]


def test_on_oom_record_goes_on(fst):
    with fst.virtual_gpu("64MiB", on_oom="record") as gpu:
        a = torch.empty(40 * MiB, dtype=torch.uint8)
        b = torch.empty(30 * MiB, dtype=torch.uint8)  # would fail: lives on the CPU
        c = torch.empty(MiB, dtype=torch.uint8)
        assert b.numel() == 30 * MiB
        s = gpu.memory_stats()
        assert s["num_ooms"] == 1
        assert s["allocation.all.current"] == 2  # a and c
        assert gpu.counters()["after_oom"] == 1
        del b  # not in the simulation: no effect
        assert gpu.memory_stats()["allocation.all.current"] == 2
        del a, c


@pytest.mark.parametrize("kwargs, token", [
    ({"capacity": "80GXB"}, "80GXB"),
    ({"capacity": "-5GiB"}, "-5GiB"),
    ({"capacity": 0}, "capacity"),
    ({"capacity": "8GiB", "alloc_conf": "max_split_size_mb:abc"}, "abc"),
    ({"capacity": "8GiB", "alloc_conf": "expandable_segmentz:True"}, "expandable_segmentz"),
    ({"capacity": "8GiB", "torch_version": "3.7"}, "3.7"),
    ({"capacity": "8GiB", "on_oom": "ignore"}, "ignore"),
    ({"capacity": "8GiB", "used_by_others": "9GiB"}, "used_by_others"),
])
def test_bad_input_is_a_clear_exception_naming_the_token(fst, kwargs, token):
    with pytest.raises(ValueError) as info:
        fst.virtual_gpu(**kwargs)
    assert token in str(info.value)
    assert fst.current() is None or not fst.current().active


def test_cpu_only_scalars_stay_outside(fst):
    x = torch.ones(256)
    with fst.virtual_gpu("1GiB") as gpu:
        y = x * 0.5  # wraps 0.5 into a 0-dim tensor, then a float32 copy of it
        c = gpu.counters()
        assert c["allocs"] == 1
        assert c["cpu_only"]["python_scalar"] == 1
        assert c["cpu_only"]["scalar_promotion"] == 1
        del y
    with fst.virtual_gpu("1GiB", keep_cpu_only=True) as gpu:
        y = x * 0.5
        assert gpu.counters()["allocs"] == 3
        del y


def test_optimizer_step_counters_stay_outside(fst):
    model = torch.nn.Linear(8, 8)
    with fst.virtual_gpu("1GiB") as gpu:
        opt = torch.optim.Adam(model.parameters())
        model(torch.ones(2, 8)).sum().backward()
        opt.step()
        assert gpu.counters()["cpu_only"]["adam_step_counter"] == 2
        assert gpu.counters()["cpu_only"]["record_function"] == 0
        del opt
    assert torch.autograd.profiler.record_function is not fst._RecordFunction


def test_threads_reach_the_model_in_one_consistent_order(fst, tmp_path):
    torch.set_num_threads(2)
    errors = []
    together = threading.Barrier(4)  # all alive at once: four distinct threads allocate

    def work(seed):
        try:
            together.wait()
            g = torch.Generator().manual_seed(seed)
            for i in range(150):
                n = int(torch.randint(1, 4096, (1,), generator=g))
                a = torch.empty(n * 97)
                b = a.view(-1)[:n].clone()
                if i % 10 == 0:
                    w = torch.randn(64, 64, requires_grad=True)
                    (w @ w).sum().backward()
                del a, b
            together.wait()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    try:
        with fst.virtual_gpu("2GiB", torch_version="1.13") as gpu:
            threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            gc.collect()
            s = gpu.memory_stats()
            c = gpu.counters()
            trace = str(tmp_path / "threads.jsonl")
            gpu.dump_trace(trace)
    finally:
        torch.set_num_threads(1)
    assert not errors
    assert c["threads"] >= 4
    assert s["allocation.all.allocated"] == c["allocs"] > 4 * 150
    assert s["allocation.all.current"] == 0 and s["allocated_bytes.all.current"] == 0
    # The order the threads' calls took is the order of the trace: replayed, same figures.
    replay = replay_json(trace, "--torch-version", "1.13", "--capacity", "2GiB")
    assert replay["devices"][0]["memory_stats"] == s


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((64,), float(i)) ** 2  # allocates in the worker


def test_forked_dataloader_workers_do_not_break_it(fst):
    with fst.virtual_gpu("1GiB") as gpu:
        loader = torch.utils.data.DataLoader(_Squares(), batch_size=4, num_workers=2)
        total = 0.0
        for batch in loader:
            total += float((batch + 1).sum())
        del loader, batch
        gc.collect()
        s = gpu.memory_stats()
    assert total == sum(64 * (i * i + 1) for i in range(16))
    assert s["allocation.all.current"] == 0


def test_a_forked_child_passes_through(fst):
    with fst.virtual_gpu("1GiB") as gpu:
        x = torch.ones(1000)
        pid = os.fork()
        if pid == 0:  # child: allocate and free, including the parent's tensor
            try:
                y = torch.ones(5000) + 1
                del y, x
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert gpu.memory_stats()["allocation.all.allocated"] == 1
        del x


SCRIPT = """
import torch
x = torch.randn(512, 512)
y = (x @ x).sum()
print("ok", float(y) == float(y))
"""


def test_environment_switch_and_launcher(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    snap, trace = tmp_path / "s.pickle", tmp_path / "t.jsonl"
    proc = subprocess.run(
        [PYTHON, "-m", "fragscope.torch.run", "--snapshot", str(snap), "--trace", str(trace),
         str(script)], capture_output=True, text=True, timeout=120,
        env=subprocess_env(FRAGSCOPE_VIRTUAL_GPU="1GiB"))
    if "not built" in proc.stderr:
        pytest.skip(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    assert "ok True" in proc.stdout
    # x and x @ x are 1 MiB each: small-pool requests, one 2 MiB segment each.
    assert "reserved peak 4194304" in proc.stderr
    analyzed = subprocess.run([fragscope_bin(), "analyze", str(snap)], capture_output=True,
                              text=True, timeout=120)
    assert analyzed.returncode == 0, analyzed.stderr
    replay = replay_json(str(trace))  # capacity and settings from the header
    assert replay["devices"][0]["capacity_bytes"] == 1 << 30


def test_bad_environment_value_names_the_variable_and_token():
    proc = subprocess.run([PYTHON, "-c", "import fragscope.torch"], capture_output=True,
                          text=True, timeout=120,
                          env=subprocess_env(FRAGSCOPE_VIRTUAL_GPU="12XB"))
    if "not built" in proc.stderr:
        pytest.skip(proc.stderr)
    assert proc.returncode != 0
    assert "FRAGSCOPE_VIRTUAL_GPU" in proc.stderr and "12XB" in proc.stderr
    assert "Segmentation" not in proc.stderr


def test_missing_native_core_or_mismatched_hook_is_a_clear_import_error(fst, monkeypatch,
                                                                          tmp_path):
    from fragscope import _native
    from fragscope.torch import _hook
    module = sys.modules.pop("fragscope._core")
    try:
        monkeypatch.setattr(_native, "search_dirs", lambda: [str(tmp_path)])
        monkeypatch.setattr(_native.os.path, "isfile",
                            lambda p: False if "_core" in p else os.path.isfile(p))
        with pytest.raises(ImportError, match="is not built.*pip install"):
            _native.load()
    finally:
        sys.modules["fragscope._core"] = module
        monkeypatch.undo()
    # A hook built for another torch is refused with what to do, never loaded into this one.
    path = fst.hook().path
    monkeypatch.setattr(torch, "__version__", "2.4.0")
    monkeypatch.setenv("FRAGSCOPE_TORCH_HOOK", path)
    with pytest.raises(ImportError, match="built against torch 1.13.*process runs torch 2.4.0"):
        _hook.load(torch)
