"""The overhead figures of a lent GPU, in one run (``benchmarks/gpu_check.sh`` calls it).

    python benchmarks/gpu_check.py --out DIR [--rounds 5] [--dry-run]

1. **A launch-bound loop** (4 x Linear(1024), batch 64, fused Adam: a ~2 ms step of small kernels), bare and under
   ``perfhooks.profile`` with its defaults and with each part switched off in turn, alternating round after round.
   Target: at most +50 µs a step.
2. **A host-bound Lightning GPT** (12 layers, d 768, 12 heads, T 512, vocab 32768, batch 16: the 135M shape of the
   2026-11-27 measurements; ``bf16-mixed``), bare and with ``PerfCallback()`` (defaults, then each part off), the
   same alternation. Target: an alternating ratio of at most 1.01.
3. **Device API calls a step**: torch's profiler over 50 steps of the launch-bound loop, bare and with perfhooks
   (run last: a plain ``torch.profiler`` leaves CUPTI attached).

Each figure is the median steady step of the script's own clock (a synchronize at the ends of the measured
span), measured after the default window (steps 8-12) has closed: a window's own steps are not steady steps, and
what a window leaves behind (the trace's analysis on the writer thread, CUPTI if it stayed attached) is in the span.
The variants share one process. That holds only while every window lets CUPTI go when it stops (perfhooks'
``detach_cupti``, on by default): a CUPTI left attached would slow every later variant, bare included. So the
warm-up opens no window, no variant leaves CUPTI attached, and the API-call count (a plain ``torch.profiler``)
runs last. ``gpu_isolate.py`` runs each variant in a fresh process, a window with CUPTI left attached among them.

``--dry-run`` (no GPU, or asked for) runs every part on the CPU at a tiny size, one round, to show the script
works; its figures mean nothing. Rounds stop early, never below one, when ``--budget-s`` would be overrun, and
what was measured is written. Writes ``DIR/gpu_check.json``, after each part.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from machine import describe_machine  # noqa: E402

#: perfhooks' parts, each switched off in turn (the settings that do it).
PARTS: dict[str, dict[str, Any] | None] = {
    "bare": None,
    "defaults": {},
    "no_window": {"schedule": None},
    "no_flop_count": {"count_flops": False},
    "no_window_analysis": {"analyze_windows": False},
    "no_memory": {"memory": False},
    "no_nvtx": {"nvtx": False},
}

#: The measured span starts at this step at the earliest, after the default window (steps 8-12).
FIRST_TIMED_STEP = 20


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- 1. the launch-bound loop
def launch_bound_job(device: str, dry: bool) -> tuple[torch.nn.Module, Any, list[torch.Tensor]]:
    width = 64 if dry else 1024
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device == "cuda")
    batches = [torch.randn(64, width, device=device) for _ in range(4)]
    return model, optimizer, batches


class RawWindow:
    """A bare ``torch.profiler`` window over the default window's recorded steps (10-12), without perfhooks: what
    any profiler window leaves behind for the steps after it (CUPTI attached)."""

    START, STOP = 10, 13

    def __init__(self, device: str) -> None:
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler: Any = None

    def at_step(self, step: int) -> None:
        """Before step ``step`` runs."""
        if step == self.START:
            self.profiler = torch.profiler.profile(activities=self.activities)
            self.profiler.start()
        elif step == self.STOP and self.profiler is not None:
            self.profiler.stop()
            self.profiler = None


def _python_threads_cpu() -> dict[str, float]:
    """CPU time (s) of each Python thread but this one, by name (perfhooks' threads are named ``perfhooks-*``)."""
    times: dict[str, float] = collections.defaultdict(float)
    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.ident is None:
            continue
        try:
            times[thread.name] += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):  # ended meanwhile, or no per-thread clocks here
            continue
    return times


class Span:
    """The timed span's clocks: wall, the training thread's CPU, the whole process's CPU and each other Python
    thread's CPU (s)."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float, float, float, dict[str, float]]] = []

    def mark(self, device: str, step: int) -> None:
        """At step ``step`` (after a synchronize): the span is timed from its first mark to its last."""
        _sync(device)
        self.marks.append((step, time.perf_counter(), time.thread_time(), time.process_time(),
                           _python_threads_cpu()))

    def per_step(self) -> dict[str, Any]:
        """Per timed step (ms): the wall clock, the training thread's CPU, the CPU of every other thread, and of
        each named Python thread among them (threads of C++ alone, autograd's device threads among them, are in
        ``other_cpu_ms`` only)."""
        (step0, wall0, main0, all0, threads0), (step1, wall1, main1, all1, threads1) = self.marks[0], self.marks[-1]
        steps = step1 - step0
        threads = {name: round((cpu - threads0.get(name, 0.0)) / steps * 1e3, 4) for name, cpu in threads1.items()}
        return {"step_ms": (wall1 - wall0) / steps * 1e3, "main_cpu_ms": (main1 - main0) / steps * 1e3,
                "other_cpu_ms": ((all1 - all0) - (main1 - main0)) / steps * 1e3,
                "threads_cpu_ms": {name: ms for name, ms in sorted(threads.items()) if ms > 0}}


def launch_bound_ms(job: Any, settings: dict[str, Any] | None, steps: int, device: str, out: str,
                    raw_window: bool = False, span: Span | None = None) -> float:
    """The loop's mean step (ms) over its timed span; ``raw_window``: a bare profiler window (no perfhooks)."""
    import perfhooks

    model, optimizer, batches = job
    first = max(steps // 5, FIRST_TIMED_STEP) if steps > 2 * FIRST_TIMED_STEP else steps // 5  # short: API calls
    perf = perfhooks.profile(model, optimizer, output_dir=out, console=False, **settings) \
        if settings is not None else None
    window = RawWindow(device) if raw_window else None
    span = span or Span()
    for i in range(steps):
        if window is not None:
            window.at_step(i)
        if perf is not None:
            with perf.data_wait():
                x = batches[i % len(batches)]
        else:
            x = batches[i % len(batches)]
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i in (first, steps - 1):
            span.mark(device, i)
    if perf is not None:
        perf.close()
    return span.per_step()["step_ms"]


# ----------------------------------------------------------------------------- 2. the Lightning GPT
def lightning_gpt_ms(settings: dict[str, Any] | None, steps: int, device: str, dry: bool, out: str,
                     raw_window: bool = False, span: Span | None = None) -> float:
    """The fit's mean step (ms) from ``FIRST_TIMED_STEP`` to its last step, by a synchronized clock;
    ``raw_window``: a bare profiler window (no perfhooks)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from perfhooks.integrations.lightning import PerfCallback

    layers, width, heads, seq, vocab, batch = (2, 64, 4, 32, 256, 4) if dry else (12, 768, 12, 512, 32768, 16)

    class GPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, width)
            self.position = torch.nn.Parameter(torch.zeros(seq, width))
            block = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                     norm_first=True, activation="gelu")
            self.blocks = torch.nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(width, vocab, bias=False)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            tokens, targets = batch
            hidden = self.blocks(self.embed(tokens) + self.position, mask=self.mask, is_causal=True)
            return torch.nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), targets.flatten())

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=3e-4, fused=device == "cuda")

    span = span or Span()
    window = RawWindow(device) if raw_window else None

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if window is not None:
                window.at_step(trainer.global_step)
            if trainer.global_step in (FIRST_TIMED_STEP, steps - 1):
                span.mark(device, trainer.global_step)

    tokens = torch.randint(0, vocab, (steps * batch, seq + 1))
    data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=batch)
    callbacks: list[Any] = [Clock()]
    if settings is not None:
        callbacks.append(PerfCallback(output_dir=out, console=False, **settings))
    trainer = L.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_steps=steps,
                        precision="bf16-mixed" if device == "cuda" else "32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out, callbacks=callbacks)
    trainer.fit(GPT(), data)
    return span.per_step()["step_ms"]


# ----------------------------------------------------------------------------- alternation and API calls
def rotate_rounds(names: list[str], measure: Callable[[str], Any], rounds: int, deadline: float,
                  clock: Callable[[], float] = time.monotonic,
                  after_round: Callable[[dict[str, list[Any]]], None] | None = None) -> dict[str, list[Any]]:
    """``measure(name)`` for every name, round after round, each round starting one name later; each name's
    results. A round that would end past ``deadline`` (s on ``clock``, judged by the mean round so far) is not
    begun; the first always runs. ``after_round`` gets the results so far after each round (to save them)."""
    results: dict[str, list[Any]] = {name: [] for name in names}
    started = clock()
    for round_ in range(rounds):
        now = clock()
        if round_ and now + (now - started) / round_ > deadline:
            break
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            results[name].append(measure(name))
        if after_round is not None:
            after_round(results)
    return results


def alternate(measure: Any, rounds: int, deadline: float, clock: Any = time.monotonic,
              after_round: Any = None) -> dict[str, Any]:
    """Each part's step time (:func:`rotate_rounds` over :data:`PARTS`); ratios to bare. ``after_round`` gets
    the summary so far."""
    times = rotate_rounds(list(PARTS), lambda name: measure(PARTS[name]), rounds, deadline, clock,
                          None if after_round is None else lambda so_far: after_round(_summary(so_far)))
    return _summary(times)


def _summary(times: dict[str, list[float]]) -> dict[str, Any]:
    """Rounds, every step time (ms), the medians, and each median against bare's (µs added, ratio)."""
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"rounds": len(times["bare"]), "step_ms": dict(times), "median_ms": median,
            "added_us_per_step": {name: round((ms - median["bare"]) * 1e3, 1) for name, ms in median.items()},
            "ratio": {name: round(ms / median["bare"], 4) for name, ms in median.items()}}


def api_calls_per_step(job: Any, device: str, out: str, steps: int = 50) -> dict[str, dict[str, float]]:
    """The device runtime's calls a step (torch's profiler), bare and with perfhooks' defaults (no window)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    calls = {}
    for name, settings in (("bare", None), ("perfhooks", {"schedule": None})):
        with torch.profiler.profile(activities=activities) as profiler:
            launch_bound_ms(job, settings, steps, device, out)
        counts = collections.Counter(event.name for event in profiler.events()
                                     if event.name.startswith(("cuda", "cu")) and "LaunchKernel" not in event.name)
        calls[name] = {key: round(count / steps, 2) for key, count in counts.most_common(25)}
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="tiny, on the CPU, one round")
    parser.add_argument("--budget-s", type=float, default=280.0,
                        help="seconds for the whole script; rounds stop early to keep within it (default 280)")
    args = parser.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    device = "cpu" if dry else "cuda"
    rounds = 1 if dry else max(5, args.rounds)
    result: dict[str, Any] = {"machine": describe_machine(), "device": device, "dry_run": dry,
                              "card": torch.cuda.get_device_name(0) if not dry else None, "torch": torch.__version__}
    if dry:
        result["why_dry"] = "no CUDA device" if not torch.cuda.is_available() else "--dry-run"
    started = time.monotonic()
    saved = Path(args.out) / "gpu_check.json"
    saved.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each part: a run stopped by a timeout keeps what it measured
        result["seconds"] = round(time.monotonic() - started, 1)
        saved.write_text(json.dumps(result, indent=1))

    def keep(part: str, so_far: dict[str, Any]) -> None:
        result[part] = so_far
        save()

    with tempfile.TemporaryDirectory() as out:
        job = launch_bound_job(device, dry)
        steps = 60 if dry else 400
        launch_bound_ms(job, None, 20, device, out)  # warm-up: bare, no window
        deadline = started + args.budget_s - 15  # the API calls' count, after
        result["launch_bound"] = alternate(lambda s: launch_bound_ms(job, s, steps, device, out), rounds,
                                           started + 0.3 * args.budget_s,
                                           after_round=lambda so_far: keep("launch_bound", so_far))
        result["launch_bound"]["target"] = "at most +50 us a step (defaults)"
        save()
        gpt_steps = FIRST_TIMED_STEP + (4 if dry else 40)
        result["lightning_gpt"] = alternate(lambda s: lightning_gpt_ms(s, gpt_steps, device, dry, out), rounds,
                                            deadline, after_round=lambda so_far: keep("lightning_gpt", so_far))
        result["lightning_gpt"]["target"] = "alternating ratio at most 1.01 (defaults)"
        save()
        result["api_calls_per_step"] = api_calls_per_step(job, device, out, 10 if dry else 50)  # last: CUPTI
    save()
    for part in ("launch_bound", "lightning_gpt"):
        print(f"{part}: added µs a step {result[part]['added_us_per_step']}; ratio {result[part]['ratio']}")
    print(f"api calls a step: {result['api_calls_per_step']}")
    print(f"{'DRY RUN (' + result['why_dry'] + '): figures mean nothing; ' if dry else ''}"
          f"{args.out}/gpu_check.json, {result['seconds']} s")


if __name__ == "__main__":
    main()
