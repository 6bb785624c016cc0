"""`pip install .` in a fresh venv (issue 28 items 2-4): the command on PATH, `import fragscope`
without torch, and the virtual GPU and Monitor against PyPI's torch 2.13."""
import json
import os
import re
import subprocess
import textwrap

import conftest


def test_the_command_is_on_path_and_runs_the_main_job(installed, tmp_path):
    proc = installed.run(["fragscope", "--version"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("fragscope"), proc.stdout
    proc = installed.run(["fragscope", "analyze", conftest.SAMPLE, "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"][0]["peak_live_requested"]["bytes"] > 0


def test_import_fragscope_needs_no_torch_and_is_quick(bare):
    # The native core links no framework: it loads and simulates where torch is not installed.
    code = textwrap.dedent("""
        import sys, time
        t = time.perf_counter()
        import fragscope
        took = time.perf_counter() - t
        from fragscope import _native
        core = _native.load()
        sim = core.Simulator(1 << 30, "expandable_segments:True")
        a = sim.malloc(3 << 20)
        sim.free(a)
        print(took, "torch" in sys.modules, core.canonical_alloc_conf(
            "PYTORCH_ALLOC_CONF=max_split_size_mb:128", "newest"),
            sim.memory_stats()["num_alloc_retries"])
    """)
    proc = bare.run([bare.python, "-c", code])
    assert proc.returncode == 0, proc.stderr
    took, torch_loaded, conf, retries = proc.stdout.split()
    assert torch_loaded == "False"
    assert conf == "max_split_size_mb:128" and retries == "0"
    assert float(took) < 0.1, took
    # And the torch adapter says plainly what is missing.
    proc = bare.run([bare.python, "-c", "import fragscope.torch"])
    assert proc.returncode != 0 and "fragscope.torch needs PyTorch" in proc.stderr, proc.stderr


VIRTUAL_GPU = textwrap.dedent("""
    import json, os, pickle, subprocess, sys
    import torch
    import fragscope.torch as fst
    out = {"torch": torch.__version__}
    with fst.virtual_gpu("256MiB") as gpu:
        out["version"] = gpu.torch_version
        out["alloc_conf"] = gpu.alloc_conf
        x = torch.randn(1024, 1024)
        y = torch.randn(4096, 256)
        del y
        stats = torch.cuda.memory_stats()          # 2.x code asks torch.cuda; the GPU answers
        out["stats_keys"] = sorted(stats)
        out["allocated"] = torch.cuda.memory_allocated()
        out["reserved"] = torch.cuda.memory_reserved()
        out["free_total"] = list(torch.cuda.mem_get_info())
        out["segments"] = len(torch.cuda.memory_snapshot())
        torch.cuda.memory._dump_snapshot(sys.argv[1])
        try:
            torch.zeros(1).cuda()
        except Exception as e:
            out["cuda_error"] = str(e)
        try:
            big = torch.empty(512 << 20, dtype=torch.uint8)
        except torch.cuda.OutOfMemoryError as e:
            out["oom"] = str(e)
        del x
    out["restored"] = torch.cuda.memory_stats is not gpu.memory_stats
    snap = pickle.load(open(sys.argv[1], "rb"))
    out["snapshot_keys"] = sorted(snap)
    out["block_keys"] = sorted(snap["segments"][0]["blocks"][0])
    out["trace_keys"] = sorted(snap["device_traces"][0][0])
    print(json.dumps(out))
""")


def test_virtual_gpu_answers_what_torch_2x_code_calls(installed, first_use, tmp_path):
    # The first use compiled the hook against this torch, into the cache, and said so.
    assert "compiling the virtual GPU's hook against torch 2.13" in first_use, first_use
    snap = str(tmp_path / "snap.pickle")
    proc = installed.run([installed.python, "-c", VIRTUAL_GPU, snap],
                         PYTORCH_ALLOC_CONF="expandable_segments:True")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Later uses load it from the cache, silently.
    assert "compiling" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["torch"].startswith("2.13") and out["version"] == "newest"
    # torch >= 2.9 reads PYTORCH_ALLOC_CONF.
    assert out["alloc_conf"] == "expandable_segments:True"
    # 2.x's memory_stats keys (requested_bytes came with 2.x) from torch.cuda itself.
    assert "requested_bytes.all.current" in out["stats_keys"]
    assert "allocated_bytes.all.peak" in out["stats_keys"]
    assert out["allocated"] >= 4 << 20 and out["reserved"] >= out["allocated"]
    free, total = out["free_total"]
    assert total == 256 << 20 and free == total - out["reserved"]
    assert out["segments"] >= 1
    assert "CPU build" in out["cuda_error"] and "virtual GPU" in out["cuda_error"]
    assert out["oom"].startswith("CUDA out of memory. Tried to allocate 512.00 MiB"), out["oom"]
    assert out["restored"]
    # The pickle has torch 2.13's format: allocator_settings and annotations at the top, block
    # addresses and frames, time_us and user_metadata on trace entries.
    assert {"segments", "device_traces", "allocator_settings",
            "external_annotations"} <= set(out["snapshot_keys"])
    assert {"address", "size", "requested_size", "state", "frames"} <= set(out["block_keys"])
    assert {"action", "addr", "size", "stream", "time_us", "user_metadata"} <= set(
        out["trace_keys"])
    # fragscope reads it ...
    proc = installed.run(["fragscope", "analyze", snap, "--json"])
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["devices"][0]["peak_reserved"]["bytes"] > 0
    # ... and so does PyTorch's own viewer.
    for mode in ("stats", "trace"):
        proc = installed.run([installed.python, "-m", "torch.cuda._memory_viz", mode, snap])
        assert proc.returncode == 0, (mode, proc.stderr[-2000:])
    assert "segments" in installed.run(
        [installed.python, "-m", "torch.cuda._memory_viz", "stats", snap]).stdout


def test_a_setting_the_modelled_version_lacks_says_which_has_it(installed):
    code = ("import fragscope.torch as fst\n"
            "fst.virtual_gpu('1GiB', alloc_conf='expandable_segments:True', torch_version='1.13')")
    proc = installed.run([installed.python, "-c", code])
    assert proc.returncode != 0
    assert re.search(r"pass torch_version='2'", proc.stderr), proc.stderr[-2000:]
    # A capacity without a unit is refused, as by the CLI; "GB" gets the decimal note.
    proc = installed.run([installed.python, "-c",
                          "import fragscope.torch as fst; fst.virtual_gpu(80)"])
    assert proc.returncode != 0 and "write a unit" in proc.stderr, proc.stderr[-2000:]
    proc = installed.run([installed.python, "-c",
                          "import fragscope.torch as fst; print(fst.virtual_gpu('80GB').capacity)"])
    assert proc.returncode == 0 and proc.stdout.strip() == "80000000000"
    assert "decimal" in proc.stderr


def test_a_recommendation_is_applied_under_the_name_torch_2x_reads(installed, tmp_path):
    (tmp_path / "fragscope-recommendation.json").write_text(json.dumps(
        {"format": "fragscope-recommendation", "version": 1, "step": 3,
         "alloc_conf": "expandable_segments:True", "torch_version": "newest"}))
    code = textwrap.dedent("""
        import os, sys
        from fragscope.torch import Monitor
        m = Monitor(run_dir=sys.argv[1], apply_recommendation=True)
        print(os.environ.get("PYTORCH_ALLOC_CONF"), os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    """)
    proc = installed.run([installed.python, "-c", code, str(tmp_path)],
                         PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["expandable_segments:True", "None"]
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in proc.stderr


def test_the_monitor_runs_from_the_installed_package(installed, tmp_path):
    code = textwrap.dedent("""
        import sys, torch
        from fragscope.torch import Monitor, virtual_gpu
        m = Monitor(every=5, run_dir=sys.argv[1], socket="/nonexistent", action="stop")
        with virtual_gpu("1GiB"):
            for step in range(30):
                x = torch.randn(256, 256 + step)
                m.step(step)
        print(m.last["step"], m.last["level"], len(m.history))
    """)
    proc = installed.run([installed.python, "-c", code, str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    step, level, samples = proc.stdout.split()
    assert (step, samples) == ("25", "6") and level in ("ok", "watch")
    # A level is logged when it changes, not at every sample.
    assert proc.stderr.count("fragscope.monitor: step") <= 2, proc.stderr
