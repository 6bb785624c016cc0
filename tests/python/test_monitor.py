"""fragscope.torch.Monitor (docs/live-monitoring.md): the bound forecaster and tune, sampling
only every `every` steps, the action (checkpoint, recommendation, exit 75), its faults, the
recommendation on restart, node checkpoint requests, and the framework adapters."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

import conftest  # noqa: F401  (sys.path)

torch = pytest.importorskip("torch")
try:
    import fragscope.torch as ft
    from fragscope import _native
    from fragscope.torch import monitor as mon
    N = _native.load()
except ImportError as e:  # the native module is not built
    pytest.skip(str(e), allow_module_level=True)

MiB = 1 << 20


def sample(step, allocated, capacity=1024 * MiB):
    reserved = allocated + 4 * MiB
    return {"reserved_bytes": reserved, "allocated_bytes": allocated,
            "requested_bytes": allocated, "cached_free_bytes": 4 * MiB,
            "peak_reserved_bytes": reserved, "peak_allocated_bytes": allocated,
            "fragmentation_ratio": 4 * MiB / reserved, "largest_free_block": 4 * MiB,
            "max_allocatable": capacity - reserved, "num_alloc_retries": 0,
            "device_free_bytes": capacity - reserved}


def test_bound_forecaster_warns_on_growth_and_not_on_a_flat_series():
    grow, flat = N.LiveForecasts(4), N.LiveForecasts(4)
    for step in range(0, 400, 10):
        g = grow.observe("a", step, sample(step, 100 * MiB + step * 2 * MiB))
        f = flat.observe("a", step, sample(step, 100 * MiB))
    assert g["level"] in ("warning", "critical"), g
    assert g["steps_to_oom"] is not None and g["steps_to_oom"] < 1000
    assert f["level"] in ("ok", "watch"), f
    assert len(grow) == 1
    with pytest.raises(ValueError):
        grow.observe("a", -1, sample(0, MiB))
    with pytest.raises(ValueError, match="negative"):
        grow.observe("b", 1, {"reserved_bytes": -5})


def test_bound_forecaster_and_monitor_log_say_where_the_risk_comes_from():
    # Issue 31 item 5: every risk carries one line a user can judge it by; the Monitor's log
    # line adds it when the reason does not already say it.
    f = N.LiveForecasts(4)
    first = f.observe("a", 0, sample(0, 100 * MiB))
    assert first["risk"] is None and first["risk_explanation"] is None
    for step in range(50, 400, 50):
        v = f.observe("a", step, sample(step, 100 * MiB))
    assert v["risk"] is not None
    assert "P(a new largest step within 100 steps)" in v["risk_explanation"], v
    assert mon._risk_source(v).startswith("; OOM risk from: step demand")
    assert mon._risk_source({"reason": "x; " + v["risk_explanation"],
                             "risk_explanation": v["risk_explanation"]}) == ""


def sample_steps(capacity):
    """The bundled sample replayed on `capacity`: one agent sample dict per step (the replay's
    per-step timeline, under the agent's field names)."""
    doc = conftest.replay_json(os.path.join(conftest.SOURCE_DIR, "tests", "data", "sample",
                                            "gpt_tiny_50steps.jsonl.gz"),
                               "--capacity", str(capacity), "--no-map")
    retries = 0
    for row in doc["analysis"]["devices"][0]["timeline"]:
        if row["step_first"] < 0:
            continue
        retries += row["alloc_retries"] or 0
        yield row["step_last"], {
            "reserved_bytes": row["reserved_bytes"], "allocated_bytes": row["allocated_bytes"],
            "requested_bytes": row["live_requested_bytes"],
            "cached_free_bytes": row["cached_free_bytes"],
            "fragmentation_ratio": row["fragmentation_ratio"],
            "largest_free_block": row["largest_free_block_bytes"],
            "max_allocatable": row["max_allocatable_bytes"],
            "stranded_bytes": row["stranded_bytes"],
            "peak_reserved_bytes": row["peak_reserved_bytes"],
            "peak_allocated_bytes": row["peak_allocated_bytes"],
            "largest_request_bytes": row["largest_request_bytes"],
            "num_alloc_retries": retries,
            "device_free_bytes": capacity - row["reserved_bytes"]}


def test_bound_forecaster_calls_the_sample_at_its_healthy_capacity_ok():
    # Issue 29 item 3: the sample caches 81-100% of what it reserves at each step's end; on
    # 1 GiB it fits with room to spare. The ratio alone is information: every verdict is ok
    # (before, "watch: fragmentation ratio 0.81 > 0.30" from the first sample on).
    f = N.LiveForecasts(4)
    ratios, levels = [], []
    for step, s in sample_steps(1024 * MiB):
        ratios.append(s["fragmentation_ratio"])
        v = f.observe("rank0", step, s)
        levels.append((step, v["level"], v["reason"]))
    assert max(ratios) > 0.8
    assert all(level == "ok" for _, level, _ in levels), levels
    # A genuinely risky series still warns: demand that grows toward the device's limit.
    grow = N.LiveForecasts(4)
    for step in range(0, 400, 10):
        g = grow.observe("a", step, sample(step, 100 * MiB + step * 2 * MiB))
    assert g["level"] in ("warning", "critical"), g


def test_bound_tune_ranks_settings_and_rejects_bad_actions():
    # Alternating 30 MiB and 2 MiB requests, freeing the large ones: on 64 MiB the defaults
    # keep working; the ranking has every setting it was given.
    reqs = []
    ident = 0
    for step in range(20):
        reqs.append(("step", 0, step))
        ident += 1
        reqs.append(("alloc", ident, 30 * MiB))
        reqs.append(("free_requested", ident, 30 * MiB))
    out = N.tune_requests(reqs, 64 * MiB, 0, "newest", ["", "expandable_segments:True"], 1)
    assert sorted(o["conf"] for o in out) == ["", "expandable_segments:True"]
    assert not any(o["oom"] for o in out)
    tiny = N.tune_requests(reqs, 16 * MiB, 0, "newest", [""], 1)
    assert tiny[0]["oom"] and tiny[0]["oom_step"] == 0
    with pytest.raises(ValueError, match="request 0"):
        N.tune_requests([("segment_alloc", 1, 2)], 64 * MiB, 0, "newest", [], 1)


class Fake:
    """A Monitor whose allocator reading is replaced: levels scripted per step."""

    def __init__(self, tmp_path, levels, **kw):
        kw.setdefault("socket", str(tmp_path / "no-daemon.sock"))
        kw.setdefault("request_signal", None)
        self.m = mon.Monitor(run_dir=str(tmp_path), **kw)
        self.m._exact_exit = False  # the tests catch its SystemExit in-process
        self.reads = []

        def forecast(step):
            self.reads.append(step)
            level = levels.get(step, "ok")
            return mon.LEVELS.index(level), {"reason": "scripted " + level,
                                             "steps_to_oom": 7}, None
        self.m._forecast = forecast


def test_step_samples_only_every_n_steps(tmp_path):
    f = Fake(tmp_path, {}, every=50)
    for step in range(0, 201):
        assert f.m.step(step) is False
    assert f.reads == [0, 50, 100, 150, 200]
    f2 = Fake(tmp_path, {}, every=7)  # resuming mid-way: the next multiple
    for step in range(10, 30):
        f2.m.step(step)
    assert f2.reads == [10, 14, 21, 28]


def test_warning_checkpoints_writes_the_recommendation_and_exits_75(tmp_path):
    saved = []
    f = Fake(tmp_path, {100: "warning"}, every=50, save_checkpoint=saved.append)
    f.m.step(50)
    with pytest.raises(SystemExit) as e:
        f.m.step(100)
    assert e.value.code == mon.EXIT_CODE == 75
    assert saved == [100]
    rec = json.loads((tmp_path / mon.RECOMMENDATION_FILE).read_text())
    assert rec["step"] == 100 and rec["worst_level"] == "warning" and rec["checkpoint_saved"]
    assert rec["levels"] == ["warning"]
    assert N.canonical_alloc_conf(rec["alloc_conf"], rec["torch_version"])  # valid
    assert rec["how"].startswith("fallback")  # no virtual GPU: no trace to tune


def test_the_recommendation_is_never_written_through_a_planted_link(tmp_path):
    # Issue 24 item 4: its temporary was RECOMMENDATION_FILE.PID.tmp, opened with open(..., "w"):
    # a link planted there had what it points to overwritten.
    victim = tmp_path / "victim"
    victim.write_bytes(b"must stay as it is\n")
    path = tmp_path / mon.RECOMMENDATION_FILE
    os.symlink(victim, "{}.{}.tmp".format(path, os.getpid()))
    f = Fake(tmp_path, {10: "warning"}, every=10, save_checkpoint=lambda step: None)
    with pytest.raises(SystemExit):
        f.m.step(10)
    assert victim.read_bytes() == b"must stay as it is\n"
    assert json.loads(path.read_text())["step"] == 10
    assert not path.is_symlink()


def test_watch_does_not_act_and_the_level_is_configurable(tmp_path):
    saved = []
    f = Fake(tmp_path, {0: "watch", 10: "warning"}, every=10, level="critical", action="stop",
             save_checkpoint=saved.append)
    assert f.m.step(0) is False and f.m.step(10) is False
    assert saved == [] and not (tmp_path / mon.RECOMMENDATION_FILE).exists()
    with pytest.raises(ValueError, match="level"):
        mon.Monitor(level="high", run_dir=str(tmp_path))
    with pytest.raises(ValueError, match="every"):
        mon.Monitor(every=0, run_dir=str(tmp_path))


def test_every_argument_of_the_monitor_is_in_the_docs_options_table():
    """docs/live-monitoring.md's table lists each keyword Monitor takes (job= was missing)."""
    import inspect
    with open(os.path.join(conftest.SOURCE_DIR, "docs", "live-monitoring.md"),
              encoding="utf-8") as f:
        rows = {line.split("|")[1].strip().strip("`") for line in f
                if line.startswith("| `")}
    arguments = set(inspect.signature(mon.Monitor.__init__).parameters) - {"self"}
    assert arguments - rows == set()


def test_issue30_item9_a_failing_checkpoint_claims_nothing_and_disarms_nothing(tmp_path,
                                                                            capsys):
    calls = []

    def flaky(step):
        calls.append(step)
        if step == 10:
            raise OSError("No space left on device")
    request = tmp_path / mon.REQUEST_FILE
    request.write_text("")
    f = Fake(tmp_path, {10: "critical", 20: "critical"}, every=10, save_checkpoint=flaky,
             action="stop")
    assert f.m.step(10) is False and not f.m.stopped  # no stop
    # Nothing written (the run directory stays armed), the node's request is still there.
    assert not (tmp_path / mon.RECOMMENDATION_FILE).exists()
    assert request.exists() and not (tmp_path / (mon.REQUEST_FILE + ".taken")).exists()
    assert "save_checkpoint raised" in capsys.readouterr().err
    # The next sample tries again, and this time saves, writes and answers the request.
    assert f.m.step(20) is True and calls == [10, 20]
    rec = json.loads((tmp_path / mon.RECOMMENDATION_FILE).read_text())
    assert rec["checkpoint_saved"] is True and rec["step"] == 20
    assert not request.exists()


def test_issue30_item9_a_request_taken_by_a_killed_run_is_not_answered_again(tmp_path):
    # SIGTERM during save_checkpoint: the request was taken (renamed) first, so the restart
    # finds no request, and the stale taken file is removed.
    (tmp_path / (mon.REQUEST_FILE + ".taken")).write_text("")
    saved = []
    f = Fake(tmp_path, {10: "ok"}, every=10, save_checkpoint=saved.append, action="stop")
    assert f.m.step(10) is False and saved == []
    assert not (tmp_path / (mon.REQUEST_FILE + ".taken")).exists()


def test_issue30_item9_the_recommendation_must_be_a_valid_regular_file(tmp_path):
    rec = tmp_path / mon.RECOMMENDATION_FILE
    os.mkfifo(rec)  # opening it for reading would block forever
    f = Fake(tmp_path, {10: "critical"}, every=10, save_checkpoint=lambda s: None,
             action="stop")
    assert f.m.acted_before is False
    os.unlink(rec)
    rec.write_text("garbage")
    f = Fake(tmp_path, {10: "critical"}, every=10, save_checkpoint=lambda s: None,
             action="stop")
    assert f.m.acted_before is False and f.m.step(10) is True
    os.unlink(rec)
    target = tmp_path / "elsewhere.json"
    target.write_text('{"alloc_conf": ""}')
    os.symlink(target, rec)
    assert mon.read_recommendation(str(tmp_path)) is None


def test_issue30_item1_a_request_file_of_another_user_is_ignored(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    request = tmp_path / mon.REQUEST_FILE
    request.write_text("")
    os.chown(request, 65534, 65534)
    saved = []
    f = Fake(tmp_path, {10: "ok"}, every=10, save_checkpoint=saved.append, action="stop")
    assert f.m.step(10) is False and saved == []
    # In a folder only uid 65534 may write (the daemon's request folder), its file counts.
    os.chown(tmp_path, 65534, 65534)
    os.chmod(tmp_path, 0o755)
    try:
        assert f.m.step(20) is True and saved == [20]
    finally:
        os.chown(tmp_path, 0, 0)


def test_one_stop_per_run_directory(tmp_path):
    (tmp_path / mon.RECOMMENDATION_FILE).write_text('{"alloc_conf": ""}')
    saved = []
    f = Fake(tmp_path, {10: "critical"}, every=10, save_checkpoint=saved.append)
    assert f.m.step(10) is False and saved == []


def test_node_request_file_and_signal_act_at_the_next_sample(tmp_path):
    saved = []
    f = Fake(tmp_path, {}, every=10, action="stop", save_checkpoint=saved.append)
    assert f.m.step(10) is False
    (tmp_path / mon.REQUEST_FILE).write_text("")
    assert f.m.step(11) is False  # between samples: nothing
    assert f.m.step(20) is True and saved == [20]
    rec = json.loads((tmp_path / mon.RECOMMENDATION_FILE).read_text())
    assert rec["node_request"] is True

    sub = tmp_path / "sig"
    sub.mkdir()
    saved2 = []
    theirs = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: theirs.append(signum))
    g = mon.Monitor(run_dir=str(sub), every=10, action="stop", save_checkpoint=saved2.append,
                    socket=str(sub / "none"), request_signal=signal.SIGUSR2)
    g._forecast = lambda step: (1, {"reason": "ok", "steps_to_oom": None}, None)
    try:
        assert g.step(0) is False
        os.kill(os.getpid(), signal.SIGUSR2)
        assert g.step(10) is True and saved2 == [10]
        assert theirs == [signal.SIGUSR2]  # the program's own handler ran too
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_recommendation_applied_on_restart_and_corrupt_files_ignored(tmp_path, capsys):
    env = {}
    assert mon.apply_recommendation(str(tmp_path), env) is None  # none yet
    path = tmp_path / mon.RECOMMENDATION_FILE
    for bad, why in (("{not json", "not a valid recommendation"),
                     ('["x"]', "JSON object"),
                     ('{"alloc_conf": 5}', "alloc_conf"),
                     ('{"alloc_conf": "max_split_size_mb:banana"}', "not a valid")):
        path.write_text(bad)
        assert mon.apply_recommendation(str(tmp_path), env) is None
        err = capsys.readouterr().err
        assert why in err and str(path) in err
    assert env == {}
    path.write_text(json.dumps({"alloc_conf": "expandable_segments:True", "step": 5,
                                "worst_rank": 3, "worst_level": "warning",
                                "torch_version": "newest"}))
    assert mon.apply_recommendation(str(tmp_path), env) == "expandable_segments:True"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "applied the recommendation of step 5" in capsys.readouterr().err


def test_a_daemon_that_is_down_or_silent_never_fails_training(tmp_path):
    # A stale socket file nobody listens on, then a listener that never reads.
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    gpu = ft.virtual_gpu("64MiB").start()
    try:
        x = torch.randn(1000, 100)  # noqa: F841  (something allocated)
        m = mon.Monitor(run_dir=str(tmp_path), every=1, socket=stale, request_signal=None)
        assert m.step(0) is False and m.last["level"] != "unknown"
        live = str(tmp_path / "live.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(live)
        srv.listen(1)
        m2 = mon.Monitor(run_dir=str(tmp_path), every=1, socket=live, daemon_timeout=0.05,
                         request_signal=None)
        for step in range(3):
            assert m2.step(step) is False
        conn, _ = srv.accept()
        head = conn.recv(8)  # a real sample frame reached the "daemon": length, magic
        assert head[4:8] == b"FSAG", head
        conn.close()
        srv.close()
    finally:
        gpu.stop()


def test_monitor_on_a_virtual_gpu_reads_the_level_from_the_bound_forecaster(tmp_path):
    gpu = ft.virtual_gpu("48MiB", torch_version="newest").start()
    try:
        m = mon.Monitor(run_dir=str(tmp_path), every=5, action="stop", request_signal=None,
                        socket=str(tmp_path / "none"))
        model = torch.nn.Linear(128, 1024)
        keep = []
        for step in range(200):
            keep.append(model(torch.randn(32, 128)))  # ~128 KiB more per step
            gpu.step(step)
            if m.step(step):
                break
        assert m.stopped and m.last["worst"] in ("warning", "critical"), m.history
        rec = json.loads((tmp_path / mon.RECOMMENDATION_FILE).read_text())
        assert rec["steps_to_oom"] is not None
        assert rec["how"].startswith(("tune", "fallback"))
    finally:
        gpu.stop()


def test_optimizer_attach_calls_step_after_each_optimizer_step(tmp_path):
    f = Fake(tmp_path, {}, every=2)
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([p], lr=0.1)
    f.m.attach(opt)
    for _ in range(5):
        p.grad = torch.ones(3)
        opt.step()
    assert f.reads == [0, 2, 4]


def test_monitor_module_imports_without_torch_distributed_initialized():
    out = subprocess.run(
        [sys.executable, "-c", "import fragscope.torch as ft; print(ft.Monitor.__name__)"],
        env=conftest.subprocess_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Monitor"


# -- adapters, against stand-ins that follow the frameworks' documented interfaces ---------
import types  # noqa: E402

from fragscope.torch import monitor_adapters  # noqa: E402


def _install(monkeypatch, module, name):
    mod = types.ModuleType(module)

    class Base:  # Callback / TrainerCallback: plain classes with no-op hooks
        pass
    setattr(mod, name, Base)
    for parent in module.split(".")[:-1]:
        monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
    monkeypatch.setitem(sys.modules, module, mod)
    return Base


def test_adapters_import_nothing_when_the_framework_is_absent(monkeypatch, tmp_path):
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    m = mon.Monitor(run_dir=str(tmp_path), request_signal=None)
    with pytest.raises(ImportError, match="Lightning is not installed"):
        monitor_adapters.lightning_callback(m)
    with pytest.raises(ImportError, match="transformers is not installed"):
        monitor_adapters.huggingface_callback(m)
    assert "lightning" not in sys.modules or sys.modules["lightning"] is None


def test_lightning_adapter_saves_with_the_trainer_and_stops_it(monkeypatch, tmp_path):
    Base = _install(monkeypatch, "lightning.pytorch", "Callback")
    f = Fake(tmp_path, {20: "warning"}, every=10)
    cb = monitor_adapters.lightning_callback(f.m)
    assert isinstance(cb, Base)

    class Trainer:  # the attributes Lightning documents
        global_step = 0
        should_stop = False
        saved = []

        def save_checkpoint(self, path):
            self.saved.append(path)
    t = Trainer()
    for step in range(30):
        t.global_step = step
        cb.on_train_batch_end(t, None, None, None, step)
        if t.should_stop:
            break
    assert t.should_stop and t.global_step == 20
    assert t.saved == [os.path.join(str(tmp_path), "fragscope-step20.ckpt")]
    with pytest.raises(SystemExit) as e:
        f.m.exit_if_stopped()
    assert e.value.code == 75


def test_the_lightning_callback_suits_both_packages_when_both_are_installed(monkeypatch,
                                                                           tmp_path):
    # Each Trainer accepts only its own package's Callback class (lightning.pytorch or
    # pytorch_lightning); a user may have both installed.
    new = _install(monkeypatch, "lightning.pytorch", "Callback")
    old = _install(monkeypatch, "pytorch_lightning", "Callback")
    cb = monitor_adapters.lightning_callback(Fake(tmp_path, {}, every=10).m)
    assert isinstance(cb, new) and isinstance(cb, old)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    cb = monitor_adapters.lightning_callback(Fake(tmp_path, {}, every=10).m)
    assert isinstance(cb, old) and not isinstance(cb, new)


def test_huggingface_adapter_sets_should_save_and_should_training_stop(monkeypatch, tmp_path):
    Base = _install(monkeypatch, "transformers", "TrainerCallback")
    f = Fake(tmp_path, {30: "critical"}, every=15)
    cb = monitor_adapters.huggingface_callback(f.m)
    assert isinstance(cb, Base)
    state = types.SimpleNamespace(global_step=0)
    stops = []
    for step in range(1, 40):
        control = types.SimpleNamespace(should_save=False, should_training_stop=False)
        state.global_step = step
        cb.on_step_end(None, state, control)
        if control.should_training_stop:
            stops.append((step, control.should_save))
            break
    assert stops == [(30, True)]
    rec = json.loads((tmp_path / mon.RECOMMENDATION_FILE).read_text())
    assert rec["step"] == 30 and rec["checkpoint_saved"] is True
    m2 = mon.Monitor(run_dir=str(tmp_path / "x"), request_signal=None)
    assert m2.exit_if_stopped() is None  # not stopped: returns


OOM_JOB = """
import sys, torch
import fragscope.torch as ft
from fragscope.torch.monitor import Monitor
m = Monitor(every=1, run_dir=sys.argv[1], socket="/none", request_signal=None,
            record_oom=sys.argv[2] == "1")
gpu = ft.virtual_gpu("32MiB").start()
keep = []
for step in range(100):
    keep.append(torch.empty(3 << 20, dtype=torch.uint8))
    gpu.step(step)
    m.step(step)
"""


@pytest.mark.parametrize("record", [True, False])
def test_an_oom_that_still_happens_is_recorded_for_explain(tmp_path, record):
    job = tmp_path / "job.py"
    job.write_text(OOM_JOB)
    out = subprocess.run([sys.executable, str(job), str(tmp_path), "1" if record else "0"],
                         env=conftest.subprocess_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "out of memory" in out.stderr
    snap = tmp_path / "fragscope-oom-rank0.pickle"
    assert snap.exists() == record
    if not record:
        return
    log = tmp_path / "log"
    log.write_text(out.stderr)
    explain = subprocess.run([conftest.fragscope_bin(), "explain", "--json", "--snapshot",
                              str(snap), str(log)], capture_output=True, text=True, timeout=120)
    assert explain.returncode == 0, explain.stderr
    errors = json.loads(explain.stdout)["errors"]
    assert len(errors) == 1


def test_recommendation_from_tune_on_a_virtual_gpu(tmp_path):
    # Requests that fragment the default allocator: 30 MiB blocks freed between 2 MiB ones that
    # stay; the bisection finds settings that fit on a smaller device than the defaults.
    gpu = ft.virtual_gpu("256MiB", torch_version="newest").start()
    try:
        keep = []
        for step in range(12):
            big = torch.empty((30 << 20) + step * (1 << 20), dtype=torch.uint8)
            keep.append(torch.empty(2 << 20, dtype=torch.uint8))
            del big
            gpu.step(step)
        conf, how = mon.recommend_alloc_conf()
    finally:
        gpu.stop()
    assert how.startswith("tune:"), how
    assert conf != "" and N.canonical_alloc_conf(conf, "newest") == conf


def test_empty_cache_first_then_act_if_the_level_stays(tmp_path):
    saved, shrunk, emptied = [], [], []
    f = Fake(tmp_path, {10: "warning", 20: "ok", 30: "warning", 40: "warning"}, every=10,
             action="stop", save_checkpoint=saved.append, empty_cache_first=True,
             shrink_batch=shrunk.append)
    f.m._empty_cache = lambda: emptied.append(True)
    assert f.m.step(10) is False  # the softer action, once
    assert emptied == [True] and shrunk == [10] and saved == []
    assert f.m.step(20) is False
    assert f.m.step(30) is True  # still at the level later: act
    assert saved == [30] and emptied == [True] and shrunk == [10]


def test_the_restart_hint_names_the_store_workaround_only_where_it_applies():
    hint = mon.restart_hint
    under = {"TORCHELASTIC_RESTART_COUNT": "0"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in hint(under, "2.13.0+cpu")
    assert "#135712" in hint(under, "2.5.1")
    assert hint(under, "2.4.1") == "" and hint(under, "1.13.1") == ""
    assert hint({}, "2.13.0") == ""  # not under torchrun
    assert hint(dict(under, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"), "2.13.0") == ""
    assert hint(under, "nightly") == ""



def test_the_exit_that_torchrun_restarts_destroys_the_process_group_first(tmp_path):
    # A gloo process group left up at exit can abort the process during interpreter
    # finalization (SIGABRT, "terminate called without an active exception") instead of
    # exiting 75; the monitor destroys it first. A group of one, in a child process.
    script = tmp_path / "job.py"
    import textwrap
    script.write_text(textwrap.dedent("""
        import pathlib
        import sys
        import torch.distributed as dist
        sys.path.insert(0, {tests!r})
        from test_monitor import Fake
        dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
        f = Fake(pathlib.Path({run!r}), {{20: "warning"}}, every=10)
        f.m._exact_exit = True  # as in a job
        try:
            for step in range(30):  # exits at step 20 (no checkpoint function: at once)
                f.m.step(step)
        finally:
            print("stopped at", step, "initialized at exit:", dist.is_initialized())
    """).format(tests=os.path.dirname(os.path.abspath(__file__)), store=tmp_path / "store",
                run=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert "stopped at 20 initialized at exit: False" in proc.stdout, proc.stdout + proc.stderr


def test_the_exit_code_is_exactly_75_even_when_the_teardown_aborts(tmp_path):
    # The interpreter's last teardown destroys the frameworks' C++ objects, and some abort there
    # (gloo's threads); the monitor's exit skips only that teardown: the program's finally
    # blocks and exit handlers run, open files are flushed, and the launcher sees 75.
    import textwrap
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import atexit
        import os
        import pathlib
        import sys
        sys.path.insert(0, {tests!r})
        from test_monitor import Fake

        class AbortsInTeardown:
            def __del__(self):
                os.abort()  # what gloo's joinable thread does to a destructor at shutdown

        keep = AbortsInTeardown()
        log = open({log!r}, "w")  # buffered, never closed
        atexit.register(lambda: open({handler!r}, "w").write("ran"))
        f = Fake(pathlib.Path({run!r}), {{20: "warning"}}, every=10)
        f.m._exact_exit = True  # as in a job
        try:
            for step in range(30):
                log.write("step %d\\n" % step)
                f.m.step(step)
        finally:
            log.write("finally\\n")
    """).format(tests=os.path.dirname(os.path.abspath(__file__)), log=str(tmp_path / "log.txt"),
                handler=str(tmp_path / "handler.txt"), run=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 75, (proc.returncode, proc.stdout + proc.stderr)
    assert (tmp_path / "handler.txt").read_text() == "ran"
    assert (tmp_path / "log.txt").read_text().endswith("step 20\nfinally\n")
