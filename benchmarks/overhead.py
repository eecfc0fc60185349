"""Overhead on the training loop: step time of each profiler variant, interleaved, as ratios; and what
perfhooks costs beside the step: the published state and the live watch, a short run's close, the share of a fast
run's steps that overlap its own work, and the peak RSS it adds (each a section of ``benchmarks/suite.py``).

    python benchmarks/overhead.py [--quick] [--rounds N]      # or all benchmarks: benchmarks/suite.py

Every comparison runs its variants in turn, round after round (A/B/C, B/C/A, C/A/B...: each round
starts one variant later), after a warm-up run, and reports per-round ratios to the baseline as
the median and min-max of the rounds. A run's step time is the median of its steps' wall times
(batch end to batch end), the first two steps and the last one left out (warm-up; the trace
export at a window's end).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import describe_machine, paired, rotate_rounds, steady_step  # noqa: E402

#: The settings of a perfhooks window, used for the bare torch.profiler and ProfileKwargs too.
WINDOW_SETTINGS = {"record_shapes": True, "profile_memory": True, "with_stack": False}


def _steady_ms(ends: list[float]) -> float:
    """The run's steady step in ms (``ends`` in s): the first two steps and the last one left out."""
    return steady_step(ends, skip_first=2, skip_last=1) * 1e3


def _activities() -> list[Any]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def _window_schedule(steps: int) -> Any:
    import perfhooks

    return perfhooks.Schedule(skip_first=0, warmup=1, active=steps)


# --------------------------------------------------------------------------- Lightning
LIGHTNING_VARIANTS = ("none", "perfhooks", "perfhooks_window", "bare_torch_profiler", "SimpleProfiler",
                      "PyTorchProfiler")


def lightning_step_ms(variant: str, steps: int, d_model: int, out: str) -> float:
    """Median step time (ms) of a Lightning fit of the tutorial layer under ``variant``."""
    import lightning as L
    from lightning.pytorch.profilers import PyTorchProfiler, SimpleProfiler

    from perfhooks.integrations.lightning import PerfCallback
    from tutorial_transformer import lightning_module, make_dataloader

    ends: list[float] = []

    class StepTimer(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            ends.append(time.perf_counter())

    class BareProfiler(L.Callback):
        """torch.profiler with a perfhooks window's settings, stepped at each batch end."""

        def on_train_start(self, *args: Any) -> None:
            self.profiler = torch.profiler.profile(
                activities=_activities(), schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps),
                on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/bare.json"), **WINDOW_SETTINGS)
            self.profiler.start()

        def on_train_batch_end(self, *args: Any) -> None:
            self.profiler.step()

        def on_train_end(self, *args: Any) -> None:
            self.profiler.stop()

    callbacks: list[Any] = []
    profiler: Any = None
    if variant == "perfhooks":
        callbacks.append(PerfCallback(output_dir=out, schedule=None, console=False))
    elif variant.startswith("perfhooks_history_"):  # memory_history from_start / on_approach / off (CUDA)
        mode = {"from_start": True, "on_approach": None, "off": False}[variant.removeprefix("perfhooks_history_")]
        callbacks.append(PerfCallback(output_dir=out, schedule=None, console=False, memory_history=mode))
    elif variant == "perfhooks_window":
        callbacks.append(PerfCallback(output_dir=out, schedule=_window_schedule(steps), console=False,
                                      **WINDOW_SETTINGS))
    elif variant == "bare_torch_profiler":
        callbacks.append(BareProfiler())
    elif variant == "SimpleProfiler":
        profiler = SimpleProfiler(dirpath=out, filename="simple")
    elif variant == "PyTorchProfiler":
        profiler = PyTorchProfiler(dirpath=out, filename="pytorch")
    callbacks.append(StepTimer())
    torch.manual_seed(0)
    trainer = L.Trainer(max_steps=steps, accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, callbacks=callbacks,
                        profiler=profiler)
    with contextlib.redirect_stdout(None):
        trainer.fit(lightning_module(d_model, max(1, d_model // 64)), make_dataloader(steps, 16, 128, d_model))
    return _steady_ms(ends)


# --------------------------------------------------------------------------- transformers
HF_VARIANTS = ("none", "perfhooks")


def hf_step_ms(variant: str, steps: int, out: str) -> float:
    """Median step time (ms) of the HF Trainer example (tiny GPT-2) under ``variant``."""
    from transformers import TrainerCallback

    from hf_trainer_example import build_trainer
    from perfhooks.integrations.transformers import PerfTrainerCallback

    ends: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    callback = PerfTrainerCallback(schedule=None, console=False) if variant == "perfhooks" else StepTimer()
    trainer = build_trainer(out, steps, callback=callback, logging_steps=10_000)
    if variant == "perfhooks":
        trainer.add_callback(StepTimer())
    trainer.train()
    return _steady_ms(ends)


# --------------------------------------------------------------------------- accelerate
ACCELERATE_VARIANTS = ("none", "perfhooks", "perfhooks_window", "ProfileKwargs")


def accelerate_step_ms(variant: str, steps: int, d_model: int, out: str) -> float:
    """Median step time (ms) of the accelerate example loop under ``variant``."""
    from accelerate import Accelerator
    from accelerate.utils import ProfileKwargs

    from perfhooks.integrations.accelerate import attach
    from tutorial_transformer import TransformerLayer, make_dataloader

    torch.manual_seed(0)
    handlers = []
    if variant == "ProfileKwargs":
        handlers.append(ProfileKwargs(activities=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"],
                                      schedule_option={"wait": 0, "warmup": 1, "active": steps},
                                      on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/pk.json"),
                                      **WINDOW_SETTINGS))
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=handlers)
    model = TransformerLayer(d_model, max(1, d_model // 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, data = accelerator.prepare(model, optimizer, make_dataloader(steps, 16, 128, d_model))
    ends: list[float] = []

    @contextlib.contextmanager
    def wrapped() -> Iterator[Callable[[], None]]:
        if variant == "ProfileKwargs":
            with accelerator.profile() as profiler:
                yield profiler.step
        elif variant.startswith("perfhooks"):
            schedule = _window_schedule(steps) if variant == "perfhooks_window" else None
            with attach(accelerator, model, optimizer, data, output_dir=out, schedule=schedule, console=False,
                        **WINDOW_SETTINGS):
                yield lambda: None
        else:
            yield lambda: None

    with wrapped() as step:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step()
            ends.append(time.perf_counter())
    return _steady_ms(ends)


# --------------------------------------------------------------------------- comparisons
def interleaved(measure: Callable[[str, str], float], variants: tuple[str, ...], rounds: int,
                label: str) -> dict[str, Any]:
    """Every variant once a round (:func:`common.rotate_rounds`), after a warm-up; each round's step times."""
    with tempfile.TemporaryDirectory() as out:
        measure(variants[0], out)  # warm-up: imports, allocator, thread pools

    def one_run(variant: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            return measure(variant, out)

    def said(so_far: dict[str, list[float]]) -> None:
        print(f"  {label} round {len(so_far[variants[0]])}: "
              + "  ".join(f"{v} {times[-1]:.2f} ms" for v, times in so_far.items()), flush=True)

    times = rotate_rounds(variants, one_run, rounds, after_round=said)
    per_round = [{variant: times[variant][index] for variant in variants} for index in range(rounds)]
    return {"rounds": per_round, "step_ms": {v: statistics.median(times[v]) for v in variants}}


def ratio(result: dict[str, Any], numerator: str, denominator: str) -> dict[str, float]:
    """Per-round ``numerator / denominator`` step time: median, min, max."""
    values = [r[numerator] / r[denominator] for r in result["rounds"]]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def alternating_steps(steps: int, d_model: int) -> dict[str, Any]:
    """The telemetry's cost measured inside one process: the tutorial layer's training loop, with the
    engine's events sent on every other step only. Adjacent steps share the process, its thread
    pools, allocator and caches, which process-level A/B runs do not; the ratio of each on-step to
    the off-step before it, as median and min-max, is the overhead with everything but windows on
    (phase timing, NVTX, memory sampling)."""
    from perfhooks import Engine, PerfConfig
    from tutorial_transformer import TransformerLayer, make_dataloader

    torch.manual_seed(0)
    model = TransformerLayer(d_model, max(1, d_model // 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter(make_dataloader(steps + 1, 16, 128, d_model))
    on_ms: list[float] = []
    off_ms: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False), out, "benchmark")
        engine.watch_model(model)
        for index in range(steps):
            on = index % 2 == 1
            start = time.perf_counter()
            if on:
                engine.fetch()
            x, y = next(batches)
            if on:
                engine.phase_start("forward")
            loss = torch.nn.functional.mse_loss(model(x), y)
            if on:
                engine.phase_start("backward")
            loss.backward()
            if on:
                engine.phase_start("optimizer")
            optimizer.step()
            optimizer.zero_grad()
            if on:
                engine.phase_end("optimizer")
                engine.stepped()
                engine.step_end()  # an integration ends it at the next fetch; the off-step must not hold it
            (on_ms if on else off_ms).append((time.perf_counter() - start) * 1e3)
        engine.close()
    pairs = [on / off for on, off in zip(on_ms[2:], off_ms[2:], strict=False)]  # the first steps warm up
    return {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs), "n": len(pairs),
            "pooled": statistics.median(on_ms[2:]) / statistics.median(off_ms[2:]),
            "step_ms": statistics.median(off_ms[2:])}


def run_alternating(quick: bool) -> dict[str, Any]:
    d_model, steps = (256, 60) if quick else (512, 200)
    print(f"alternating steps in one process, tutorial layer d_model {d_model}, {steps} steps", flush=True)
    return {"d_model": d_model, "steps": steps, **alternating_steps(steps, d_model)}


def host_cost_us(steps: int = 20_000, repeats: int = 5) -> float:
    """µs per step for the engine's events alone (the 7 a Lightning step sends, the step ending at the
    next fetch; no training work)."""
    from perfhooks import Engine, PerfConfig

    results = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeats):
            engine = Engine(PerfConfig(schedule=None, console=False), out, "benchmark")
            start = time.perf_counter_ns()
            for index in range(steps):
                engine.fetch()
                engine.phase_start("forward")
                engine.phase_start("backward")
                engine.phase_end("backward")
                engine.phase_start("optimizer")
                engine.phase_end("optimizer")
                engine.stepped(index + 1)
            results.append((time.perf_counter_ns() - start) / steps / 1e3)
            engine.close()
    return statistics.median(results)


# --------------------------------------------------------------------------- the published state and the watch
PUBLISH_TARGET_US = 5.0
LOOK_TARGET_SHARE = 0.005


def publish_cost() -> dict[str, float]:
    """What the published state and the live watch cost the training thread. The training thread publishes one
    RunState a step (``Engine.publish``); the watch thread, once a second, reads it, follows stalls and (every 2 s)
    writes the live file, holding the GIL while it does. Both are timed on an engine with 5,000 steps of
    statistics on a manual clock (no sleeping), so that the figures do not drown in the noise of whole steps.
    Targets: a publication under 5 µs; a look under 0.5% of a core."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import ManualClock
    from perfhooks import Engine, PerfConfig

    clock = ManualClock()
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False, on_demand=False, wandb=False), out, "benchmark",
                        clock=clock)
        for n in range(5000):
            for phase, ms in (("data_wait", 1), ("forward", 2 + n % 5), ("backward", 3), ("optimizer", 1)):
                engine.phase_start(phase)
                clock.advance(ms)
            engine.stepped()
            engine.step_end()
        started = time.perf_counter()
        for _ in range(20_000):
            engine.publish()
        publish_us = (time.perf_counter() - started) / 20_000 * 1e6
        engine.watch.close()  # looked at by hand below
        looks = []
        for _ in range(50):
            engine.watch._next_live = 0.0  # every look writes the live file (the thread does so every other look)
            started = time.perf_counter()
            engine.watch.tick()
            looks.append(time.perf_counter() - started)
        engine.close()
    look_ms = statistics.median(looks) * 1e3
    print(f"  publish: {publish_us:.2f} µs a step; a watch look with the live file: {look_ms:.2f} ms once a second, "
          f"{look_ms / 10:.3f}% of a core")
    return {"publish_us": publish_us, "look_ms": look_ms, "look_share_of_core": look_ms / 1e3}


# --------------------------------------------------------------------------- short runs
CLOSE_TARGET_S = 0.15
OVERLAP_TARGET = 0.10


def boring_fit_s(with_perfhooks: bool, root: Path) -> float:
    """Wall time (s) of ``trainer.fit`` on Lightning's BoringModel for 20 steps, defaults on (one window)."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from perfhooks.integrations.lightning import PerfCallback

    callbacks = [PerfCallback(console=False)] if with_perfhooks else []
    trainer = L.Trainer(max_steps=20, accelerator="cpu", devices=1, default_root_dir=str(root), callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=2)
    model = BoringModel()
    start = time.perf_counter()
    trainer.fit(model)
    return time.perf_counter() - start


def close_cost(rounds: int) -> dict[str, float]:
    """What ``PerfCallback()`` with its default schedule adds to a 20-step fit of Lightning's BoringModel (its
    defaults on), window and close included: the median over rounds of the same round's difference. Target: under
    0.15 s."""
    with tempfile.TemporaryDirectory() as folder:
        boring_fit_s(False, Path(folder) / "warm")  # imports, first calls
        boring_fit_s(True, Path(folder) / "warm_perf")
        runs = itertools.count()
        fits = rotate_rounds(("plain", "perfhooks"), lambda name: boring_fit_s(
            name == "perfhooks", Path(folder) / f"{next(runs)}_{name}"), rounds)
    added = paired(fits["perfhooks"], fits["plain"])
    result = {"plain_s": statistics.median(fits["plain"]), "perfhooks_s": statistics.median(fits["perfhooks"]),
              "added_s": statistics.median(added), "added_max_s": max(added)}
    print(f"  close cost: BoringModel 20 steps, fit {result['plain_s']:.3f} s plain, {result['perfhooks_s']:.3f} s "
          f"with PerfCallback() (median of {rounds}); added {result['added_s']:.3f} s "
          f"(max {result['added_max_s']:.3f})")
    return result


def overlap_share(steps: int = 200, step_ms: float = 15.0) -> dict[str, float]:
    """The share of a fast run's steps that overlapped perfhooks' own work (a window, its export, its analysis),
    from the report: the default schedule over a plain loop of ``steps`` steps of about ``step_ms``. Target: at
    most 10%."""
    import perfhooks

    torch.manual_seed(0)
    width = 192
    model = torch.nn.Sequential(torch.nn.Linear(width, width * 4), torch.nn.ReLU(), torch.nn.Linear(width * 4, width))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(256, width)

    def train_step(repeats: int) -> None:
        loss = sum(model(batch).square().mean() for _ in range(repeats))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    repeats = 1
    for _ in range(3):  # size the step to about step_ms on this machine (warm-up included)
        start = time.perf_counter()
        for _ in range(5):
            train_step(repeats)
        took_ms = (time.perf_counter() - start) / 5 * 1e3
        repeats = max(1, round(repeats * step_ms / took_ms))
    with tempfile.TemporaryDirectory() as folder:
        engine = perfhooks.Engine(perfhooks.PerfConfig(console=False), folder, framework="plain")
        for _ in range(steps):
            engine.phase_start("data_wait")
            engine.phase_start("forward")
            loss = sum(model(batch).square().mean() for _ in range(repeats))
            engine.phase_start("backward")
            loss.backward()
            engine.phase_start("optimizer")
            optimizer.step()
            optimizer.zero_grad()
            engine.stepped()
            engine.step_end()
        report = engine.close()
    assert report is not None
    own = report["steady"]["perfhooks_steps"]
    result = {"steps": report["steps"], "own_steps": own, "share": own / report["steps"],
              "step_ms": report["step_ms"]["p50"], "windows": len(report["windows"])}
    print(f"  overlap: {result['steps']} steps of {result['step_ms']:.1f} ms (p50), {result['windows']} window(s); "
          f"{own} overlapped perfhooks' own work = {result['share']:.1%}")
    return result


# --------------------------------------------------------------------------- peak RSS
RSS_TARGET_MB = 60.0

#: A 40-step fit of Lightning's demo Transformer (vocab 33,278, Lightning's defaults: the CSV logger, checkpoints,
#: the progress bar) on random tokens of WikiText2's shapes (35 per row, batch 20; no download), in a fresh
#: process; prints its peak RSS (``VmHWM``) at its end. ``argv``: the variant, and PerfCallback's settings.
RSS_CHILD = r"""
import json, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
import lightning.pytorch as pl
from lightning.pytorch.demos.transformer import LightningTransformer
from torch.utils.data import DataLoader, TensorDataset

class Model(LightningTransformer):
    def prepare_data(self):  # the demo downloads WikiText2 here: random tokens of its shapes instead
        pass

variant = sys.argv[1]
torch.manual_seed(0)
tokens = torch.randint(0, 33278, (40 * 20, 36))
data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=20)
callbacks = []
if variant != "plain":
    from perfhooks.integrations.lightning import PerfCallback
    settings = {"wandb": False, "console": False}
    settings.update(json.loads(sys.argv[2]))
    callbacks.append(PerfCallback(**settings))
with tempfile.TemporaryDirectory() as root:
    trainer = pl.Trainer(max_steps=40, accelerator="cpu", devices=1, default_root_dir=root, callbacks=callbacks,
                         enable_model_summary=False, enable_progress_bar=True)
    trainer.fit(Model(), data)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print("PEAK", int(line.split()[1]) * 1024)
"""

#: The RSS variants: PerfCallback's settings, each switching a part off to show where the memory goes.
RSS_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_window": {"schedule": None},
    "no_window_analysis": {"analyze_windows": False},
    "no_flop_count": {"count_flops": False},
    "no_record_shapes": {"record_shapes": False},
    "no_memory": {"memory": False},
}


def _peak_rss(variant: str, settings: dict[str, Any]) -> int:
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", RSS_CHILD, variant, json.dumps(settings)], capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK")]
    if done.returncode or not lines:
        raise SystemExit(f"{variant}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return int(lines[-1].split()[1])


def peak_rss_added(rounds: int, variants: list[str]) -> dict[str, Any]:
    """Peak RSS that ``PerfCallback()`` adds to the demo Transformer's fit (:data:`RSS_CHILD`), each fit in a fresh
    process, plain and each variant (:data:`RSS_VARIANTS`) in rotating rounds; the median over rounds of each
    variant less the same round's plain fit. Target: at most 60 MB with the defaults (a window included)."""
    peaks = rotate_rounds(["plain", *variants], lambda name: _peak_rss(name, RSS_VARIANTS.get(name, {})), rounds)
    result: dict[str, Any] = {"plain_mib": statistics.median(peaks["plain"]) / 2**20, "added_mib": {}}
    print(f"  plain peak RSS: median {result['plain_mib']:.0f} MiB over {rounds} fits")
    for name in variants:
        added = [value / 2**20 for value in paired(peaks[name], peaks["plain"])]
        result["added_mib"][name] = statistics.median(added)
        print(f"  {name:<22} adds median {statistics.median(added):6.1f} MiB (each: "
              f"{', '.join(f'{value:.0f}' for value in added)})")
    return result


def run(quick: bool, rounds: int) -> dict[str, Any]:
    d_model = 256 if quick else 512
    steps = 10 if quick else 20
    results: dict[str, Any] = {"settings": {"d_model": d_model, "steps": steps, "rounds": rounds,
                                            "batch": "16 x 128"}}
    print(f"Lightning, tutorial layer d_model {d_model}, {steps} steps per run, {rounds} rounds", flush=True)
    lightning = interleaved(lambda v, out: lightning_step_ms(v, steps, d_model, out), LIGHTNING_VARIANTS,
                            rounds, "lightning")
    lightning["ratios"] = {v: ratio(lightning, v, "none") for v in LIGHTNING_VARIANTS[1:]}
    lightning["ratios"]["perfhooks_window/bare_torch_profiler"] = ratio(lightning, "perfhooks_window",
                                                                        "bare_torch_profiler")
    results["lightning"] = lightning
    print(f"accelerate, tutorial layer d_model {d_model}, {steps} steps per run", flush=True)
    accel = interleaved(lambda v, out: accelerate_step_ms(v, steps, d_model, out), ACCELERATE_VARIANTS, rounds,
                        "accelerate")
    accel["ratios"] = {v: ratio(accel, v, "none") for v in ACCELERATE_VARIANTS[1:]}
    accel["ratios"]["perfhooks_window/ProfileKwargs"] = ratio(accel, "perfhooks_window", "ProfileKwargs")
    results["accelerate"] = accel
    hf_steps = 20 if quick else 40
    print(f"transformers Trainer, tiny GPT-2, {hf_steps} steps per run", flush=True)
    hf = interleaved(lambda v, out: hf_step_ms(v, hf_steps, out), HF_VARIANTS, rounds, "transformers")
    hf["ratios"] = {"perfhooks": ratio(hf, "perfhooks", "none")}
    results["transformers"] = hf
    results["host_cost_us"] = host_cost_us(steps=5_000 if quick else 20_000)
    results["alternating"] = run_alternating(quick)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="d_model 256 and fewer steps")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (at least 5)")
    parser.add_argument("--lightning", nargs="+", choices=LIGHTNING_VARIANTS, metavar="VARIANT",
                        help=f"only these Lightning variants, ratios to the first ({', '.join(LIGHTNING_VARIANTS)})")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    print(f"machine: {describe_machine()}")
    if args.lightning:
        d_model, steps = (256, 10) if args.quick else (512, 20)
        variants = tuple(args.lightning)
        result = interleaved(lambda v, out: lightning_step_ms(v, steps, d_model, out), variants, args.rounds,
                             "lightning")
        for variant in variants[1:]:
            r = ratio(result, variant, variants[0])
            print(f"lightning {variant} / {variants[0]}: median {r['median']:.4f} (min {r['min']:.4f}, "
                  f"max {r['max']:.4f}) over {r['n']} rounds")
        return 0
    results = run(args.quick, args.rounds)
    for framework in ("lightning", "accelerate", "transformers"):
        for name, r in results[framework]["ratios"].items():
            print(f"{framework:>12} {name:<40} median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f})")
    print(f"engine host cost per step: {results['host_cost_us']:.2f} µs")
    a = results["alternating"]
    print(f"telemetry on/off, alternating steps in one process: median {a['median']:.4f} (min {a['min']:.4f}, "
          f"max {a['max']:.4f}) over {a['n']} pairs; pooled {a['pooled']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
