"""The settings audit: each setting that slows a run is named, with its price, when it is on, and is not when it is
off. Real runs of a plain loop under ``perfhooks.profile`` where the setting can be set in this process; the
rules on a read's facts where it cannot (a GPU's capability, another machine's CPU)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

import perfhooks
from perfhooks.device.describe import usable_cpus
from perfhooks.device.settings import HostShare, SettingsAudit, debug_environment, faster_cpu_type
from perfhooks.rules.settings import diagnose_settings
from perfhooks.rules.thresholds import Thresholds


def train(tmp_path: Path, steps: int = 16, around: Any = None) -> dict[str, Any]:
    """A small MLP trained ``steps`` steps under ``perfhooks.profile`` in bf16 autocast where this CPU has it
    (so that the precision check stays out of the way), inside the context ``around()`` if given."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    bf16 = faster_cpu_type() is not None
    with (around() if around is not None else _nothing()), \
            perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=None) as perf:
        for _ in range(steps):
            with perf.data_wait():
                x = torch.randn(32, 64)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x).float().square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return json.loads((tmp_path / "report.json").read_text())


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def ids(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in report["diagnoses"]}


@pytest.fixture
def all_threads() -> Iterator[int]:
    """The intra-op threads at the usable CPUs for the test (the suite runs with OMP_NUM_THREADS=1)."""
    threads = torch.get_num_threads()
    cpus = usable_cpus() or threads
    torch.set_num_threads(cpus)
    yield cpus
    torch.set_num_threads(threads)


def test_anomaly_detection_on_is_named_with_the_forward_and_backward_as_its_ceiling(tmp_path: Path,
                                                                                    all_threads: int) -> None:
    on = train(tmp_path / "on", around=lambda: torch.autograd.detect_anomaly(check_nan=True))
    verdict = ids(on)["anomaly_detection"]
    share = verdict["measured"]["forward_backward_share"]
    assert verdict["severity"] == "warning" and verdict["estimated_gain"] == pytest.approx(share, abs=1e-4)
    assert on["phases"]["forward"]["share"] + on["phases"]["backward"]["share"] == pytest.approx(share, abs=0.02)
    assert "checks every gradient for NaN" in verdict["evidence"] and "set_detect_anomaly" in verdict["recommendation"]
    assert on["settings"]["anomaly_detection"] is True and on["settings"]["since"]["anomaly_detection"] == 0
    off = train(tmp_path / "off")
    assert "anomaly_detection" not in ids(off) and off["settings"]["anomaly_detection"] is False


def test_fewer_threads_than_usable_cpus_is_named_and_all_of_them_is_not(tmp_path: Path, all_threads: int) -> None:
    if all_threads < 2:
        pytest.skip("one usable CPU: no fewer threads to set")
    torch.set_num_threads(1)
    one = train(tmp_path / "one")
    verdict = ids(one)["cpu_threads"]
    # the steady steps' shares, which the verdict reads (a step perfhooks' own work overlapped, the first answer's
    # report write among them, is left out of both)
    compute = sum(one["steady"]["shares"][name] for name in ("forward", "backward", "optimizer"))
    assert verdict["measured"]["intra_op_threads"] == 1 and verdict["measured"]["usable_cpus"] == all_threads
    assert verdict["estimated_gain"] == pytest.approx(compute * (1 - 1 / all_threads), abs=0.02)
    assert f"torch.set_num_threads({all_threads})" in verdict["recommendation"]
    torch.set_num_threads(all_threads)
    assert "cpu_threads" not in ids(train(tmp_path / "all"))
    torch.set_num_threads(all_threads * 2)
    over = ids(train(tmp_path / "over"))["cpu_threads"]
    assert over["title"] == "More training threads than CPUs" and over["estimated_gain"] == 0


def test_deterministic_algorithms_are_information(tmp_path: Path, all_threads: int) -> None:
    torch.use_deterministic_algorithms(True)
    try:
        on = train(tmp_path / "on")
    finally:
        torch.use_deterministic_algorithms(False)
    verdict = ids(on)["deterministic_algorithms"]
    assert (verdict["severity"], verdict["estimated_gain"]) == ("info", 0)
    assert "deterministic_algorithms" not in ids(train(tmp_path / "off"))


def test_another_profiler_left_on_is_named(tmp_path: Path, all_threads: int) -> None:
    on = train(tmp_path / "on", around=lambda: torch.autograd.profiler.profile())
    verdict = ids(on)["profiler_running"]
    assert verdict["severity"] == "warning" and verdict["estimated_gain"] > 0.5
    assert "profiler_running" not in ids(train(tmp_path / "off"))


def test_fp32_on_a_cpu_with_native_bf16_is_named_and_bf16_is_not(tmp_path: Path, all_threads: int) -> None:
    if faster_cpu_type() is None:
        pytest.skip("this CPU has neither AVX512-BF16 nor AMX")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=None) as perf:
        for _ in range(16):
            with perf.data_wait():
                x = torch.randn(32, 64)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    verdict = ids(report)["fp32_matmul"]
    assert verdict["measured"]["cpu_type"] == faster_cpu_type() and "flash backward" in verdict["evidence"]
    assert "torch.autocast(\"cpu\", dtype=torch.bfloat16)" in verdict["recommendation"]
    assert "fp32_matmul" not in ids(train(tmp_path / "bf16"))  # autocast seen at the forward


# ----------------------------------------------------------------------------- the rules on a read's facts
class Stats:
    """Steady phase shares, as the rules read them."""

    sampled_steps = 20

    def __init__(self, **shares: float) -> None:
        self.shares = shares

    def steady_share(self, name: str) -> float:
        return self.shares.get(name, 0.0)


STATS = Stats(forward=0.33, backward=0.65, optimizer=0.01)


def facts(**changes: Any) -> dict[str, Any]:
    base = {"anomaly_detection": False, "anomaly_check_nan": True, "intra_op_threads": 2, "usable_cpus": 2,
            "deterministic_algorithms": False, "environment": {}, "environment_threads": {}, "ranks_on_host": 1,
            "param_dtypes": ["float32"], "faster_cpu_type": None, "profiler_running": False, "since": {}}
    return {**base, **changes}


def test_the_study_jobs_settings_get_the_ceilings_it_measured() -> None:
    """The accelerate study's script: anomaly detection on, one thread of two, fp32 on an AVX512-BF16 CPU. The
    fixes measured -26% of the run, 1.78x and about 1.5x; the ceilings are at least 0.2, 0.35 and named."""
    found = {d["id"]: d for d in diagnose_settings(
        facts(anomaly_detection=True, intra_op_threads=1, faster_cpu_type="avx512_bf16",
              since={"anomaly_detection": 0, "threads": 0}), STATS, framework="accelerate")}
    assert found["anomaly_detection"]["estimated_gain"] == pytest.approx(0.98)
    assert found["cpu_threads"]["estimated_gain"] == pytest.approx(0.99 * 0.5)
    assert found["fp32_matmul"]["estimated_gain"] == pytest.approx(0.98)
    assert 'Accelerator(mixed_precision="bf16")' in found["fp32_matmul"]["recommendation"]
    assert set(found) == {"anomaly_detection", "cpu_threads", "fp32_matmul"}


def test_threads_are_judged_per_rank_on_the_host_and_name_omp_num_threads() -> None:
    (one,) = diagnose_settings(facts(intra_op_threads=1, usable_cpus=8, environment_threads={"OMP_NUM_THREADS": "1"}),
                               STATS)
    assert "OMP_NUM_THREADS=1 in the environment" in one["evidence"] and "OMP_NUM_THREADS" in one["recommendation"]
    assert diagnose_settings(facts(intra_op_threads=2, usable_cpus=8, ranks_on_host=4), STATS) == []
    assert diagnose_settings(facts(intra_op_threads=1, usable_cpus=8), STATS, device_type="cuda") == []


def test_debug_switches_name_each_variable_where_it_applies() -> None:
    environ = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "TORCH_LOGS": "+dynamo", "TORCHDYNAMO_VERBOSE": "0",
               "PYTORCH_NO_CUDA_MEMORY_CACHING": ""}
    assert debug_environment(environ) == {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "TORCH_LOGS": "+dynamo"}
    assert debug_environment({"NCCL_DEBUG": "WARN"}) == {}
    on_gpu = diagnose_settings(facts(environment=debug_environment(environ)), STATS, device_type="cuda",
                               world_size=2)
    (gpu,) = [d for d in on_gpu if d["id"] == "debug_switches"]
    assert gpu["measured"]["switches"] == ["CUDA_LAUNCH_BLOCKING=1", "NCCL_DEBUG=INFO", "TORCH_LOGS=+dynamo"]
    assert (gpu["severity"], gpu["estimated_gain"]) == ("warning", 0.5)
    (cpu,) = diagnose_settings(facts(environment=debug_environment(environ)), STATS)
    assert cpu["measured"]["switches"] == ["TORCH_LOGS=+dynamo"] and (cpu["severity"], cpu["estimated_gain"]) == (
        "info", 0)
    (mode,) = diagnose_settings(facts(sync_debug_mode=1), STATS, device_type="cuda")
    assert mode["measured"]["switches"] == ['torch.cuda.set_sync_debug_mode("warn")']


def test_the_audit_reads_the_environment_it_is_given(tmp_path: Path) -> None:
    from perfhooks.device.room import DeviceRoom

    audit = SettingsAudit(DeviceRoom(None), environ={"TORCH_LOGS": "recompiles", "OMP_NUM_THREADS": "1",
                                                      "LOCAL_WORLD_SIZE": "2"})
    read = audit.read(5, window_open=False)
    assert read["environment"] == {"TORCH_LOGS": "recompiles"}
    assert read["environment_threads"] == {"OMP_NUM_THREADS": "1"} and read["ranks_on_host"] == 2


def test_fp32_on_an_ampere_gpu_with_tf32_off_is_named_and_not_with_tf32_or_bf16_parameters() -> None:
    gpu = facts(capability=[8, 0], float32_matmul_precision="highest")
    (verdict,) = diagnose_settings(gpu, STATS, device_type="cuda", framework="lightning")
    assert verdict["id"] == "fp32_matmul" and 'Trainer(precision="bf16-mixed")' in verdict["recommendation"]
    assert diagnose_settings({**gpu, "float32_matmul_precision": "high"}, STATS, device_type="cuda") == []
    assert diagnose_settings({**gpu, "capability": [7, 0]}, STATS, device_type="cuda") == []
    assert diagnose_settings({**gpu, "param_dtypes": ["bfloat16"]}, STATS, device_type="cuda") == []
    assert diagnose_settings(gpu, STATS, device_type="cuda", matmul_dtype=("bf16", "autocast")) == []


def test_a_shared_host_is_information_and_makes_step_time_variance_the_hosts() -> None:
    clock, own, busy = [0.0], [0.0], [0.0]
    host = HostShare(2, clock=lambda: clock[0], own_cpu_s=lambda: own[0], busy_s=lambda: busy[0])
    clock[0], own[0], busy[0] = 10.0, 9.0, 19.0  # 20 CPU-seconds: this process 9, the others 10
    assert host.read() == {"wall_s": 10.0, "others_share": 0.5}
    (verdict,) = diagnose_settings(facts(host=host.read()), STATS)
    assert (verdict["id"], verdict["severity"], verdict["estimated_gain"]) == ("shared_host", "info", 0)
    own[0], busy[0] = 19.0, 19.0  # the process's own work: no other process
    assert host.read() == {"wall_s": 10.0, "others_share": 0.0}
    assert diagnose_settings(facts(host=host.read()), STATS) == []
    clock[0] = 0.05
    assert host.read() is None  # too short to read in 10 ms ticks

    from perfhooks.report.statistics import PhaseStatistics, StepTiming
    from perfhooks.rules.live import diagnose_live

    stats = PhaseStatistics()
    for n in range(40):  # every fourth step three times as long
        stats.add(StepTiming(n, 30.0 if n % 4 == 3 else 10.0, {"forward": 4.0, "backward": 5.0}, 1))
    (program,) = [d for d in diagnose_live(stats) if d["id"] == "step_time_variance"]
    assert program["severity"] == "warning" and program["estimated_gain"] > 0
    (hosts,) = [d for d in diagnose_live(stats, host_share=0.5) if d["id"] == "step_time_variance"]
    assert (hosts["severity"], hosts["estimated_gain"]) == ("info", 0) and "the host's variance" in hosts["evidence"]


def test_the_audit_changes_no_setting_and_holds_no_model(tmp_path: Path) -> None:
    import gc
    import weakref

    from perfhooks.device.room import DeviceRoom

    before = (torch.is_anomaly_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    audit = SettingsAudit(DeviceRoom(None))
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    audit.watch(model)
    assert audit.read(1, window_open=False)["param_dtypes"] == ["bfloat16"]
    assert (torch.is_anomaly_enabled(), torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None and audit.read(2, window_open=False)["param_dtypes"] == []


def test_thresholds_take_the_shared_host_share() -> None:
    with pytest.raises(ValueError, match="shared_host_share"):
        Thresholds(shared_host_share=-1)


def test_a_windows_verdicts_are_fitted_to_what_the_run_knows() -> None:
    """The README's main job on a loaded 2-CPU host got, from its window's trace, "num_workers=4"; a plain loop
    in bf16 on a CPU got unfused_attention "at most 20% of the step" where going back to the hand-written attention
    saved 26% (CPU flash attention's backward is slower in bf16)."""
    from perfhooks.rules.pipeline import fitted_to_run
    from perfhooks.rules.verdicts import make

    loader = make("dataloader_bound", "warning", "t", "e", 0.3, "DataLoader(dataset, num_workers=4, ...)")
    attention = make("unfused_attention", "warning", "t", "hand-written attention takes 40% of the step", 0.2, "sdpa")
    fitted = {d["id"]: d for d in fitted_to_run([loader, attention], framework="lightning", accelerator=False,
                                                  cpus=2, device_type="cpu", matmul_dtype="bf16")}
    assert "2 CPU(s)" in fitted["dataloader_bound"]["recommendation"]
    assert "num_workers=4" not in fitted["dataloader_bound"]["recommendation"]
    assert (fitted["unfused_attention"]["severity"], fitted["unfused_attention"]["estimated_gain"]) == ("info", 0)
    assert "1.5x slower in bf16" in fitted["unfused_attention"]["evidence"]
    kept = {d["id"]: d for d in fitted_to_run([attention], framework=None, accelerator=False, cpus=8,
                                              device_type="cpu", matmul_dtype="fp32")}
    assert kept["unfused_attention"]["estimated_gain"] == 0.2


def evaluated(tmp_path: Path, no_grad: bool) -> dict[str, Any]:
    """A plain loop that evaluates under ``perf.evaluation()`` every 8 steps, with or without ``torch.no_grad()``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=None) as perf:
        for step in range(16):
            with perf.data_wait():
                x = torch.randn(32, 64)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 8 == 7:
                model.eval()
                with perf.evaluation(), (torch.no_grad() if no_grad else _nothing()):
                    for _ in range(3):
                        model(torch.randn(32, 64))
                model.train()
    return json.loads((tmp_path / "report.json").read_text())


def test_an_evaluation_that_builds_autograd_graphs_is_named_and_one_under_no_grad_is_not(tmp_path: Path) -> None:
    graphs = evaluated(tmp_path / "grad", no_grad=False)
    verdict = ids(graphs)["evaluation_with_grad"]
    assert verdict["measured"]["evaluation_grad_forwards"] == 6 and verdict["gain_basis"] == "run"
    assert verdict["estimated_gain"] == pytest.approx(graphs["run"]["evaluation_s"] / graphs["run"]["wall_s"],
                                                      abs=1e-3)
    assert "torch.no_grad()" in verdict["recommendation"]
    quiet = evaluated(tmp_path / "no_grad", no_grad=True)
    assert "evaluation_with_grad" not in ids(quiet) and quiet["settings"]["evaluation_grad_forwards"] == 0


def test_loader_workers_and_threads_past_the_usable_cpus_are_named() -> None:
    (crowded,) = diagnose_settings(facts(intra_op_threads=2, usable_cpus=2, loader_workers=2), STATS)
    assert crowded["title"] == "Loader workers and training threads outnumber the CPUs"
    assert "torch.set_num_threads(1)" in crowded["recommendation"] and crowded["estimated_gain"] == 0
    assert diagnose_settings(facts(intra_op_threads=2, usable_cpus=4, loader_workers=2), STATS) == []


def test_the_audit_reads_the_most_loader_workers_a_run_took_batches_from(tmp_path: Path, all_threads: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=8,
                                         num_workers=2)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, console=False, schedule=None) as perf:
        for (x,) in perf.batches(loader):
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["loader_workers"] >= 2


def test_an_optimizer_built_with_foreach_false_over_many_tensors_is_information(tmp_path: Path) -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(30)])  # 60 parameter tensors
    for foreach, expected in ((False, True), (None, False)):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
        folder = tmp_path / str(foreach)
        with perfhooks.profile(model, optimizer, output_dir=folder, console=False, schedule=None) as perf:
            for _ in range(12):
                with perf.data_wait():
                    x = torch.randn(4, 8)
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        report = json.loads((folder / "report.json").read_text())
        assert ("foreach_off" in ids(report)) is expected
    verdict = ids(json.loads((tmp_path / "False" / "report.json").read_text()))["foreach_off"]
    assert verdict["severity"] == "info" and verdict["measured"]["optimizers"] == [{"optimizer": "Adam",
                                                                                    "tensors": 60}]
