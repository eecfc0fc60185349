"""The recipe audit's verdicts: knobs copied from a large model's recipe that this run pays for (``report.json``'s
``recipe``, read by :mod:`perfhooks.integrations.recipe`), each priced against what the run measured.

- ``activation_checkpointing``: activations recomputed in backward while the run's peak memory leaves most of the
  capacity free. The recompute runs (part of) the forward again, so it costs at most the forward's share.
- ``small_micro_batches``: micro-batches of a few samples with gradient accumulation: every micro-batch pays the
  fixed cost of a forward and a backward (launches, Python, the framework's own work). Merging ``m`` of them into
  one saves at most ``1 - 1/m`` of forward and backward (all of it fixed cost); the fix keeps the samples a step,
  and merges only as many as the memory measured allows.
- ``evaluation_batch``: an evaluation batch smaller than the samples a training step takes: evaluation keeps no
  activations for a backward, so it fits at least that many. Priced on the evaluation's measured share of the run.
- ``mixed_precision_slower``: a mixed precision that measured slower than fp32 on this device, on the run's own
  matmul shapes (``settings.matmul_speed``), with where the setting came from (TRL's configs turn bf16 on).

None of them needs a trace: they are in the report, the live file and W&B from the first publication. A knob
absent from the recipe is not judged.
"""

from __future__ import annotations

import math
from typing import Any

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis, make, pct

#: The memory a merged micro-batch may fill (fraction 0..1 of capacity), counting all of today's peak as growing
#: with the micro-batch (weights and optimizer state do not: the estimate errs towards fewer merged).
MERGE_MEMORY_SHARE = 0.8


def micro_batch_samples(recipe: dict[str, Any], stats: Any) -> int | None:
    """Samples a micro-batch: the recipe's setting, else what the engine counted (the detailed steps' samples over
    their micro-batches)."""
    size = recipe.get("micro_batch")
    if isinstance(size, int) and size > 0:
        return size
    timings = [timing for timing in getattr(stats, "recent", ()) if timing.samples and timing.micro_batches]
    micro = sum(timing.micro_batches for timing in timings)
    return round(sum(timing.samples for timing in timings) / micro) if micro else None


def accumulation(recipe: dict[str, Any], stats: Any) -> int:
    """Micro-batches a step: the recipe's setting, else the engine's count (the detailed steps' median)."""
    steps = recipe.get("accumulation")
    if isinstance(steps, int) and steps > 0:
        return steps
    counts = sorted(timing.micro_batches for timing in getattr(stats, "recent", ()) if timing.micro_batches)
    return counts[len(counts) // 2] if counts else 1


def memory_fraction(memory: Any) -> tuple[float | None, int, int | None]:
    """``(peak used over capacity, peak bytes, capacity bytes)`` from the memory figures; the fraction None when
    either is unknown."""
    if memory is None:
        return None, 0, None
    peak = int((memory.peak or {}).get("used_bytes") or 0)
    capacity = memory.capacity_bytes
    return (peak / capacity if capacity and peak else None), peak, capacity


def _forward_backward(stats: Any) -> tuple[float, float]:
    if not getattr(stats, "sampled_steps", 0):
        return 0.0, 0.0
    return stats.steady_share("forward"), stats.steady_share("backward")


def _spell(recipe: dict[str, Any], knob: str, **values: Any) -> str | None:
    text = (recipe.get("spell") or {}).get(knob)
    if not text:
        return None
    try:
        return text.format(**{**recipe, **values})
    except (KeyError, IndexError, ValueError):
        return text


def diagnose_recipe(recipe: dict[str, Any] | None, stats: Any, memory: Any = None, run: dict[str, Any] | None = None,
                    settings: dict[str, Any] | None = None, t: Thresholds = Thresholds()) -> list[Diagnosis]:
    """Every knob of ``recipe`` that slows this run, as verdicts. ``memory``: the memory verdicts' figures (peak
    and capacity); ``run``: the report's run account; ``settings``: the settings audit (the measured matmul
    speed)."""
    if not recipe:
        return []
    return [verdict for verdict in (
        _checkpointing(recipe, stats, memory, t),
        _micro_batches(recipe, stats, memory, t),
        _evaluation_batch(recipe, stats, run, t),
        _precision_slower(recipe, stats, settings),
    ) if verdict is not None]


def _checkpointing(recipe: dict[str, Any], stats: Any, memory: Any, t: Thresholds) -> Diagnosis | None:
    if not recipe.get("checkpointing"):
        return None
    fraction, peak, capacity = memory_fraction(memory)
    if fraction is None or fraction > t.checkpointing_memory_share:
        return None  # the memory it saves may be needed: silence
    forward, _ = _forward_backward(stats)
    source = recipe.get("checkpointing_source") or "activation checkpointing"
    return make(
        "activation_checkpointing", "warning", "Activation checkpointing is on with most of the memory free",
        f"{source}: backward runs the checkpointed forward again to rebuild the activations it did not keep, while "
        f"the run's peak memory is {peak / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB ({pct(fraction)}; threshold "
        f"{pct(t.checkpointing_memory_share)}); the recompute is at most one more forward, which takes "
        f"{pct(forward)} of the step (the most switching it off saves; the activations it frees come back)",
        forward, f"{_spell(recipe, 'checkpointing_off') or 'Switch activation checkpointing off'}: checkpointing "
        "trades time for memory this run does not need; watch the peak memory after it (perfhooks tune --only "
        "checkpointing_off measures both).",
        peak_memory_share=round(fraction, 4), forward_share=round(forward, 4), ceiling="forward share",
        source=source)


def merge_factor(accumulated: int, fraction: float | None) -> int:
    """How many micro-batches to merge into one: the largest divisor of ``accumulated`` whose merged peak (today's
    peak times it, an over-estimate) stays within :data:`MERGE_MEMORY_SHARE` of capacity; 1 when the
    memory is unknown, where nothing says a merge fits."""
    if fraction is None or fraction <= 0:
        return 1
    room = max(1, math.floor(MERGE_MEMORY_SHARE / fraction))
    return max(m for m in range(1, accumulated + 1) if accumulated % m == 0 and m <= room)


def _micro_batches(recipe: dict[str, Any], stats: Any, memory: Any, t: Thresholds) -> Diagnosis | None:
    steps = accumulation(recipe, stats)
    size = micro_batch_samples(recipe, stats)
    if steps < 2 or size is None or size > t.small_micro_batch:
        return None
    fraction, peak, capacity = memory_fraction(memory)
    merged = merge_factor(steps, fraction)
    if merged < 2:
        return None  # no room measured to merge: silence
    forward, backward = _forward_backward(stats)
    compute = forward + backward
    gain = compute * (1 - 1 / merged)
    micro, left = size * merged, steps // merged
    fix = _spell(recipe, "micro_batch", micro_batch=micro, accumulation=left) or \
        f"micro-batches of {micro} samples with {left} accumulation step(s)"
    memory_said = (f"; peak memory {peak / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB ({pct(fraction)}): "
                   f"{merged} times it still fits within {pct(MERGE_MEMORY_SHARE)}" if fraction is not None else "")
    return make(
        "small_micro_batches", "warning", "Small micro-batches with gradient accumulation",
        f"each step runs {steps} micro-batches of {size} sample(s) ({steps * size} a step): every micro-batch pays "
        f"a forward's and a backward's fixed cost (launches, Python, the framework's work), and forward and "
        f"backward take {pct(compute)} of the step; merging {merged} micro-batches into one saves at most "
        f"{pct(1 - 1 / merged)} of them, {pct(gain)} of the step (the ceiling, if all of a micro-batch's time "
        f"were fixed cost){memory_said}; threshold {t.small_micro_batch:g} samples",
        gain, f"{fix}: the same {steps * size} samples a step, in {left} micro-batch(es); the loss and the "
        "optimizer's steps are the same up to rounding (perfhooks tune --only micro_batch measures it).",
        micro_batch=size, accumulation=steps, merge=merged, compute_share=round(compute, 4),
        peak_memory_share=round(fraction, 4) if fraction is not None else None,
        ceiling="forward and backward x (1 - 1/merged)")


def evaluation_batch_fix(recipe: dict[str, Any] | None, stats: Any) -> tuple[int, int] | None:
    """``(evaluation batch, samples a training step)`` where the recipe's evaluation batch is the smaller, else
    None."""
    if not recipe:
        return None
    evaluation = recipe.get("eval_batch")
    size = micro_batch_samples(recipe, stats)
    if not isinstance(evaluation, int) or evaluation <= 0 or size is None:
        return None
    step = size * accumulation(recipe, stats)
    return (evaluation, step) if evaluation < step else None


def _evaluation_batch(recipe: dict[str, Any], stats: Any, run: dict[str, Any] | None, t: Thresholds
                      ) -> Diagnosis | None:
    sizes = evaluation_batch_fix(recipe, stats)
    if sizes is None:
        return None
    evaluation, step = sizes
    wall = (run or {}).get("wall_s") or 0.0
    share = ((run or {}).get("evaluation_s") or 0.0) / wall if wall else 0.0
    if share >= t.evaluation_share:
        return None  # evaluation_heavy fires, and names the batch
    evaluations = int((run or {}).get("evaluations") or 0)
    gain = share * (1 - evaluation / step)
    measured = (f"{evaluations} evaluation(s) took {pct(share)} of the run's wall time; at most "
                f"{pct(1 - evaluation / step)} of that is saved (if all of a batch's time were fixed cost)"
                if evaluations else "no evaluation has run yet: its share of the run is priced once one has")
    verdict = make(
        "evaluation_batch", "warning" if share >= 0.05 else "info", "The evaluation batch is smaller than training's",
        f"evaluation runs batches of {evaluation} sample(s) where a training step takes {step}: evaluation keeps no "
        f"activations for a backward, so it fits at least as many per batch, and each batch pays a forward's fixed "
        f"cost; {measured}",
        gain, f"{_spell(recipe, 'eval_batch', eval_batch=step) or f'an evaluation batch of {step}'}.",
        eval_batch=evaluation, step_samples=step, evaluation_share=round(share, 4), ceiling="evaluation share")
    verdict["gain_basis"] = "run"
    return verdict


def matmul_difference(settings: dict[str, Any] | None, stats: Any, micro_batches: int
                      ) -> tuple[float, str] | None:
    """``(share, evidence)`` from the matmul probe: fp32 less bf16 on the run's own shapes, a micro-batch's, times
    the step's ``micro_batches``, over the steady step (positive: bf16 is faster; an estimate of the matmuls' part
    alone). None without a measurement or a steady step."""
    speed = (settings or {}).get("matmul_speed") or {}
    fp32, bf16 = speed.get("fp32_ms"), speed.get("bf16_ms")
    steady = getattr(stats, "steady_step", None)
    step_ms = steady.quantile(0.5) if steady is not None and steady.count else 0.0
    if not fp32 or not bf16 or step_ms <= 0:
        return None
    share = (fp32 - bf16) * micro_batches / step_ms
    said = (f"the run's own matmul shapes ({speed.get('shapes_said')}), timed on this device as a training step runs "
            f"them, took {fp32:.2f} ms in fp32 and {bf16:.2f} ms in bf16 with its casts a micro-batch "
            f"({fp32 / bf16:.2f}x), "
            f"{abs(fp32 - bf16) * micro_batches:.1f} ms {'less' if share > 0 else 'more'} in bf16 over the step's "
            f"{micro_batches} micro-batch(es) of a {step_ms:.1f} ms step")
    return share, said


def _precision_slower(recipe: dict[str, Any], stats: Any, settings: dict[str, Any] | None) -> Diagnosis | None:
    """``mixed_precision_slower``: the run's bf16 measured slower than fp32 on this device."""
    precision = recipe.get("precision")
    if precision != "bf16":
        return None
    measured = matmul_difference(settings, stats, accumulation(recipe, stats))
    if measured is None or -measured[0] < PRECISION_NOISE:
        return None
    forward, backward = _forward_backward(stats)
    gain = min(-measured[0], forward + backward)
    source = recipe.get("precision_source") or precision
    return make(
        "mixed_precision_slower", "warning", "bf16 is slower than fp32 here",
        f"the run trains in bf16 ({source}); {measured[1]}: fp32 saves about {pct(gain)} of the step on the "
        f"matmuls alone (an estimate: autocast's other casts add to it), within forward and backward's "
        f"{pct(forward + backward)}",
        gain, f"{_spell(recipe, 'precision_off') or 'Train in fp32'}; measure it (perfhooks tune --only fp32).",
        precision=precision, source=source, matmul_share=round(measured[0], 4))


#: A measured difference under this share of the step is no difference (the probe's noise).
PRECISION_NOISE = 0.02


def bf16_gain(settings: dict[str, Any] | None, stats: Any, share: float) -> tuple[float, str] | None:
    """``(gain, evidence)`` for ``fp32_matmul`` from the matmul probe (at most ``share``, forward and backward's);
    the gain 0 where bf16 measured no faster. None without a measurement."""
    measured = matmul_difference(settings, stats, accumulation({}, stats))  # the engine's count: no recipe here
    if measured is None:
        return None
    if measured[0] < PRECISION_NOISE:
        return 0.0, measured[1]
    return min(share, measured[0]), measured[1]
