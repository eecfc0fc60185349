"""Issue 83: the recipe audit. Each knob copied from a large model's recipe (micro-batches with accumulation,
activation checkpointing, an evaluation batch smaller than training's, fixed-width padding, a precision default
slower here) is named on real Lightning, HF ``Trainer``, TRL ``SFTTrainer`` and ``Accelerator`` runs with the
knob on, and not with it off; the settings' verdicts agree with the host; ``tune`` plans the recipe's knobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers import default_trainer, random_loader, read_report

REPO = Path(__file__).resolve().parents[1]
RECIPE = {"activation_checkpointing", "small_micro_batches", "evaluation_batch"}


def ids(report: dict[str, Any]) -> set[str]:
    return {d["id"] for d in report["diagnoses"]}


# ----------------------------------------------------------------------------- TRL's SFTTrainer, the whole job
@pytest.mark.slow
def test_a_trl_fine_tune_from_a_large_models_recipe_is_named_before_the_first_window(tmp_path: Path) -> None:
    """The recipe as a new user copies it (micro-batch 1 x 8, SFTConfig's checkpointing and bf16 defaults,
    padding to 128, an evaluation batch of 1) under ``perfhooks run``; then the same job with each knob fixed."""
    pytest.importorskip("trl")
    script = REPO / "tests" / "scripts" / "recipe" / "trl_recipe.py"
    runs = {}
    for name, fixed in (("written", "0"), ("fixed", "1")):
        env = {**os.environ, "RECIPE_FIXED": fixed, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        done = subprocess.run([sys.executable, "-m", "perfhooks", "run", str(script), str(tmp_path / name), "12"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = (read_report(tmp_path / name / "_perfhooks"), done.stderr)
    written, stderr = runs["written"]
    found = {d["id"]: d for d in written["diagnoses"]}
    assert set(found) >= RECIPE, sorted(found)
    assert "SFTConfig(per_device_train_batch_size=8, gradient_accumulation_steps=1)" in \
        found["small_micro_batches"]["recommendation"]  # the same 8 samples a step
    assert "SFTConfig's default (gradient_checkpointing=True)" in found["activation_checkpointing"]["evidence"]
    assert "SFTConfig(per_device_eval_batch_size=8)" in found["evaluation_batch"]["recommendation"]
    assert "SFTConfig(pad_to_multiple_of=None)" in found["padding_waste"]["recommendation"]
    assert written["recipe"]["precision_source"].startswith("SFTConfig's default")
    # the first answer comes before the first window starts (torch.profiler's own line), in the console
    early = stderr.index("before any trace")
    assert early < stderr.index("profiler_start")
    for name in ("Small micro-batches", "Activation checkpointing"):
        assert name in stderr[early:stderr.index("profiler_start")]
    fixed, _ = runs["fixed"]
    assert not ids(fixed) & (RECIPE | {"mixed_precision_slower"}), sorted(ids(fixed))
    assert fixed["recipe"]["precision"] == "fp32" and fixed["recipe"]["checkpointing"] is False


# ----------------------------------------------------------------------------- HF Trainer
@pytest.mark.slow
def test_an_hf_trainers_recipe_knobs_are_named_with_them_on_and_not_with_them_off(tmp_path: Path) -> None:
    from test_real_scripts_round3 import hf_trainer

    from perfhooks.integrations.transformers import PerfTrainerCallback

    knobs = {"on": dict(per_device_train_batch_size=1, gradient_accumulation_steps=4, per_device_eval_batch_size=1,
                        activation_checkpointing=True),
             "off": dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, per_device_eval_batch_size=4)}
    reports = {}
    for name, settings in knobs.items():
        trainer = hf_trainer(tmp_path / name, 8, PerfTrainerCallback(console=False, schedule=None),
                             eval_strategy="steps", eval_steps=8, **settings)
        trainer.train()
        reports[name] = read_report(tmp_path / name / "_perfhooks")
    on = {d["id"]: d for d in reports["on"]["diagnoses"]}
    assert set(on) >= RECIPE, sorted(on)
    assert "TrainingArguments(activation_checkpointing=False)" in on["activation_checkpointing"]["recommendation"]
    assert on["small_micro_batches"]["measured"]["merge"] == 4
    assert on["evaluation_batch"]["gain_basis"] == "run"
    assert reports["on"]["recipe"]["micro_batch"] == 1 and reports["on"]["recipe"]["accumulation"] == 4
    assert not ids(reports["off"]) & RECIPE, sorted(ids(reports["off"]))


# ----------------------------------------------------------------------------- Lightning
class Checkpointed(nn.Module):
    """A block that recomputes its activations in backward, flagged as HF's layers are (``gradient_checkpointing``)."""

    def __init__(self, on: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        self.gradient_checkpointing = on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gradient_checkpointing and self.training:
            return torch.utils.checkpoint.checkpoint(self.net, x, use_reentrant=False)
        return self.net(x)


def lightning_module(checkpointing: bool) -> Any:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.block = Checkpointed(checkpointing)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.block(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.block(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    return Module()


@pytest.mark.slow
def test_lightnings_recipe_knobs_are_named_with_them_on_and_not_with_them_off(tmp_path: Path) -> None:
    from perfhooks.integrations.lightning import PerfCallback

    reports = {}
    for name, (batch, accumulate, checkpointing) in {"on": (1, 4, True), "off": (4, 1, False)}.items():
        torch.manual_seed(0)
        trainer = default_trainer(tmp_path / name, max_steps=8, accumulate_grad_batches=accumulate,
                                  limit_val_batches=4, val_check_interval=8,
                                  callbacks=[PerfCallback(console=False, schedule=None, wandb=False)])
        trainer.fit(lightning_module(checkpointing), random_loader(40, batch_size=batch),
                    random_loader(8, batch_size=batch, seed=1))
        reports[name] = read_report(Path(trainer.log_dir) / "perfhooks")
    on = {d["id"]: d for d in reports["on"]["diagnoses"]}
    assert set(on) >= RECIPE, sorted(on)
    assert "accumulate_grad_batches=1" in on["small_micro_batches"]["recommendation"]
    assert reports["on"]["recipe"]["eval_batch"] == 1 and reports["on"]["recipe"]["checkpointing"] is True
    assert not ids(reports["off"]) & RECIPE, sorted(ids(reports["off"]))


# ----------------------------------------------------------------------------- accelerate
@pytest.mark.slow
def test_accelerates_micro_batches_with_accumulation_are_named_from_what_the_engine_counted(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    reports = {}
    for name, (batch, accumulate) in {"on": (2, 4), "off": (8, 1)}.items():
        torch.manual_seed(0)
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
        net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
        net, optimizer, loader = accelerator.prepare(net, optimizer, random_loader(64 // batch * 2, batch))
        with attach(accelerator, output_dir=tmp_path / name, schedule=None, console=False):
            for x, y in loader:
                with accelerator.accumulate(net):
                    accelerator.backward(nn.functional.mse_loss(net(x), y))
                    optimizer.step()
                    optimizer.zero_grad()
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    on = {d["id"]: d for d in reports["on"]["diagnoses"]}
    assert "small_micro_batches" in on, sorted(on)
    assert on["small_micro_batches"]["measured"]["micro_batch"] == 2
    assert "Accelerator(gradient_accumulation_steps=1)" in on["small_micro_batches"]["recommendation"]
    assert "small_micro_batches" not in ids(reports["off"])


# ----------------------------------------------------------------------------- the rules on their facts
class Stats:
    sampled_steps = 20
    recent: tuple[Any, ...] = ()

    def steady_share(self, name: str) -> float:
        return {"forward": 0.3, "backward": 0.6, "optimizer": 0.05}.get(name, 0.0)


class Memory:
    def __init__(self, peak: int, capacity: int | None) -> None:
        self.peak, self.capacity_bytes = {"used_bytes": peak}, capacity


def test_checkpointing_is_named_only_with_memory_to_spare_and_priced_at_the_forward() -> None:
    from perfhooks.rules.recipe import diagnose_recipe

    recipe = {"checkpointing": True, "checkpointing_source": "x", "spell": {"checkpointing_off": "X(off)"}}
    (verdict,) = diagnose_recipe(recipe, Stats(), Memory(2**30, 32 * 2**30))
    assert verdict["id"] == "activation_checkpointing" and verdict["estimated_gain"] == pytest.approx(0.3)
    assert verdict["recommendation"].startswith("X(off)")
    assert diagnose_recipe(recipe, Stats(), Memory(20 * 2**30, 32 * 2**30)) == []  # the memory may be needed
    assert diagnose_recipe(recipe, Stats(), Memory(2**30, None)) == []  # capacity unknown: silence
    assert diagnose_recipe({**recipe, "checkpointing": False}, Stats(), Memory(2**30, 32 * 2**30)) == []


def test_micro_batches_merge_only_as_many_as_the_memory_allows_and_keep_the_samples_a_step() -> None:
    from perfhooks.rules.recipe import diagnose_recipe, merge_factor

    assert merge_factor(8, 0.05) == 8 and merge_factor(8, 0.3) == 2 and merge_factor(8, 0.5) == 1
    assert merge_factor(8, None) == 1
    recipe = {"micro_batch": 1, "accumulation": 8, "spell": {"micro_batch": "B={micro_batch} A={accumulation}"}}
    (verdict,) = diagnose_recipe(recipe, Stats(), Memory(8 * 2**30, 32 * 2**30))  # 25%: 3x fits, 2 divides 8
    assert verdict["measured"]["merge"] == 2 and verdict["recommendation"].startswith("B=2 A=4: the same 8 samples")
    assert verdict["estimated_gain"] == pytest.approx(0.9 * 0.5)
    assert diagnose_recipe({**recipe, "micro_batch": 16}, Stats(), Memory(2**30, 32 * 2**30)) == []
    assert diagnose_recipe({**recipe, "accumulation": 1}, Stats(), Memory(2**30, 32 * 2**30)) == []


def test_the_evaluation_batch_is_priced_on_the_evaluations_share_and_evaluation_heavy_names_it() -> None:
    from perfhooks.rules.recipe import diagnose_recipe
    from perfhooks.rules.run import diagnose_run

    recipe = {"micro_batch": 2, "accumulation": 4, "eval_batch": 1, "spell": {"eval_batch": "E({eval_batch})"}}
    (before,) = [d for d in diagnose_recipe(recipe, Stats(), None, {"wall_s": 10.0, "evaluation_s": 0.0})
                 if d["id"] == "evaluation_batch"]
    assert before["severity"] == "info" and before["estimated_gain"] == 0 and "no evaluation has run" in \
        before["evidence"]
    run = {"wall_s": 10.0, "evaluation_s": 1.0, "evaluations": 2, "checkpointing_s": 0.0, "checkpoints": 0}
    (priced,) = [d for d in diagnose_recipe(recipe, Stats(), None, run) if d["id"] == "evaluation_batch"]
    assert priced["estimated_gain"] == pytest.approx(0.1 * 7 / 8) and priced["recommendation"] == "E(8)."
    heavy = {**run, "evaluation_s": 5.0}
    assert not [d for d in diagnose_recipe(recipe, Stats(), None, heavy) if d["id"] == "evaluation_batch"]
    (named,) = diagnose_run(heavy, recipe=recipe, stats=Stats())
    assert named["id"] == "evaluation_heavy"
    assert named["recommendation"].startswith("Evaluate in batches of 8, not 1: E(8)")


def test_a_measured_bf16_loss_is_said_with_its_source_and_silences_fp32_matmul() -> None:
    from test_settings_audit import facts

    from perfhooks.rules.recipe import diagnose_recipe
    from perfhooks.rules.settings import diagnose_settings

    class Steady(Stats):
        class steady_step:
            count = 10

            @staticmethod
            def quantile(q: float) -> float:
                return 100.0

    slower = {"matmul_speed": {"fp32_ms": 1.0, "bf16_ms": 3.0, "shapes_said": "s"}}
    recipe = {"precision": "bf16", "precision_source": "SFTConfig's default", "accumulation": 4,
              "spell": {"precision_off": "SFTConfig(bf16=False)"}}
    (verdict,) = diagnose_recipe(recipe, Steady(), None, None, slower)
    assert verdict["id"] == "mixed_precision_slower" and verdict["estimated_gain"] == pytest.approx(0.08)
    assert "SFTConfig's default" in verdict["evidence"]
    assert verdict["recommendation"].startswith("SFTConfig(bf16=False)")
    assert diagnose_recipe({**recipe, "precision": "fp32"}, Steady(), None, None, slower) == []
    fp32_run = facts(faster_cpu_type="amx", **slower)
    assert [d["id"] for d in diagnose_settings(fp32_run, Steady())] == []  # bf16 measured slower: no advice for it
    faster = facts(faster_cpu_type="amx", matmul_speed={"fp32_ms": 3.0, "bf16_ms": 1.0, "shapes_said": "s"})
    (fp32,) = diagnose_settings(faster, Steady())
    assert fp32["id"] == "fp32_matmul" and fp32["estimated_gain"] == pytest.approx(0.02)  # 2 ms of a 100 ms step


def test_a_one_thread_run_on_a_busy_host_is_not_told_to_raise_its_threads() -> None:
    from test_settings_audit import STATS, facts

    from perfhooks.rules.settings import diagnose_settings

    busy = {"wall_s": 30.0, "others_share": 0.516}
    verdicts = {d["id"]: d for d in diagnose_settings(facts(intra_op_threads=1, usable_cpus=2, host=busy), STATS)}
    assert "cpu_threads" not in verdicts and "shared_host" in verdicts
    idle = diagnose_settings(facts(intra_op_threads=1, usable_cpus=2, host={"wall_s": 30.0, "others_share": 0.0}),
                             STATS)
    assert [d["id"] for d in idle] == ["cpu_threads"]
    half = {d["id"]: d for d in diagnose_settings(facts(intra_op_threads=1, usable_cpus=8, host=busy), STATS)}
    assert "torch.set_num_threads(4)" in half["cpu_threads"]["recommendation"]  # the CPUs left idle, not all 8


def test_the_matmul_probe_leaves_the_users_random_state_alone() -> None:
    from perfhooks.device.matmul_speed import measure

    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    speed = measure([model], rows=8)
    assert torch.equal(torch.rand(3), expected)
    assert speed is not None and speed["fp32_ms"] > 0 and speed["bf16_ms"] > 0 and len(speed["shapes"]) == 2


# ----------------------------------------------------------------------------- tune
def test_tune_plans_the_recipes_knobs_from_the_baselines_facts() -> None:
    from perfhooks.offline.tune import plan

    facts = {"framework": "transformers", "config": "SFTConfig", "precision": "bf16", "micro_batch": 1,
             "accumulation": 8, "eval_batch": 1,
             "checkpointing": True, "pad_to_multiple_of": 256, "loader_workers": [0]}
    trials, skipped = plan(facts, "cpu", ["small_micro_batches", "mixed_precision_slower"], 2)
    planned = {t["knob"]: t for t in trials}
    assert planned["micro_batch"]["knobs"] == {"micro_batch": 8, "accumulation": 1}
    assert planned["checkpointing_off"]["knobs"] == {"checkpointing_off": True}
    assert planned["padding"]["knobs"] == {"padding": True}
    assert planned["eval_batch"]["knobs"] == {"eval_batch": 8}
    assert planned["fp32"]["knobs"] == {"fp32": True}
    assert planned["micro_batch"]["change"] == "SFTConfig(per_device_train_batch_size=8, gradient_accumulation_steps=1)"
    assert [t["knob"] for t in trials][:2] == ["micro_batch", "fp32"]  # named by a verdict: first
    reasons = {s["knob"]: s["reason"] for s in skipped}
    assert reasons["bf16"] == "the run already uses bf16 precision"
    unseen = {s["knob"]: s["reason"] for s in plan({"framework": "transformers", "loader_workers": [0]}, "cpu", [],
                                                    2)[1]}
    assert "None" not in unseen["bf16"] and "was not seen" in unseen["bf16"]


def test_the_trial_sets_sftconfigs_knobs_after_its_own_defaults() -> None:
    pytest.importorskip("trl")
    import transformers
    from trl import SFTConfig

    from perfhooks.integrations.trials import Trial, _hf_arguments

    trial = Trial({"name": "t", "knobs": {"fp32": True, "checkpointing_off": True, "micro_batch": 8,
                                          "accumulation": 1, "padding": True}, "stop_after": 3,
                   "folder": "/tmp/perfhooks-trial-test", "result": "/tmp/perfhooks-trial-test/r.json"})
    undo = _hf_arguments(transformers, trial)
    try:
        args = SFTConfig(output_dir="/tmp/perfhooks-trial-test/out", per_device_train_batch_size=1,
                         gradient_accumulation_steps=8, pad_to_multiple_of=256, use_cpu=True)
    finally:
        undo()
    assert trial.facts["precision"] == "bf16" and trial.facts["checkpointing"] is True  # SFTConfig's defaults
    assert trial.facts["config"] == "SFTConfig"
    assert trial.facts["micro_batch"] == 1 and trial.facts["pad_to_multiple_of"] == 256
    assert (args.bf16, args.activation_checkpointing, args.per_device_train_batch_size,
            args.gradient_accumulation_steps, args.pad_to_multiple_of) == (False, False, 8, 1, None)


def test_a_fix_tune_measured_as_a_loss_is_marked_in_the_report_and_in_diff() -> None:
    from perfhooks.offline.diff import _diagnosis_changes
    from perfhooks.offline.tune import format_table, mark_losses, measured_losses

    trials = [{"knob": "threads", "status": "measured", "speedup": 0.15, "interval": [0.12, 0.2],
               "named_by": ["cpu_threads"], "change": "torch.set_num_threads(2)", "keeps_numerics": False,
               "loss_delta": {}},
              {"knob": "fp32", "status": "measured", "speedup": 1.4, "interval": [1.3, 1.5],
               "named_by": ["mixed_precision_slower"], "change": "x", "keeps_numerics": False, "loss_delta": {}}]
    losses = measured_losses(trials)
    assert set(losses) == {"cpu_threads"}
    report = mark_losses({"diagnoses": [{"id": "cpu_threads", "evidence": "e"}, {"id": "shared_host"}]}, losses)
    assert report["diagnoses"][0]["tune"]["loss"] is True and "as a loss: 0.15x" in report["diagnoses"][0]["evidence"]
    assert _diagnosis_changes([], report["diagnoses"])["tune_losses"] == ["cpu_threads"]
    assert "cpu_threads: its fix (threads) measured as a loss" in format_table({"trials": trials})
    untried = format_table({"trials": [], "untried": [{"id": "evaluation_heavy", "estimated_gain": 0.47,
                                                        "gain_basis": "run", "recommendation": "r"}]})
    assert "at most 47% of the run" in untried


def test_padding_is_read_from_every_detailed_step_so_a_loaded_hosts_run_gets_it_too() -> None:
    """On a loaded host the held-out job got no padding_waste at 45% padding: its few detailed steps were the
    warm-up's and perfhooks' own, none steady. Padding is the data's: every detailed step counts."""
    from perfhooks.report.statistics import StepTiming
    from perfhooks.rules.live import _padding_waste

    class Loaded:
        def share(self, name: str) -> float:
            return {"forward": 0.3, "backward": 0.6}.get(name, 0.0)

    timings = [StepTiming(step, 100.0, {"forward": 30.0, "backward": 60.0}, 8, own=step >= 3, samples=8,
                          tokens=1100, padded_tokens=2048) for step in range(8)]  # 46% padding, no steady step
    recipe = {"config": "SFTConfig", "pad_to_multiple_of": 256,
              "spell": {"padding": "SFTConfig(pad_to_multiple_of=None)"}}
    verdict = _padding_waste(timings, Loaded(), __import__("perfhooks").Thresholds(), "transformers", "5.24.0",
                             None, recipe)
    assert verdict is not None and verdict["measured"]["padding_share"] == pytest.approx(1 - 1100 / 2048)
    assert verdict["recommendation"].startswith("SFTConfig(pad_to_multiple_of=None)")
    assert "SFTConfig(pad_to_multiple_of=256) pads every batch up to it" in verdict["evidence"]
    assert verdict["estimated_gain"] == pytest.approx((1 - (1100 / 2048) ** 2) * 0.9, abs=1e-4)
