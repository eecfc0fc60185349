"""Issue 27: samples and tokens per second, FLOPs per step with their source, the peak table, MFU and the
waterfall from the ideal step to the measured one."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import ManualClock, mlp, random_loader, read_report
from perfhooks import Engine, PerfConfig, Schedule

TRACES = Path(__file__).parent / "data" / "traces"


def manual_engine(tmp_path: Path, **settings: Any) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    settings.setdefault("schedule", None)
    settings.setdefault("console", False)
    return Engine(PerfConfig(**settings), tmp_path, "test", clock=clock), clock


def token_batch(samples: int, seq_len: int, real_tokens: int) -> dict[str, torch.Tensor]:
    mask = torch.zeros(samples, seq_len, dtype=torch.long)
    mask.view(-1)[:real_tokens] = 1
    return {"input_ids": torch.zeros(samples, seq_len, dtype=torch.long), "attention_mask": mask}


def manual_step(engine: Engine, clock: ManualClock, batches: list[Any], wait: float = 2.0, forward: float = 5.0,
                backward: float = 10.0, optimizer: float = 2.0, other: float = 1.0) -> None:
    for batch in batches:  # micro-batches
        engine.fetch()
        clock.advance(wait)
        engine.phase_start("forward")
        engine.batch(batch)
        clock.advance(forward)
        engine.phase_start("backward")
        clock.advance(backward)
        engine.phase_end("backward")
    engine.phase_start("optimizer")
    clock.advance(optimizer)
    engine.phase_end("optimizer")
    clock.advance(other)
    engine.stepped()


def engine_step(engine: Engine, optimizer: torch.optim.Optimizer, batch: Any, loss_of: Any) -> None:
    """One training step announced as an integration would: the fetch, the forward (its batch seen), backward and
    the optimizer."""
    engine.fetch()
    engine.phase_start("forward")
    engine.batch(batch)
    loss = loss_of(batch)
    engine.phase_start("backward")
    loss.backward()
    engine.phase_start("optimizer")
    optimizer.step()
    optimizer.zero_grad()
    engine.stepped()


# ----------------------------------------------------------------------------- samples and tokens
def test_samples_and_tokens_per_second_against_a_manual_clock(tmp_path: Path) -> None:
    """Steps of exactly 20 ms, 8 samples of 16 positions of which 100 are real tokens (padding excluded)."""
    engine, clock = manual_engine(tmp_path)
    for _ in range(5):
        manual_step(engine, clock, [token_batch(8, 16, 100)])
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["samples_per_s"] == pytest.approx(8 / 0.020)
    assert throughput["tokens_per_s"] == pytest.approx(100 / 0.020)
    assert (throughput["samples_per_step"], throughput["tokens_per_step"]) == (8, 100)
    assert throughput["token_source"] == "attention_mask"


def test_accumulated_micro_batches_add_up(tmp_path: Path) -> None:
    """Two micro-batches per step (each 2+5+10 ms), tokens from input_ids (no mask): 2x the samples a step."""
    engine, clock = manual_engine(tmp_path)
    for _ in range(4):
        manual_step(engine, clock, [{"input_ids": torch.zeros(4, 32, dtype=torch.long)}] * 2)
    throughput = engine.close()["throughput"]  # type: ignore[index]
    step_s = (2 * (2 + 5 + 10) + 2 + 1) / 1e3
    assert throughput["samples_per_s"] == pytest.approx(8 / step_s)
    assert throughput["tokens_per_s"] == pytest.approx(256 / step_s)
    assert throughput["token_source"] == "input_ids"


def test_a_batch_of_plain_tensors_counts_samples_and_no_tokens(tmp_path: Path) -> None:
    engine, clock = manual_engine(tmp_path)
    for _ in range(3):
        manual_step(engine, clock, [(torch.randn(12, 3), torch.randn(12, 1))])
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["samples_per_s"] == pytest.approx(12 / 0.020)
    assert throughput["tokens_per_s"] is None and throughput["token_source"] is None


def test_a_mask_on_an_accelerator_is_not_read() -> None:
    from perfhooks.runtime.step.batches import FROM_IDS_MASK_ON_DEVICE, count_batch

    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long),
             "attention_mask": torch.ones(2, 8, dtype=torch.long, device="meta")}
    counted = count_batch(batch)
    assert counted is not None and (counted.samples, counted.tokens) == (2, 16)
    assert counted.token_source == FROM_IDS_MASK_ON_DEVICE


def test_lightning_hf_and_accelerate_runs_report_throughput(tmp_path: Path) -> None:
    """Each framework's real loop, defaults on: samples per second; tokens for the HF run's token inputs."""
    import lightning as L
    from accelerate import Accelerator

    from helpers import lightning_mlp
    from hf_trainer_example import build_trainer
    from perfhooks.integrations.accelerate import attach
    from perfhooks.integrations.lightning import PerfCallback
    from perfhooks.integrations.transformers import PerfTrainerCallback

    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, default_root_dir=str(tmp_path / "pl"),
                        enable_progress_bar=False, callbacks=[PerfCallback(console=False, schedule=None)])
    trainer.fit(lightning_mlp(), random_loader(6, batch_size=8))
    lightning = read_report(Path(trainer.log_dir) / "perfhooks")["throughput"]
    assert lightning["samples_per_step"] == 8 and lightning["samples_per_s"] > 0
    assert lightning["tokens_per_s"] is None

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build_trainer(str(tmp_path / "hf"), steps=4, batch_size=2, accumulate=2,
                  callback=PerfTrainerCallback(console=False, schedule=None)).train()
    hf = read_report(tmp_path / "hf" / "_perfhooks")["throughput"]
    assert (hf["samples_per_step"], hf["tokens_per_step"]) == (4, 4 * 64)  # 2 x 2 sequences of 64 tokens
    assert hf["tokens_per_s"] == pytest.approx(hf["samples_per_s"] * 64, rel=1e-4)  # each rounded to 4 places
    assert hf["flops_source"].startswith("transformers: TrainerState.total_flos")

    accelerator = Accelerator(cpu=True)
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, random_loader(6, batch_size=8))
    with attach(accelerator, output_dir=tmp_path / "acc", console=False, schedule=None):
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    assert read_report(tmp_path / "acc")["throughput"]["samples_per_step"] == 8


# ----------------------------------------------------------------------------- FLOPs per step
def _linear_flops(batch: int, layers: list[tuple[int, int]]) -> int:
    """Training FLOPs of a stack of linear layers: 2*in*out per sample forward; backward twice that, except the
    first layer's gradient for its input, which autograd does not compute (the input needs no grad)."""
    forward = sum(2 * batch * i * o for i, o in layers)
    first_input_grad = 2 * batch * layers[0][0] * layers[0][1]
    return 3 * forward - first_input_grad


def test_the_measured_step_of_an_mlp_is_its_analytic_count(tmp_path: Path) -> None:
    """FlopCounterMode over the first window's warm-up step; that step is perfhooks' own."""
    from helpers import plain_loop

    engine = Engine(PerfConfig(schedule=Schedule(skip_first=2, warmup=1, active=2), console=False,
                               analyze_windows=False), tmp_path, "plain")
    plain_loop(engine, 8)
    report = engine.close()
    throughput = report["throughput"]  # type: ignore[index]
    assert throughput["flops_per_step"] == _linear_flops(8, [(32, 64), (64, 1)])
    assert throughput["flops_source"].endswith("(step 2)")
    assert report["series"]["perfhooks"][2] == 1  # type: ignore[index]


def test_an_accumulated_step_is_counted_on_its_first_micro_batch(tmp_path: Path) -> None:
    """Four micro-batches a step, no batch seen (no samples): the count stops at the second fetch and is scaled by
    the step's micro-batches; the number is the whole step's, and the source says how it was taken."""
    from helpers import plain_loop

    engine = Engine(PerfConfig(schedule=Schedule(skip_first=2, warmup=1, active=1), console=False,
                               analyze_windows=False), tmp_path, "plain")
    plain_loop(engine, 5, accumulate=4)
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["flops_per_step"] == 4 * _linear_flops(8, [(32, 64), (64, 1)])
    assert throughput["flops_source"].endswith("(step 2, its first micro-batch counted, times 4 by the step's "
                                               "micro-batches)")


def test_a_smaller_last_micro_batch_is_scaled_by_the_steps_samples(tmp_path: Path) -> None:
    """Micro-batches of 8, 8, 8 and 4 samples: the first one's count times 28/8, the analytic count of 28 samples
    (a linear stack's FLOPs follow its samples)."""
    from helpers import plain_loop

    engine = Engine(PerfConfig(schedule=Schedule(skip_first=1, warmup=1, active=1), console=False,
                               analyze_windows=False), tmp_path, "plain")
    plain_loop(engine, 3, micro_batch_sizes=(8, 8, 8, 4))
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["flops_per_step"] == _linear_flops(28, [(32, 64), (64, 1)])
    assert "times 3.5 by the step's samples" in throughput["flops_source"]


def test_the_measured_step_of_a_tiny_gpt2_is_within_two_percent_of_the_analytic_count(tmp_path: Path) -> None:
    """6 x parameters x tokens for the matmuls, plus attention (4 T d a token a layer, forward) and the output
    projection (2 d V), times 3 for forward and backward."""
    from hf_trainer_example import tiny_gpt2

    model = tiny_gpt2()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    config = model.config
    d, layers, vocab, seq, batch = config.n_embd, config.n_layer, config.vocab_size, 64, 2
    engine = Engine(PerfConfig(schedule=Schedule(skip_first=1, warmup=1, active=1), console=False,
                               analyze_windows=False), tmp_path, "plain")
    for _ in range(3):
        engine_step(engine, optimizer, {"input_ids": torch.randint(0, vocab, (batch, seq))},
                    lambda inputs: model(input_ids=inputs["input_ids"], labels=inputs["input_ids"]).loss)
    throughput = engine.close()["throughput"]  # type: ignore[index]
    tokens = batch * seq
    analytic = 3 * tokens * (layers * (24 * d * d + 4 * seq * d) + 2 * d * vocab)
    assert throughput["flops_per_step"] == pytest.approx(analytic, rel=0.02)


def test_user_counts_win_and_name_their_source(tmp_path: Path) -> None:
    engine, clock = manual_engine(tmp_path, flops_per_sample=1e6, peak_flops=1e9)
    for _ in range(4):
        manual_step(engine, clock, [(torch.randn(10, 3),)])
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["flops_per_step"] == 1e7 and throughput["flops_source"].startswith("user: flops_per_sample")
    assert throughput["achieved_flops_per_s"] == pytest.approx(1e7 / 0.020)
    assert throughput["mfu"] == pytest.approx(1e7 / 0.020 / 1e9)
    assert throughput["peak_source"] == "user: peak_flops"


def test_hf_total_flos_is_reported_beside_the_measured_count(tmp_path: Path) -> None:
    """Issue 41, item 4: the same tiny GPT-2 read 2.44 GFLOP/step under the HF Trainer (total_flos) and 4.39 under
    accelerate (measured). MFU uses the measured count in both; HF's own definition (6 x non-embedding parameters x
    tokens: no attention, no tied output projection) is beside it, named."""
    from hf_trainer_example import build_trainer
    from perfhooks.integrations.transformers import PerfTrainerCallback

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    trainer = build_trainer(str(tmp_path), steps=12, batch_size=2, callback=PerfTrainerCallback(console=False))
    trainer.train()
    throughput = read_report(tmp_path / "_perfhooks")["throughput"]
    parameters = trainer.model.num_parameters(exclude_embeddings=True)
    assert throughput["framework_flops_per_step"] == pytest.approx(6 * parameters * 2 * 64)
    assert "total_flos" in throughput["framework_flops_source"]
    assert "FlopCounterMode" in throughput["flops_source"]
    assert throughput["flops_per_step"] > throughput["framework_flops_per_step"]  # attention and the LM head


def test_no_count_and_no_peak_say_why(tmp_path: Path) -> None:
    engine, clock = manual_engine(tmp_path)
    for _ in range(3):
        manual_step(engine, clock, [(torch.randn(4, 3),)])
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["mfu"] is None and throughput["flops_per_step"] is None
    assert any(line.startswith("FLOPs per step: no capture window") for line in throughput["missing"])
    assert any("pass peak_flops" in line for line in throughput["missing"])


# ----------------------------------------------------------------------------- peaks
def _trace_device_names() -> dict[str, list[str]]:
    """Each test trace's ``deviceProperties`` names, read with the standard library's decoder from the array itself
    (the traces are 419 MB of JSON in all: parsing every event took most of this test's time)."""
    names = {}
    decoder = json.JSONDecoder()
    for path in sorted(TRACES.glob("*/*.json.gz")):
        text = gzip.decompress(path.read_bytes()).decode()
        key = text.find('"deviceProperties"')
        if key < 0:
            continue
        properties, _ = decoder.raw_decode(text, text.index("[", key))
        if properties:
            names[path.name] = sorted({entry.get("name") for entry in properties})
    return names


def test_the_peak_table_resolves_every_test_traces_gpu_or_says_which_is_missing() -> None:
    from perfhooks.analysis.peaks import find_peak, peak_flops

    names = _trace_device_names()
    resolved = {name: find_peak(name) for found in names.values() for name in found}
    # never guessed: a GPU with no datasheet row in the table says so (no MFU) rather than borrowing another's
    assert {name for name, peak in resolved.items() if peak is None} == {"AMD Radeon Graphics",
                                                                         "NVIDIA GeForce RTX 4090",
                                                                         "NVIDIA RTX A4000"}
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "tf32") == 156e12
    assert peak_flops("AMD Instinct MI300X", "fp8") == 2614.9e12
    assert peak_flops("NVIDIA B200", "fp32") is None  # not in the datasheet figures: no MFU rather than a guess
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert find_peak("NVIDIA H100 PCIe").device == "H100 PCIe"  # type: ignore[union-attr]
    assert find_peak("NVIDIA A10G") is None and find_peak("NVIDIA A10").device == "A10"  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- the waterfall
def test_the_waterfall_adds_up_to_the_step(tmp_path: Path) -> None:
    """20 ms steps, a user peak, a window that measured 60% GPU busy: ideal + compute beyond ideal + device idle
    + data wait + other = the step (within 1%); the largest loss names the verdict that explains it."""
    from perfhooks.report.throughput import waterfall

    engine, clock = manual_engine(tmp_path, flops_per_step=2e9, peak_flops=1e12)
    for _ in range(5):
        manual_step(engine, clock, [(torch.randn(4, 3),)])
    report = engine.close()
    section = report["throughput"]  # type: ignore[index]
    fall = section["waterfall"]
    assert section["mfu"] == pytest.approx(2e9 / 0.020 / 1e12)
    assert fall["ideal_ms"] == pytest.approx(2.0) and fall["compute_beyond_ideal_ms"] is None  # no window: not split
    assert fall["ideal_ms"] + fall["compute_and_idle_ms"] + fall["data_wait_ms"] + fall["other_ms"] == \
        pytest.approx(20.0, rel=0.01)
    split = waterfall(engine.stats, 20.0, 2.0, {"gpu_utilization": 0.6},
                      [{"id": "launch_bound"}, {"id": "dataloader_bound"}])
    parts = [split[k] for k in ("ideal_ms", "compute_beyond_ideal_ms", "device_idle_ms", "data_wait_ms", "other_ms")]
    assert sum(parts) == pytest.approx(20.0, rel=0.01)
    assert (split["compute_beyond_ideal_ms"], split["device_idle_ms"]) == pytest.approx((10.0, 5.0))
    assert (split["largest"], split["explained_by"]) == ("compute_beyond_ideal_ms", None)


def test_a_compiled_model_gets_no_measured_count_and_says_so(tmp_path: Path) -> None:
    model = torch.compile(mlp(), backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    engine = Engine(PerfConfig(schedule=Schedule(skip_first=2, warmup=1, active=1), console=False,
                               analyze_windows=False), tmp_path, "plain")
    for _ in range(4):
        engine_step(engine, optimizer, torch.randn(8, 32), lambda x: model(x).square().mean())
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["flops_per_step"] is None
    assert any("torch.compile" in line for line in throughput["missing"])


# ----------------------------------------------------------------------------- GEMM efficiency in analyze
def test_gemm_flops_by_hand() -> None:
    """2·M·K·N: addmm's matrices are its 2nd and 3rd inputs, bmm's are batched."""
    from perfhooks.analysis.gemm import gemm_flops

    # the H100 trace's addmm: bias [1024], x [8944, 1024], w [1024, 1024]
    assert gemm_flops("aten::addmm", [[1024], [8944, 1024], [1024, 1024], [], []]) == 2 * 8944 * 1024 * 1024
    # the B200 trace's mm: [1, 2880] x [2880, 25136] (the LM head of one token)
    assert gemm_flops("aten::mm", [[1, 2880], [2880, 25136]]) == 2 * 1 * 2880 * 25136
    assert gemm_flops("aten::bmm", [[1, 32, 1], [1, 1, 559]]) == 2 * 32 * 1 * 559
    assert gemm_flops("aten::mm", [[4, 3], [5, 6]]) is None  # not a matmul's shapes


def test_analyze_reports_gemm_efficiency_on_the_h100_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from perfhooks.cli import main
    from perfhooks.offline.analyze import analyze_paths

    path = TRACES / "more" / "tl_h100_qwen05b.json.gz"
    gemm = analyze_paths([path])["metrics"]["gemm"]
    assert gemm["device"] == "NVIDIA H100 80GB HBM3" and gemm["peak_tflops"] == 989.5
    assert gemm["dtype"] == "bf16" and 0 < gemm["efficiency"] < 1
    assert gemm["achieved_tflops"] == pytest.approx(gemm["flops"] / gemm["device_us"] / 1e6, rel=1e-3)
    top = gemm["top"][0]
    assert top["achieved_tflops"] == pytest.approx(top["flops"] / top["device_us"] / 1e6, rel=1e-2)
    assert main(["analyze", str(path)]) == 0
    assert "TFLOP/s" in capsys.readouterr().out


@pytest.mark.parametrize(("trace", "device", "peak"), [
    ("tl_b200_eager.json.gz", "NVIDIA B200", 2250.0),
    ("tl_mi300_resnet_act_ckpt.json.gz", "AMD Instinct MI300X", 1307.4),
    ("tl_sglang_qwen3_prefilldecode.json.gz", "AMD Instinct MI300X", 1307.4),  # kernels on physical device 9
])
def test_gemm_efficiency_on_the_b200_and_mi300x_traces(trace: str, device: str, peak: float) -> None:
    from perfhooks.offline.analyze import analyze_paths

    gemm = analyze_paths([TRACES / "more" / trace])["metrics"]["gemm"]
    assert (gemm["device"], gemm["dtype"], gemm["peak_tflops"]) == (device, "bf16", peak)
    assert 0 < gemm["efficiency"] < 1


def test_the_null_engine_takes_every_event_an_integration_sends() -> None:
    """An integration holds a NullEngine when perfhooks could not start: every call it makes must exist there."""
    import re

    from perfhooks.runtime.engine import NullEngine

    root = Path(__file__).resolve().parents[1] / "integrations"
    called = set()
    for source in root.glob("*.py"):
        called |= set(re.findall(r"\bengine\.([a-z_]+)\(", source.read_text()))
    assert called and {name for name in called if not hasattr(NullEngine, name)} == set()


def test_a_peak_below_the_achieved_rate_gives_no_mfu_and_says_why(tmp_path: Path) -> None:
    """1e7 FLOPs in a 20 ms step is 5e8 FLOP/s: against a peak of 1e8 that is an MFU of 5, which no run reaches.
    No figure (before: ``mfu: 5.0``; 2.48 on an H100 under autocast read against the fp32 peak)."""
    engine, clock = manual_engine(tmp_path, flops_per_sample=1e6, peak_flops=1e8)
    for _ in range(4):
        manual_step(engine, clock, [(torch.randn(10, 3),)])
    throughput = engine.close()["throughput"]  # type: ignore[index]
    assert throughput["mfu"] is None and throughput["waterfall"] is None
    assert any(line.startswith("MFU: the achieved 5e+08 FLOP/s is 5.00x the peak") and "the peak or the dtype is "
               "wrong" in line for line in throughput["missing"]), throughput["missing"]


def test_a_plain_loop_under_cpu_autocast_bf16_reports_bf16(tmp_path: Path) -> None:
    """nanoGPT's pattern: ``with torch.autocast(device_type, dtype=torch.bfloat16): loss = model(x, y)``. The
    dtype is what the forward ran in (before: ``fp32``, "no mixed precision setting seen")."""
    import perfhooks
    from helpers import mlp

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with perfhooks.profile(model, optimizer, output_dir=tmp_path, schedule=None, console=False) as perf:
        for _ in range(3):
            with perf.data_wait():
                x, y = torch.randn(8, 32), torch.randn(8, 1)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    throughput = json.loads((tmp_path / "report.json").read_text())["throughput"]
    assert throughput["matmul_dtype"] == "bf16"
    assert throughput["dtype_source"] == "torch.autocast('cpu', dtype=bf16) at the model's forward"


def test_a_lightning_fit_that_autocasts_in_its_training_step_reports_what_its_matmuls_ran_in(tmp_path: Path) -> None:
    """Lightning at its default precision ("32-true") with the user's own ``torch.autocast`` in ``training_step``:
    the setting says fp32, the step's matmuls ran in bf16 (counted in the measured FLOP step, below autocast)."""
    import lightning as L

    from perfhooks.integrations.lightning import PerfCallback

    class Autocasting(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = self.layers(x)
            return torch.nn.functional.mse_loss(out.float(), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=14, accelerator="cpu", devices=1,
                        callbacks=[PerfCallback(output_dir=tmp_path / "perf", console=False)])
    trainer.fit(Autocasting(), random_loader(14))
    throughput = read_report(tmp_path / "perf")["throughput"]
    assert throughput["matmul_dtype"] == "bf16", throughput["dtype_source"]
    assert throughput["dtype_source"].startswith("the measured step's matmuls ran in bf16 (100% of their work")
