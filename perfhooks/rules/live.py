"""Rules on the live phase statistics: data wait, optimizer share, step-time variance, warm-up."""

from __future__ import annotations

import statistics
from typing import Any

from perfhooks.events import EVALUATION_FORWARDS, RANK_WAITS
from perfhooks.rules.run import diagnose_run
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import TITLES, make, pct


def diagnose_live(stats: Any, t: Thresholds = Thresholds(), min_steps: int = 10, compiled: bool = False,
                  run: dict[str, Any] | None = None, named_work: dict[str, float] | None = None,
                  framework: str | None = None, accelerator: bool = True,
                  cpus: int | None = None, framework_version: str | None = None,
                  length_grouped: str | None = None, host_share: float | None = None,
                  recipe: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Rules that need no trace: they read the engine's per-phase statistics on every run.

    Steps that perfhooks' own work overlapped (a capture window, a trace export, a window's
    analysis, a memory capture) are left out of the phase and variance rules. ``compiled`` says
    torch.compile compiled a graph during the run; ``run`` is the report's run account; ``accelerator``: the run
    trains on a GPU or another accelerator (pinned memory helps only there); ``cpus``: the CPUs the process may
    use (the loader's workers share them with training); ``framework_version``: the framework's installed version
    (a fix is spelled as it takes it); ``host_share``: other processes' share of this process's CPUs when the
    settings audit found the host shared (step-time variance is then the host's, not the program's); ``recipe``:
    the recipe audit's facts (a fix names the setting in use: the evaluation batch, ``pad_to_multiple_of``).
    """
    out = diagnose_run(run, t, recipe, stats)
    if stats.steps < min_steps:
        return out
    wait = stats.steady_share("data_wait")
    if wait >= t.dataloader_share and _share_without_the_longest(stats.recent, "data_wait") >= t.dataloader_share:
        out.append(make(
            "dataloader_bound", "critical" if wait >= t.dataloader_critical_share else "warning",
            TITLES["dataloader_bound"],
            f"waiting for the next batch holds {pct(wait)} of step time (mean {stats.steady_mean('data_wait'):.2f} ms "
            f"a step; the fetches took {stats.fetch.mean:.2f} ms a step on the host, of which a GPU sees only "
            f"what no queued work hides); threshold {pct(t.dataloader_share)}",
            wait, loader_fix(framework, accelerator, cpus), data_wait_share=wait, usable_cpus=cpus))
    optimizer = stats.steady_share("optimizer")
    if optimizer >= t.optimizer_share:
        out.append(make(
            "optimizer_heavy", "warning", "The optimizer step takes a large share of each step",
            f"optimizer takes {pct(optimizer)} of step time; threshold {pct(t.optimizer_share)}",
            optimizer * 0.5,
            "Use a fused or foreach optimizer: torch.optim.AdamW(params, lr=..., fused=True) (CUDA), or "
            "foreach=True.",
            optimizer_share=optimizer))
    other = _other_heavy(stats, t, named_work or {})
    if other is not None:
        out.append(other)
    recent = list(stats.recent)
    padding = _padding_waste(recent, stats, t, framework, framework_version, length_grouped, recipe)
    if padding is not None:
        out.append(padding)
    churn = _shape_churn(recent, t, framework, compiled)
    variance = (_step_time_variance(recent, t, min_steps, framework, framework_version, length_grouped, host_share)
                if churn is None else None)
    out.extend(verdict for verdict in (churn, variance) if verdict is not None)
    if compiled and len(recent) >= min_steps:
        first = [timing.step_ms for timing in recent[:3]]
        steady_ms = statistics.median(timing.step_ms for timing in recent[3:])
        excess = sum(max(0.0, ms - steady_ms) for ms in first)
        total = sum(timing.step_ms for timing in recent)
        slow = statistics.fmean(first) >= t.warmup_slowdown * steady_ms
        if steady_ms > 0 and slow and excess / total >= t.warmup_share:
            out.append(make(
                "compile_warmup", "info", TITLES["compile_warmup"],
                f"torch.compile compiled graphs in this run; the first 3 steps average {statistics.fmean(first):.1f} "
                f"ms vs a steady {steady_ms:.1f} ms ({excess / total:.1%} of the run's step time); thresholds "
                f"{t.warmup_slowdown:g}× and {pct(t.warmup_share)}",
                excess / total,
                "Expected once per process; if it recurs, look for recompilation "
                "(torch._logging.set_logs(recompiles=True)) and mark dynamic shapes (torch._dynamo.mark_dynamic).",
                first_steps_ms=statistics.fmean(first), steady_ms=steady_ms))
    return out


def _step_time_variance(recent: list[Any], t: Thresholds, min_steps: int, framework: str | None,
                        framework_version: str | None = None, length_grouped: str | None = None,
                        host_share: float | None = None) -> dict[str, Any] | None:
    """``step_time_variance`` over the steady steps (after the first 3, perfhooks' own left out); said as the
    batches' lengths when the step time follows them, and as the host's (information, no gain) when other
    processes took a large share of this process's CPUs (``host_share``)."""
    own = sum(1 for timing in recent if timing.own)
    # steady state only: the first steps are warm-up, and perfhooks' own steps are not the user's
    steady = sorted(timing.step_ms for timing in recent[3:] if not timing.own)
    p50 = steady[len(steady) // 2] if steady else 0.0
    p95 = steady[min(len(steady) - 1, round(0.95 * (len(steady) - 1)))] if steady else 0.0
    follows = _follows_the_length(recent[3:], t)
    if len(steady) >= min_steps and p50 > 0 and p95 / p50 >= t.step_p95_over_p50 and follows is not None:
        return make(
            "step_time_variance", "info", TITLES["step_time_variance"],
            f"step p95 {p95:.1f} ms is {p95 / p50:.2f}× the p50 {p50:.1f} ms over {len(steady)} steps, and the step "
            f"time follows the batch's {follows[1]} (correlation {follows[0]:.2f}; threshold "
            f"{t.length_correlation:g}): longer batches take longer, which is not a stall; threshold "
            f"{t.step_p95_over_p50:g}×",
            0.0,
            _length_fix(framework, framework_version, grouped=length_grouped),
            p95_over_p50=p95 / p50, length_correlation=follows[0])
    if len(steady) >= min_steps and p50 > 0 and p95 / p50 >= t.step_p95_over_p50 and host_share is not None:
        return make(
            "step_time_variance", "info", TITLES["step_time_variance"],
            f"step p95 {p95:.1f} ms is {p95 / p50:.2f}× the p50 {p50:.1f} ms over {len(steady)} steady steps, while "
            f"other processes used {pct(host_share)} of this process's CPUs: the host's variance, not the "
            f"program's; threshold {t.step_p95_over_p50:g}×",
            0.0, "Measure on an idle machine before looking for the program's slow steps.",
            p95_over_p50=p95 / p50, host_others_share=host_share)
    if len(steady) >= min_steps and p50 > 0 and p95 / p50 >= t.step_p95_over_p50:
        return make(
            "step_time_variance", "warning" if p95 / p50 >= 2 * t.step_p95_over_p50 else "info",
            TITLES["step_time_variance"],
            f"step p95 {p95:.1f} ms is {p95 / p50:.2f}× the p50 {p50:.1f} ms over {len(steady)} steady steps "
            f"(of {len(recent)}: the first {min(3, len(recent))} are warm-up, and {own} overlapped perfhooks' own "
            f"work); threshold {t.step_p95_over_p50:g}×",
            max(0.0, 1 - p50 / statistics.fmean(steady)),
            "Look at what the slow steps do (periodic logging, .item() calls in callbacks, GC, data stalls); the "
            "per-phase p95 in the report shows which phase spikes.",
            p95_over_p50=p95 / p50)
    return None


def _shape_churn(recent: list[Any], t: Thresholds, framework: str | None, compiled: bool) -> dict[str, Any] | None:
    """``shape_churn``: each batch shape's first step against the later steps of the same shape. A new padded
    length or batch size meets the caching allocator (new block sizes) and kernel selection (cuBLAS heuristics,
    cuDNN benchmark; a compiled model recompiles) for the first time; the same shape again does not. The extra
    time is measured only where a shape came back (its first step less the median of its later ones); the step
    time variance this explains is this verdict, not ``step_time_variance``'s."""
    # the first step is warm-up; a step perfhooks' own work overlapped is no baseline, but a shape's first step
    # stays one whatever overlapped it (its first meeting with the shape happened there)
    steps = [timing for timing in recent[1:] if timing.shape and (timing.new_shape or not timing.own)]

    def cost(timing: Any) -> float:  # a recompilation for the new shape, taken out of the step, is its cost
        return timing.step_ms + (timing.aside_ms if timing.compiled else 0.0)

    by_shape: dict[int, list[float]] = {}
    for timing in steps:
        by_shape.setdefault(timing.shape, []).append(cost(timing))
    firsts = {timing.shape: cost(timing) for timing in steps if timing.new_shape}
    slower = [(firsts[shape], statistics.median(times[1:])) for shape, times in by_shape.items()
              if shape in firsts and len(times) >= 2 and times[0] == firsts[shape]]
    slow = [(first, again) for first, again in slower if first >= t.shape_churn_slowdown * again]
    total = sum(cost(timing) for timing in steps)
    extra = sum(first - again for first, again in slow)
    if len(slow) < 3 or len(slow) < len(slower) / 2 or not total or extra / total < t.shape_churn_share:
        return None
    new_steps = sum(1 for timing in steps if timing.new_shape)
    return make(
        "shape_churn", "warning", TITLES["shape_churn"],
        f"{len(by_shape)} distinct batch shapes in {len(steps)} steps; {new_steps} steps met a shape for the first "
        f"time, and of the {len(slower)} shapes that came back, {len(slow)} took a median "
        f"{statistics.median(first / again for first, again in slow):.1f}× longer on their first step than on their "
        f"later ones: {extra:.0f} ms, {pct(extra / total)} of the steps' time (the allocator and kernel selection "
        f"meeting a new shape{'; a compiled model recompiles' if compiled else ''}); thresholds "
        f"{t.shape_churn_slowdown:g}× and {pct(t.shape_churn_share)}",
        extra / total,
        _shape_fix(framework, compiled),
        shapes=len(by_shape), new_shape_steps=new_steps, shape_churn_share=extra / total)


def _shape_fix(framework: str | None, compiled: bool) -> str:
    pad = ("DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64) (or DataCollatorForLanguageModeling(..., "
           "pad_to_multiple_of=64))" if framework == "transformers" else
           "pad each batch to a multiple of 64 tokens (pad_to_multiple_of=64 in HF collators)")
    fixed = (" A compiled model recompiles for new shapes: pad to a few fixed lengths, or mark the length dynamic "
             "(torch._dynamo.mark_dynamic(input_ids, 1))." if compiled else "")
    return (f"Make the shapes repeat: {pad}, so that a handful of lengths recur; bucket samples by length or pack "
            f"them into fixed-length rows; keep the batch size fixed (drop_last=True).{fixed}")


def _padding_waste(recent: list[Any], stats: Any, t: Thresholds, framework: str | None,
                   framework_version: str | None = None, length_grouped: str | None = None,
                   recipe: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``padding_waste``: the share of the detailed steps' token slots that are padding (from each batch's
    ``attention_mask``); the most it can save is that share of the forward and backward time. Padding is the data's,
    not the clock's: every detailed step counts, perfhooks' own and the warm-up's too (a loaded host's run has few
    steady ones); the forward and backward share is the steady steps', or the run's where fewer than 5 are."""
    counted = [timing for timing in recent if timing.padded_tokens]
    slots = sum(timing.padded_tokens for timing in counted)
    if len(counted) < 5 or not slots:
        return None
    share = 1.0 - sum(timing.tokens for timing in counted) / slots
    if share < t.padding_share:
        return None
    steady = [timing for timing in counted[3:] if not timing.own and not timing.compiled]
    if len(steady) >= 5:
        compute = sum(timing.phase_ms.get("forward", 0.0) + timing.phase_ms.get("backward", 0.0) for timing in steady)
        total = sum(timing.step_ms for timing in steady)
        compute_share = compute / total if total else 0.0
    else:
        compute_share = stats.share("forward") + stats.share("backward")
    pads = slots - sum(timing.tokens for timing in counted)
    widths = {timing.padded_tokens // timing.samples for timing in counted if timing.samples}
    fixed = len(widths) == 1 and all(timing.padded_tokens % timing.samples == 0 for timing in counted
                                     if timing.samples)
    arrived = (f"; every batch arrives {next(iter(widths))} tokens wide, so the samples are padded to a fixed "
               "width before batching" if fixed else "")
    multiple = (recipe or {}).get("pad_to_multiple_of")
    if multiple:
        config = (recipe or {}).get("config")
        arrived += f" (the run's {config}(pad_to_multiple_of={multiple}) pads every batch up to it)"
    # attention's scores grow with the square of a sample's length: with real lengths L_i in slots of width W, the
    # share of that work that is padding is 1 - sum(L_i^2) / (n W^2), at most 1 - (1 - share)^2 (Cauchy-Schwarz)
    quadratic = 1.0 - (1.0 - share) ** 2
    fix = _length_fix(framework, framework_version, fixed, length_grouped)
    spelled = ((recipe or {}).get("spell") or {}).get("padding")
    if multiple and spelled:
        fix = (f"{spelled}: the collator then pads each batch to its own longest sample (a small multiple, 8 or 64, "
               f"keeps few distinct shapes where that matters); " + fix[0].lower() + fix[1:])
    return make(
        "padding_waste", "warning", "Much of each batch is padding",
        f"{pct(share)} of the token slots in {len(counted)} detailed steps are padding ({pads} of {slots}, from the "
        f"batches' attention_mask){arrived}; forward and backward, which run on the padding too, "
        f"take {pct(compute_share)} of the step; the work that grows with the length saves that share of itself, "
        f"attention's, which grows with its square, up to {pct(quadratic)}: the most it saves is "
        f"{pct(quadratic)} of the forward and backward; threshold {pct(t.padding_share)}",
        quadratic * compute_share, fix, padding_share=share, fixed_width=fixed,
        pad_to_multiple_of=multiple)


def group_by_length(framework_version: str | None) -> str:
    """transformers' length grouping, as the installed version spells it: ``train_sampling_strategy`` from 5.0,
    ``group_by_length=True`` before (5.x raises TypeError on the old name)."""
    major = (framework_version or "5").split(".", 1)[0]
    if major.isdigit() and int(major) < 5:
        return "TrainingArguments(group_by_length=True)"
    return 'TrainingArguments(train_sampling_strategy="group_by_length")'


def _length_fix(framework: str | None, framework_version: str | None = None, fixed_width: bool = False,
                grouped: str | None = None) -> str:
    """The padding fix: pad each batch to its own longest sample where samples arrive padded to a fixed width
    (grouping by length changes nothing then), else group samples of similar length; where the framework already
    groups them (``grouped``: its setting), not that again."""
    per_batch = ("Pad each batch, not each sample: drop padding=\"max_length\" from the tokenizer (or the Dataset's "
                 "own padding) and let the collator pad a batch to its longest sample (DataCollatorWithPadding"
                 "(tokenizer), or torch.nn.utils.rnn.pad_sequence in a collate_fn)")
    if grouped:
        already = f"Samples are already grouped by length ({grouped}): "
        if fixed_width:
            return already + per_batch + "."
        return (already + "what is left is the spread of the lengths themselves. Pack samples into fixed-length rows"
                + (" (SFTConfig(packing=True) with TRL's SFTTrainer)" if framework == "transformers" else "")
                + ", or pad each batch to a multiple of 64 (pad_to_multiple_of=64 in the collator: fewer distinct "
                "shapes).")
    if framework == "transformers":
        grouping_fix = (f"{group_by_length(framework_version)} then puts samples of similar length in a batch"
                        if fixed_width else
                        f"Batch samples of similar length together: {group_by_length(framework_version)}")
        return ((per_batch + "; " + grouping_fix if fixed_width else grouping_fix)
                + "; with TRL's SFTTrainer, SFTConfig(packing=True) packs samples with no padding at all.")
    grouping = ("a length-bucketing batch sampler (sort indices by length within chunks of ~100 batches, then "
                "shuffle the batches), or pack sequences into fixed-length rows")
    if fixed_width:
        return f"{per_batch}; then batch samples of similar length together: {grouping}."
    return (f"Batch samples of similar length together: {grouping}; pad each batch to its own longest sample "
            "(DataCollatorWithPadding), not to a fixed max_length.")


def _follows_the_length(recent: list[Any], t: Thresholds) -> tuple[float, str] | None:
    """``(correlation, what)`` when the steady steps' time follows their padded token count (or, without a
    mask, their token count), so that variance is the batches' lengths; None otherwise."""
    steady = [timing for timing in recent if not timing.own and not timing.compiled]
    for what, sizes in (("padded length", [timing.padded_tokens for timing in steady]),
                        ("token count", [timing.tokens for timing in steady])):
        if len(steady) >= 5 and all(sizes) and len(set(sizes)) > 1:
            try:
                correlation = statistics.correlation(sizes, [timing.step_ms for timing in steady])
            except statistics.StatisticsError:
                return None
            return (correlation, what) if correlation >= t.length_correlation else None
    return None


def _share_without_the_longest(recent: Any, phase: str) -> float:
    """Fraction 0..1 of the recent steady steps' time in ``phase``, leaving out the step that spent the most in it:
    one stall (a GC pause, the machine's other work) is not a pattern. 1.0 when there is nothing to judge by."""
    steady = [timing for timing in recent if not timing.own and not timing.compiled]
    if len(steady) < 2:
        return 1.0
    longest = max(steady, key=lambda timing: timing.phase_ms.get(phase, 0.0))
    total = sum(timing.step_ms for timing in steady) - longest.step_ms
    spent = sum(timing.phase_ms.get(phase, 0.0) for timing in steady) - longest.phase_ms.get(phase, 0.0)
    return spent / total if total > 0 else 0.0


#: Named work below this (ms per step) is not listed as a cause.
NAMED_WORK_MIN_MS = 0.05
#: ``other`` below this (ms per step) is no verdict whatever its share: a tiny step's bookkeeping.
OTHER_MIN_MS = 0.5


def _other_heavy(stats: Any, t: Thresholds, named_work: dict[str, float]) -> dict[str, Any] | None:
    """``other_heavy``: the steady step's time outside the four phases, with who ran in it where the framework
    named it (Lightning's callback hooks, ``Name.hook``; ms per step)."""
    other = stats.steady_share("other")
    if other < t.other_share or _share_without_the_longest(stats.recent, "other") < t.other_share:
        return None
    other_ms = stats.steady_mean("other")
    # a wait for the other ranks (transformers' gather of the token count) is set by the slowest rank: not this
    # rank's own work, and no fix here (the ranks' straggler verdict names the slow one)
    waits = sum(ms for name, ms in named_work.items() if name in RANK_WAITS)
    if waits and other_ms > 0:
        own = max(0.0, other_ms - waits)
        other, other_ms = other * own / other_ms, own
        if other < t.other_share:
            return None
    if other_ms < OTHER_MIN_MS:
        return None
    # a cause is named when it is at least a tenth of the time outside the phases
    named = [(name, ms) for name, ms in sorted(named_work.items(), key=lambda item: -item[1])
             if name not in RANK_WAITS and ms >= max(NAMED_WORK_MIN_MS, 0.1 * other_ms)][:3]
    evidence = (f"time outside data wait, forward, backward and optimizer takes {pct(other)} of the step "
                f"({other_ms:.2f} ms a step); threshold {pct(t.other_share)}")
    if waits:
        evidence += f" (less {waits:.2f} ms a step waiting for the other ranks, which the slowest rank sets)"
    evaluating = dict(named).get(EVALUATION_FORWARDS, 0.0)
    if named and evaluating >= 0.5 * other_ms:  # most of it is the model evaluated inside the steps
        evidence += (f"; the model ran forwards in eval mode or under no_grad inside the steps for {evaluating:.2f} ms "
                     "a step: a validation loop counted as training")
        fix = ("Mark the validation loop: with perf.evaluation(): for batch in val_loader: ... (its time is then "
               "reported apart, as evaluation, and taken out of the steps); evaluate less often if it is a large "
               "share of the run.")
        return make("other_heavy", "warning", "Work outside the training phases holds each step back", evidence,
                    other, fix, other_share=other, named_work_ms=dict(named))
    if named:
        evidence += "; the framework names who ran in the steps: " + ", ".join(
            f"{name} {ms:.2f} ms a step" for name, ms in named)
        owners = sorted({name.split(".")[0] for name, _ in named})
        them = "it" if len(owners) == 1 else "them"
        fix = (f"Make {' and '.join(owners)} cheaper or run {them} less often: in the hook, return early unless "
               "trainer.global_step % 50 == 0; avoid .item(), print and file writes there on every step.")
    else:
        fix = ("Find the per-step host work after the optimizer step (callbacks, logging, metrics): log every N "
               "steps (Trainer(log_every_n_steps=50), TrainingArguments(logging_steps=50)), and avoid .item() and "
               "print in the step.")
    return make("other_heavy", "warning", "Work outside the training phases holds each step back", evidence,
                other, fix, other_share=other, named_work_ms=dict(named))


#: Loader workers suggested at most (more rarely helps a single training process).
MAX_WORKERS = 4


def loader_fix(framework: str | None, accelerator: bool, cpus: int | None) -> str:
    """The data loader's fix, fitted to the CPUs the process may use (``cpus``; None: unknown) and spelled for
    the framework: workers leave one CPU to the training process; where that leaves fewer than two, the per-sample
    work is better done once, before training."""
    workers = MAX_WORKERS if cpus is None else min(MAX_WORKERS, cpus - 1)
    once = ("do the per-sample work (tokenizing, decoding) once before training: datasets' map(..., batched=True), "
            "or a cached, pre-processed copy of the data")
    if workers < 2:
        return (f"This process may use {cpus} CPU(s): loader workers would take them from training. Instead, "
                f"{once}.")
    pin = accelerator
    if framework == "transformers":
        setting = (f"TrainingArguments(dataloader_num_workers={workers}, "
                   f"{'dataloader_pin_memory=True, ' if pin else ''}dataloader_persistent_workers=True)")
    else:
        setting = (f"DataLoader(dataset, num_workers={workers}, {'pin_memory=True, ' if pin else ''}"
                   "persistent_workers=True, prefetch_factor=2)")
    where = f" ({cpus} CPUs usable, one left to training)" if cpus is not None else ""
    return f"{setting}{where}; or {once}."
