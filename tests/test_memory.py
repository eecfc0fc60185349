"""Memory: the census, OOM recognition, captures near the limit, and a real OOM on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from helpers import mlp, train_steps
from perfhooks import Engine, PerfConfig, PerfhooksWarning
from perfhooks.memory.live_tensors import live_tensor_census
from perfhooks.memory.monitor import cpu_limit, cpu_usage
from perfhooks.memory.oom import find_oom, requested_bytes
from perfhooks.rules.memory import oom_recommendations

REPO = Path(__file__).resolve().parents[1]
CPU_OOM = ("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes. "
           "Error code 12 (Cannot allocate memory)")


def test_census_attribution_is_exact_for_an_mlp_with_adam() -> None:
    import gc

    gc.collect()  # the census counts every tensor in the process: earlier tests' garbage too
    model = mlp(64, 256)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()  # keep the gradients: they are attributed below
    census = live_tensor_census([model], [optimizer])
    parameters = list(model.parameters())
    assert census["parameters_bytes"] == sum(p.nbytes for p in parameters)
    assert census["gradients_bytes"] == sum(p.grad.nbytes for p in parameters)
    states = [optimizer.state[p] for p in parameters]
    assert all(len(state) == 3 for state in states)  # step, exp_avg, exp_avg_sq
    assert census["optimizer_state_bytes"] == sum(state["exp_avg"].nbytes + state["exp_avg_sq"].nbytes
                                                  + state["step"].untyped_storage().nbytes() for state in states)
    assert sum(state["exp_avg"].nbytes + state["exp_avg_sq"].nbytes for state in states) == \
        2 * census["parameters_bytes"], "two state tensors per parameter"
    largest = census["largest"][0]
    assert largest["bytes"] == max(p.nbytes for p in parameters) and largest["category"] in (
        "parameters", "gradients", "optimizer_state", "activations_other")


def test_activations_autograd_holds_in_cpp_count_from_the_allocated_bytes() -> None:
    """Tensors autograd saves in C++ are no Python objects: given the device's allocated bytes, activations are
    what is allocated less the parameters, gradients and state found on it."""
    import gc

    gc.collect()
    model = mlp(64, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    walked = live_tensor_census([model], [optimizer])
    known = walked["parameters_bytes"] + walked["gradients_bytes"] + walked["optimizer_state_bytes"]
    allocated = known + walked["activations_other_bytes"] + (64 << 20)  # 64 MiB the walk cannot see
    census = live_tensor_census([model], [optimizer], allocated=("cpu", allocated))
    assert census["activations_source"] == "allocated_less_known" and walked["activations_source"] == "walked"
    assert census["parameters_bytes"] == walked["parameters_bytes"]
    assert census["activations_other_bytes"] - walked["activations_other_bytes"] >= (64 << 20) - (1 << 20)
    # an allocator that says less than the walk found changes nothing
    assert live_tensor_census([model], [optimizer], allocated=("cpu", 0))["activations_source"] == "walked"


def test_views_count_their_storage_once() -> None:
    base = torch.zeros(1000, 1000)
    view = base[:10]
    census = live_tensor_census()
    matching = [t for t in census["largest"] if t["bytes"] == base.nbytes]
    assert len(matching) == 1
    del view


def test_ooms_are_found_wrapped_and_through_cycles() -> None:
    cpu = RuntimeError(CPU_OOM)
    assert find_oom(cpu) is cpu
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert find_oom(cuda) is cuda
    try:
        try:
            raise cpu
        except RuntimeError as inner:
            raise ValueError("the user's wrapper") from inner
    except ValueError as outer:
        assert find_oom(outer) is cpu
    context = KeyError("during handling")
    context.__context__ = cuda
    assert find_oom(context) is cuda
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert find_oom(a) is None, "a cause cycle ends"
    b.__context__ = cpu
    assert find_oom(a) is cpu


def test_requested_bytes_and_recommendation_order() -> None:
    assert requested_bytes(RuntimeError(CPU_OOM)) == 4294967296
    assert requested_bytes(torch.OutOfMemoryError("Tried to allocate 2.00 GiB")) == 2 * 2**30
    activations = {"total_bytes": 100, "activations_other_bytes": 80, "parameters_bytes": 10,
                   "optimizer_state_bytes": 10}
    assert oom_recommendations(activations, {})[0].startswith("Recompute activations")
    weights = {"total_bytes": 100, "activations_other_bytes": 10, "parameters_bytes": 40,
               "optimizer_state_bytes": 50}
    assert oom_recommendations(weights, {})[0].startswith("Train in bf16")
    fragmented = {"reserved_bytes": 300, "allocated_bytes": 100, "num_alloc_retries": 2}
    assert oom_recommendations(None, fragmented)[0].startswith("Reduce fragmentation")


def test_cpu_limit_and_usage_are_sane() -> None:
    limit, source = cpu_limit()
    usage = cpu_usage()
    assert source in ("cgroup", "rlimit_as", "physical") and limit > usage["rss_bytes"] > 0


def test_near_limit_capture_fires_once_per_crossing(tmp_path: Path) -> None:
    threshold = 0.9
    model = mlp()
    train_steps(Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory=False), tmp_path / "w",
                       "test"), lambda x: model(x).square().mean(), torch.optim.SGD(model.parameters()),
                [torch.randn(8, 32)] * 2)  # warm up, then measure: the threshold sits 200 MiB above
    capacity = int((cpu_usage()["rss_bytes"] + 200 * 2**20) / threshold)
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory_poll_s=0,
                               memory_capacity_bytes=capacity, memory_threshold=threshold), tmp_path, "test")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    held: list[torch.Tensor] = []
    batch = torch.randn(8, 32)

    def loss_of(x: torch.Tensor) -> torch.Tensor:
        return model(x).square().mean()

    def steps(count: int) -> None:
        train_steps(engine, loss_of, optimizer, [batch] * count)

    steps(2)
    held.append(torch.ones(400 * 2**20 // 4))  # +400 MiB resident: over the threshold
    steps(3)
    held.clear()
    steps(2)
    held.append(torch.ones(400 * 2**20 // 4))  # the second crossing
    steps(2)
    held.clear()
    report = engine.close()
    captures = report["memory"]["captures"]
    assert [c["reason"] for c in captures] == ["near_limit", "near_limit"]
    assert captures[0]["step"] == 2 and captures[1]["step"] == 7
    census = json.loads((Path(captures[0]["path"]) / "census.json").read_text())
    assert census["step"] == 2 and census["phase"] in ("data_wait", "forward", "backward", "optimizer")
    assert census["activations_other_bytes"] >= 400 * 2**20
    assert report["memory"]["peak_used_bytes"] >= threshold * capacity
    assert "memory_near_limit" in [d["id"] for d in report["diagnoses"]]


def test_history_arms_on_approach_before_the_capture(tmp_path: Path) -> None:
    """With a configured capacity: crossing memory_arm_fraction arms the history (on CPU nothing records, but
    the report says when and why), crossing memory_threshold captures; the files are written off the training
    thread, and the pause the capture cost the step is in its entry."""
    model = mlp()
    batch = torch.randn(8, 32)
    train_steps(Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory=False), tmp_path / "w",
                       "test"), lambda x: model(x).square().mean(), torch.optim.SGD(model.parameters()), [batch] * 2)
    rss = cpu_usage()["rss_bytes"]
    capacity = int(rss / 0.6)  # now at 60%: 0.75 is 0.15 × capacity away, 0.9 is 0.3 × capacity away
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory_poll_s=0,
                               memory_capacity_bytes=capacity, memory_threshold=0.9, memory_arm_fraction=0.75),
                    tmp_path, "test")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = lambda count: train_steps(engine, lambda x: model(x).square().mean(), optimizer, [batch] * count)  # noqa: E731
    steps(2)
    assert engine.memory.armed is None and engine.memory.captures == []
    first = torch.ones(int(0.22 * capacity) // 4)  # to about 82%: armed, not captured
    steps(2)
    assert engine.memory.armed == {"step": 2, "signal": "allocated"} and engine.memory.captures == []
    second = torch.ones(int(0.12 * capacity) // 4)  # past 90%: one capture
    steps(2)
    report = engine.close()
    del first, second
    memory = report["memory"]
    assert memory["history"] == {"mode": "on_approach", "recording": False, "owner": None,
                                 "armed": {"step": 2, "signal": "allocated"}}
    [capture] = memory["captures"]
    assert (capture["step"], capture["signal"], capture["files"]) == (4, "allocated", ["census.json"])
    assert capture["training_thread_ms"] > 0
    census = json.loads((Path(capture["path"]) / "census.json").read_text())  # written by the writer thread
    assert census["signal"] == "allocated" and census["activations_other_bytes"] >= 0.3 * capacity


def test_history_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"memory_arm_fraction must be a fraction in \(0, memory_threshold=0.8\]"):
        PerfConfig(memory_threshold=0.8, memory_arm_fraction=0.85)
    with pytest.raises(TypeError, match="memory_history must be True, False or None"):
        PerfConfig(memory_history="yes")
    assert PerfConfig().memory_history is None and PerfConfig().memory_arm_fraction == 0.75


def test_the_capture_is_written_on_the_writer_thread(tmp_path: Path) -> None:
    """Only the census walk runs where the capture is called; the JSON is written by the job it submits."""
    import threading

    from perfhooks.device.room import DeviceRoom
    from perfhooks.faults import FaultLog, Once
    from perfhooks.memory.monitor import MemoryMonitor

    jobs: list = []
    monitor = MemoryMonitor(tmp_path, DeviceRoom(None), FaultLog(), Once(), threshold=0.9, capacity_bytes=2**40,
                            poll_s=0, history=None, history_entries=10, max_captures=2,
                            submit=lambda kind, job: jobs.append((kind, job)))
    monitor.sample()
    folder = monitor.capture(3, "forward", "near_limit")
    assert [kind for kind, _ in jobs] == ["memory_capture"] and not (folder / "census.json").exists()
    writer = threading.Thread(target=jobs[0][1])
    writer.start()
    writer.join()
    assert json.loads((folder / "census.json").read_text())["step"] == 3


def test_report_memory_section_names_units(tmp_path: Path) -> None:
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory_poll_s=0), tmp_path, "test")
    train_steps(engine, lambda x: mlp()(x).square().mean(), torch.optim.SGD(mlp().parameters(), lr=0.1),
                [torch.randn(4, 32)] * 2)
    memory = engine.close()["memory"]
    assert {"capacity_bytes", "peak_used_bytes", "peak_step", "peak_phase", "rss_bytes"} <= set(memory)
    assert memory["peak_step"] in (0, 1) and memory["peak_phase"] in ("data_wait", "forward", "backward", "optimizer")


def test_a_failing_oom_dump_never_masks_the_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False), blocker / "out", "test")
    engine.phase_start("forward")
    with pytest.warns(PerfhooksWarning):
        engine.exception(RuntimeError(CPU_OOM))
    assert {f["kind"] for f in engine.faults.as_list()} >= {"oom_dump", "report_write"}  # the summary, first


OOM_RUN = textwrap.dedent("""
    import os, resource, sys
    sys.path.insert(0, {tests!r})
    import torch
    import lightning as L
    from helpers import quiet_trainer
    from perfhooks.integrations.lightning import PerfCallback

    class Wide(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 4096)
        def training_step(self, batch, batch_idx):
            return self.embed(batch[0]).mean()   # batch x 4096 floats: too big for the limit
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())

    indices = torch.randint(0, 16, (400_000,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(indices), batch_size=400_000)
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + 2 * 2**30, resource.RLIM_INFINITY))
    callback = PerfCallback(output_dir={out!r}, schedule=None, console=False)
    quiet_trainer(max_steps=2, callbacks=[callback]).fit(Wide(), loader)
""")


def test_a_real_cpu_oom_through_lightning(tmp_path: Path) -> None:
    out = tmp_path / "perf"
    script = OOM_RUN.format(tests=str(REPO / "tests"), out=str(out))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 1
    assert "DefaultCPUAllocator: can't allocate memory" in done.stderr
    assert "RuntimeError" in done.stderr.splitlines()[-1] or "can't allocate" in done.stderr.splitlines()[-1]
    summary = json.loads((out / "oom" / "summary.json").read_text())
    assert summary["step"] == 0 and summary["phase"] == "forward"
    assert summary["requested_bytes"] and summary["requested_bytes"] >= 400_000 * 4096 * 4 * 0.9
    assert summary["diagnosis"]["id"] == "oom" and "batch" in summary["diagnosis"]["recommendation"]
    assert (out / "oom" / "census.json").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "failed" and report["error"]["phase"] == "forward"


def _cuda_engine(tmp_path: Path, **settings) -> Engine:
    return Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory_poll_s=0, **settings), tmp_path,
                  "test", device="cuda")


def _gpu_steps(engine: Engine, gpu, count: int, kernel_ms: float = 1.0) -> None:
    """``count`` training steps whose work is a kernel of ``kernel_ms`` on the device."""
    for _ in range(count):
        engine.fetch()
        engine.phase_start("forward")
        gpu.run(kernel_ms)
        engine.phase_start("backward")
        engine.phase_start("optimizer")
        engine.stepped()


def _history_on() -> bool:
    return bool(torch._C._cuda_isHistoryEnabled()) if hasattr(torch._C, "_cuda_isHistoryEnabled") else any(
        torch.cuda.memory._snapshot().get("device_traces") or [])


def test_cuda_oom_observer_and_snapshot(tmp_path: Path, gpu) -> None:
    engine = _cuda_engine(tmp_path, memory_history=True)
    _gpu_steps(engine, gpu, 1)
    engine.phase_start("forward")
    gpu.alloc(1024)
    engine.phase_start("backward")  # a sample: CUDA is initialised, the observer attaches
    with pytest.raises(torch.OutOfMemoryError) as caught:
        gpu.alloc(1 << 45)
    engine.exception(caught.value)
    pickle_path = tmp_path / "oom" / "snapshot.pickle"
    assert pickle_path.read_bytes()[:2] == b"\x80\x04"
    observed = json.loads((tmp_path / "oom" / "observer.json").read_text())
    assert observed["requested_bytes"] >= 1 << 45 and observed["limit"] == "device" and observed["count"] == 1
    assert (tmp_path / "oom" / "summary.json").exists()
    from torch.cuda import _memory_viz

    from perfhooks.analysis.snapshot import load_snapshot

    snapshot = load_snapshot(pickle_path)
    assert any(entry["action"] == "oom" for trace in snapshot["device_traces"] for entry in trace)
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()


def test_cuda_healthy_run_records_no_history(tmp_path: Path, gpu) -> None:
    engine = _cuda_engine(tmp_path)
    _gpu_steps(engine, gpu, 5)
    memory = engine.close()["memory"]
    assert memory["history"]["mode"] == "on_approach" and memory["history"]["armed"] is None
    assert not _history_on()


def test_cuda_approach_arms_history_and_the_capture_has_stacks(tmp_path: Path, gpu) -> None:
    import pickle

    from torch.cuda import _memory_viz

    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    capacity = base + 400 * 2**20
    engine = _cuda_engine(tmp_path, memory_capacity_bytes=capacity, memory_threshold=0.9, memory_arm_fraction=0.5)
    _gpu_steps(engine, gpu, 2)
    armer = gpu.alloc(250 * 2**20)  # past 50%: armed
    _gpu_steps(engine, gpu, 2)
    filler = gpu.alloc(130 * 2**20)  # allocated with the history on
    _gpu_steps(engine, gpu, 2)
    report = engine.close()
    gpu.free(armer)
    gpu.free(filler)
    memory = report["memory"]
    assert memory["history"]["armed"]["signal"] == "allocated" and memory["history"]["owner"] == "perfhooks"
    # the steps after arming pay for a stack at every allocation: perfhooks' steps, out of the steady figures
    assert report["steady"]["perfhooks_steps"] >= 4 and report["series"]["perfhooks"][-4:] == [1, 1, 1, 1]
    [capture] = memory["captures"]
    snapshot = pickle.loads((Path(capture["path"]) / "snapshot.pickle").read_bytes())
    frames = [frame for trace in snapshot["device_traces"] for entry in trace for frame in entry.get("frames", [])]
    assert any("test_memory.py" in frame.get("filename", "") for frame in frames), "Python stacks recorded"
    allocs = [entry for trace in snapshot["device_traces"] for entry in trace if entry["action"] == "alloc"]
    tags = {entry.get("user_metadata") for entry in allocs}
    assert tags & {"data_wait", "forward", "backward", "optimizer"}, "allocations carry the phase they were made in"
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    assert not _history_on(), "perfhooks stopped its own history"


def test_cuda_users_own_history_is_untouched(tmp_path: Path, gpu) -> None:
    torch.cuda.memory._record_memory_history(enabled="all", max_entries=1000)
    try:
        keep = gpu.alloc(4096)
        engine = _cuda_engine(tmp_path, memory_history=True)
        _gpu_steps(engine, gpu, 2)
        assert engine.close()["memory"]["history"]["owner"] == "user"
        gpu.free(keep)
        assert _history_on(), "the user's history still records"
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def test_cuda_real_oom_keeps_the_error_and_exit_status(tmp_path: Path, gpu) -> None:
    """An OOM that ends the program: its traceback is the last thing printed, the exit status is 1, and the dump
    has the summary and the snapshot (the simulated device is installed in the child process too)."""
    script = textwrap.dedent(f"""
        import contextlib, torch
        from simulated_gpu import RealGpu, simulated_cuda
        from perfhooks import Engine, PerfConfig
        with (simulated_cuda() if {gpu.simulated!r} else contextlib.nullcontext(RealGpu())) as gpu:
            engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, memory_poll_s=0,
                                       memory_history=True), {str(tmp_path)!r}, "test", device="cuda")
            try:
                for step in range(2):
                    engine.fetch()
                    engine.phase_start("forward")
                    gpu.alloc(1 << 45)  # past the capacity
            except BaseException as error:
                engine.exception(error)
                raise
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO / "tests"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 1 and "OutOfMemoryError" in done.stderr.strip().splitlines()[-1]
    summary = json.loads((tmp_path / "oom" / "summary.json").read_text())
    assert summary["requested_bytes"] >= 1 << 45 and summary["error_type"] == "OutOfMemoryError"
    assert (tmp_path / "oom" / "snapshot.pickle").exists()


def test_allocator_retries_arm_and_capture_once_with_their_signal(tmp_path: Path) -> None:
    """The allocator retrying is a sign of pressure well below the threshold: it arms the history and captures
    once, with ``signal: alloc_retries``. (CPU has no allocator counters: the CUDA figures are fed here.)"""
    from perfhooks.device.room import DeviceRoom
    from perfhooks.faults import FaultLog, Once
    from perfhooks.memory.monitor import MemoryMonitor

    class Fed(MemoryMonitor):
        figures: list[dict] = []

        def sample(self) -> dict:
            self.latest = self.figures.pop(0)
            return self.latest

    monitor = Fed(tmp_path, DeviceRoom(None), FaultLog(), Once(), threshold=0.9, capacity_bytes=1000, poll_s=0,
                  history=None, history_entries=10, max_captures=3)
    Fed.figures = [{"used_bytes": 300, "num_alloc_retries": 2}, {"used_bytes": 310, "num_alloc_retries": 2},
                   {"used_bytes": 320, "num_alloc_retries": 3}, {"used_bytes": 330, "num_alloc_retries": 5}]
    for step in range(4):
        monitor.observe(step, "forward")
    assert monitor.armed == {"step": 2, "signal": "alloc_retries"}  # retries counted from the run's start (2)
    assert [(c["step"], c["signal"]) for c in monitor.captures] == [(2, "alloc_retries")]
