"""``perfhooks tune``'s plan and verdicts, without torch: which knobs to try on a script (from the baseline trial's
facts and diagnoses), and what each trial measured against the baseline.

- **Knobs** (:data:`KNOBS`): DataLoader workers (with ``persistent_workers``, and ``pin_memory`` on an
  accelerator), TF32 matmuls, bf16 autocast, ``torch.compile`` and SDPA attention, each set at the framework's own
  seam (:mod:`perfhooks.integrations.trials`). One that does not apply to the run, or that the framework has no
  setting for, is skipped with its reason.
- **Speedup**: the baseline's mean steady step over the trial's (what throughput gains: a loader with workers
  makes some steps wait and others not, and the median alone would flatter it), with a 95% bootstrap interval of
  that ratio (both runs' steady steps resampled, 2,000 times, a fixed seed), spanning the ratio against each run
  of the baseline (before and after the trials); each side's median (p50) is given beside it. A figure to doubt is
  flagged (:func:`flags`). Steady steps are the report's per-step series after the warm-up
  (:data:`perfhooks.offline.gate.WARMUP_STEPS`), perfhooks' own steps left out.
- **Loss**: the trial's loss minus the baseline's at each step both reached; DataLoader knobs should leave it
  identical (``numerics: "unchanged"``), the others change numerics and report the difference.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

from perfhooks.events import OTHER, PHASES
from perfhooks.offline.diff import slower_operators
from perfhooks.offline.gate import COVERAGE, RESAMPLES, WARMUP_STEPS, bootstrap_interval, steady_steps_ms, steady_values


@dataclass(frozen=True)
class Knob:
    """A change ``perfhooks tune`` can try: its name, the diagnoses that name it, and whether it should leave
    the loss unchanged."""

    name: str
    title: str
    named_by: tuple[str, ...]
    keeps_numerics: bool


KNOBS: tuple[Knob, ...] = (
    Knob("dataloader_workers", "DataLoader worker processes", ("dataloader_bound",), True),
    Knob("tf32", "TF32 matmuls", ("fp32_matmul",), False),
    Knob("bf16", "bf16 autocast", ("fp32_matmul",), False),
    Knob("compile", "torch.compile", ("launch_bound", "host_bound", "low_gpu_utilization"), False),
    Knob("sdpa", "SDPA attention", ("unfused_attention",), False),
    Knob("anomaly_off", "autograd anomaly detection off", ("anomaly_detection",), True),
    Knob("threads", "intra-op threads at the usable CPUs", ("cpu_threads",), False),
    Knob("micro_batch", "one micro-batch a step, same samples", ("small_micro_batches",), False),
    Knob("checkpointing_off", "activation checkpointing off", ("activation_checkpointing",), True),
    Knob("padding", "each batch padded to its own longest sample", ("padding_waste",), False),
    Knob("eval_batch", "an evaluation batch of a training step's samples", ("evaluation_batch", "evaluation_heavy"),
         True),
    Knob("fp32", "mixed precision off (fp32)", ("mixed_precision_slower",), False),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)


#: Knobs a plain loop (``perfhooks.profile``) has no setting for, and the change to make in its code instead.
PLAIN_LOOP_SKIPS = {
    "bf16": "a plain loop has no precision setting: wrap the forward in with torch.autocast(device_type, "
            "dtype=torch.bfloat16): ... and measure",
    "compile": "a plain loop has no compile setting: model = torch.compile(model), and pass the compiled module to "
               "perfhooks.profile",
    "sdpa": "a plain loop has no attention switch; use torch.nn.functional.scaled_dot_product_attention in the model",
}


def worker_count(cores: int) -> int:
    """Workers to try: the cores this process may use, at least 2 (a loader that waits on I/O or sleeps gains
    from 2 on one core), at most 8."""
    return max(2, min(8, cores))


def plan(facts: dict[str, Any], device: str, diagnoses: list[str], cores: int,
         only: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(trials, skipped)`` for a baseline's ``facts`` (:mod:`perfhooks.integrations.trials`), device type and
    diagnosis ids. Each trial: ``{knob, knobs, change, named_by, keeps_numerics}``; each skip: ``{knob, reason}``.
    Knobs a diagnosis named come first."""
    framework = facts.get("framework")
    accelerator = device not in ("cpu", "not_recorded", None)
    trials, skipped = [], []
    for knob in KNOBS:
        if only and knob.name not in only:
            continue
        setting, reason = _setting(knob.name, framework, facts, accelerator, cores, diagnoses)
        if reason:
            skipped.append({"knob": knob.name, "reason": reason})
            continue
        named = [d for d in diagnoses if d in knob.named_by]
        trials.append({"knob": knob.name, "title": knob.title, "knobs": setting[0], "change": setting[1],
                       "named_by": named, "keeps_numerics": knob.keeps_numerics})
    trials.sort(key=lambda t: not t["named_by"])
    return trials, skipped


def untried(report: dict[str, Any], trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The baseline's diagnoses with a gain that no trial's knob answers (``padding_waste``, ``memory_growth``,
    a fix in the user's code): ``{id, title, estimated_gain, recommendation}``, largest gain first. The tune says
    them, so that its table is not read as everything the run could gain."""
    answered = {name for trial in trials for name in trial.get("named_by") or []}
    out = [{"id": d["id"], "title": d.get("title"), "estimated_gain": d.get("estimated_gain"),
            "gain_basis": d.get("gain_basis", "step"), "recommendation": d.get("recommendation")}
           for d in report.get("diagnoses") or []
           if d.get("id") not in answered and (d.get("estimated_gain") or 0) > 0]
    return sorted(out, key=lambda d: -(d["estimated_gain"] or 0))


def _setting(name: str, framework: str | None, facts: dict[str, Any], accelerator: bool, cores: int,
             diagnoses: list[str] = ()) -> tuple[tuple[dict[str, Any], str], str | None]:  # type: ignore[assignment]
    """``((knobs, the change to make in the user's code), None)``, or ``(_, why it is skipped)``."""
    none: tuple[dict[str, Any], str] = ({}, "")
    if framework not in ("lightning", "transformers", "accelerate", "pytorch"):
        return none, ("no Lightning Trainer, transformers Trainer, Accelerator or perfhooks.profile loop was run by "
                      "the script")
    if framework == "pytorch" and name in PLAIN_LOOP_SKIPS:  # a plain loop has no seam for these: the code changes
        return none, PLAIN_LOOP_SKIPS[name]
    if name == "anomaly_off":
        if "anomaly_detection" not in diagnoses:
            return none, "autograd anomaly detection is off"
        return ({"anomaly_off": True}, "remove torch.autograd.set_detect_anomaly(True)"
                + (" (and Trainer(detect_anomaly=True))" if framework == "lightning" else "")), None
    if name == "threads":
        if "cpu_threads" not in diagnoses:
            return none, "the intra-op threads already match the usable CPUs (or the run is not on the CPU)"
        return ({"threads": cores}, f"torch.set_num_threads({cores}) (or remove the smaller setting)"), None
    if name == "dataloader_workers":
        return _workers(framework, facts, accelerator, cores)
    if name in RECIPE_KNOBS:
        return _recipe_knob(name, framework, facts, accelerator, diagnoses)
    if name == "tf32":
        if not accelerator:
            return none, "TF32 is a matmul mode of NVIDIA GPUs (Ampere and later); on CPU it changes nothing"
        return ({"tf32": True}, 'torch.set_float32_matmul_precision("high") at the top of the script'), None
    if name == "bf16":
        if facts.get("precision") is None:
            return none, "the script's precision setting was not seen (no TrainingArguments, Trainer or Accelerator)"
        if str(facts["precision"]) not in ("32-true", "32", "fp32", "no"):
            return none, f"the run already uses {facts['precision']} precision"
        if framework == "transformers" and not accelerator:  # transformers refuses bf16 without a GPU unless told
            return ({"bf16": True, "use_cpu": True}, "TrainingArguments(bf16=True, use_cpu=True)"), None
        return ({"bf16": True}, {"lightning": 'Trainer(precision="bf16-mixed")',
                                 "transformers": "TrainingArguments(bf16=True)",
                                 "accelerate": 'Accelerator(mixed_precision="bf16")'}[framework]), None
    if name == "compile":
        if framework == "lightning":
            return none, ("Lightning's Trainer has no torch.compile setting: compile the module yourself "
                          "(model = torch.compile(model) before trainer.fit)")
        if facts.get("compiled"):
            return none, "the run is already compiled"
        return ({"compile": True}, {"transformers": "TrainingArguments(torch_compile=True)",
                                    "accelerate": 'Accelerator(dynamo_backend="inductor")'}[framework]), None
    if framework != "transformers":
        shown = {"lightning": "Lightning", "accelerate": "accelerate"}[framework]
        if "unfused_attention" not in diagnoses:  # the model may call SDPA already: nothing says otherwise
            return none, (f"{shown} has no attention switch, and no unfused_attention verdict says the model writes "
                          "attention out by hand")
        return none, (f"{shown} has no attention switch; the unfused_attention verdict says where the model writes "
                      "attention out by hand: use torch.nn.functional.scaled_dot_product_attention there")
    implementation = facts.get("attn_implementation")
    if implementation != "eager":
        return none, f"the model's attention is {implementation!r}, not eager"
    return ({"sdpa": True}, 'attn_implementation="sdpa" where the model is built (from_pretrained or the config), '
                            'or model.set_attn_implementation("sdpa")'), None


#: The recipe's knobs (:mod:`perfhooks.rules.recipe`), set on ``TrainingArguments`` (and TRL's configs).
RECIPE_KNOBS = ("micro_batch", "checkpointing_off", "padding", "eval_batch", "fp32")


def _recipe_knob(name: str, framework: str, facts: dict[str, Any], accelerator: bool = False,
                 diagnoses: Any = ()) -> tuple[tuple[dict[str, Any], str], str | None]:
    """A recipe knob's setting, from the baseline's facts (the framework's own arguments), or why it is skipped."""
    none: tuple[dict[str, Any], str] = ({}, "")
    if name == "fp32":
        precision = str(facts.get("precision") or "")
        if precision in ("", "32-true", "32", "fp32", "no"):
            return none, "the run already trains in fp32"
        if accelerator and "mixed_precision_slower" not in diagnoses:
            return none, "mixed precision on a GPU: fp32 is tried where a verdict measured it slower"
        spelled = {"lightning": 'Trainer(precision="32-true")',
                   "transformers": f"{facts.get('config') or 'TrainingArguments'}(bf16=False, fp16=False)",
                   "accelerate": 'Accelerator(mixed_precision="no")'}.get(framework)
        if spelled is None:
            return none, "a plain loop has no precision setting: take the torch.autocast out of the loop and measure"
        return ({"fp32": True}, spelled), None
    if framework != "transformers":
        return none, ("set in TrainingArguments for a transformers Trainer; in this framework it is the script's own "
                      "code (the loaders' batch_size, the model's checkpointing): change it there and compare with "
                      "perfhooks diff")
    config = str(facts.get("config") or "TrainingArguments")
    micro, steps = int(facts.get("micro_batch") or 0), int(facts.get("accumulation") or 1)
    if name == "micro_batch":
        if steps < 2 or not micro:
            return none, "each step is one micro-batch already"
        return ({"micro_batch": micro * steps, "accumulation": 1},
                f"{config}(per_device_train_batch_size={micro * steps}, gradient_accumulation_steps=1)"), None
    if name == "checkpointing_off":
        if not facts.get("checkpointing"):
            return none, "activation checkpointing is off"
        return ({"checkpointing_off": True}, f"{config}(activation_checkpointing=False)"), None
    if name == "padding":
        if not facts.get("pad_to_multiple_of"):
            return none, "no pad_to_multiple_of is set (the collator pads each batch to its longest sample)"
        return ({"padding": True}, f"{config}(pad_to_multiple_of=None) (was {facts['pad_to_multiple_of']})"), None
    evaluation = int(facts.get("eval_batch") or 0)
    if not evaluation or not micro or evaluation >= micro * steps:
        return none, "the evaluation batch is not smaller than a training step's samples"
    return ({"eval_batch": micro * steps}, f"{config}(per_device_eval_batch_size={micro * steps})"), None


def _workers(framework: str, facts: dict[str, Any], accelerator: bool, cores: int
             ) -> tuple[tuple[dict[str, Any], str], str | None]:
    seen = facts.get("loader_workers") or []
    if not seen:
        return ({}, ""), "no DataLoader was built by the script"
    if min(seen) > 0:
        return ({}, ""), f"the loaders already use {min(seen)} or more worker processes"
    workers = worker_count(cores)
    knobs: dict[str, Any] = {"num_workers": workers}
    if accelerator:
        knobs["pin_memory"] = True
    if framework == "transformers":
        change = f"TrainingArguments(dataloader_num_workers={workers}, dataloader_persistent_workers=True" + \
                 (", dataloader_pin_memory=True)" if accelerator else ")")
    else:
        change = f"DataLoader(..., num_workers={workers}, persistent_workers=True" + \
                 (", pin_memory=True)" if accelerator else ")")
    return (knobs, change), None


# ----------------------------------------------------------------------------- measurements
#: The phases a knob cannot change: a DataLoader's workers move the fetch, not the model's work; the model's knobs
#: (precision, compile, attention) leave the fetch alone on the CPU (where ``data_wait`` is the fetch's host time;
#: on a device it is the device's exposed wait, which a faster model changes).
UNTOUCHED = {"dataloader_workers": ("forward", "backward", "optimizer")}
UNTOUCHED_ON_CPU = ("data_wait",)
#: A phase the knob cannot touch is flagged when its trial mean is outside the baseline's spread (every baseline
#: block's 95% interval of the mean, and the blocks' own means) by more than this factor, and by at least
#: :data:`MOVED_SHARE` of the baseline's step (a move too small to change the speedup is not a doubt on it).
MOVED_FACTOR = 1.2
MOVED_SHARE = 0.05
#: The baseline's two runs differ by at least this share of the step: every trial is flagged, even where their
#: intervals overlap (a noisy step widens them; an 11% drift is still the machine's, not a change's).
DRIFT_SHARE = 0.10
#: A speedup is flagged when it passes the ceiling of the diagnosis that named the knob by more than this factor.
CEILING_SLACK = 1.05


def speedup(base_ms: list[float], trial_ms: list[float], seed: int = 0,
            blocks: list[list[float]] | None = None) -> dict[str, Any]:
    """``{speedup, interval, base_ms, trial_ms, base_p50_ms, trial_p50_ms, steps}``: the baseline's mean steady
    step over the trial's, and the 95% bootstrap interval of that ratio.

    With ``blocks`` (the baseline run more than once: before the trials and after them), ``base_ms`` is their
    pooled steps, the speedup is the blocks' mean step over the trial's, and the interval spans every block's: the
    ratio's bootstrap against each block, so that a machine that changed between the blocks widens it."""
    blocks = [block for block in (blocks or [base_ms]) if block]
    if not blocks or not trial_ms:
        return {"speedup": None, "interval": None, "steps": [len(base_ms), len(trial_ms)]}
    lows, highs = [], []
    for index, block in enumerate(blocks):
        low, high = _ratio_interval(block, trial_ms, seed + index)
        lows.append(low)
        highs.append(high)
    base = statistics.fmean(statistics.fmean(block) for block in blocks)
    trial = statistics.fmean(trial_ms)
    pooled = [ms for block in blocks for ms in block]
    return {"speedup": round(base / trial, 4), "interval": [round(min(lows), 4), round(max(highs), 4)],
            "base_ms": round(base, 4), "trial_ms": round(trial, 4),
            "base_p50_ms": round(statistics.median(pooled), 4), "trial_p50_ms": round(statistics.median(trial_ms), 4),
            "steps": [len(pooled), len(trial_ms)]}


def _ratio_interval(base_ms: list[float], trial_ms: list[float], seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    ratios = sorted(statistics.fmean(rng.choices(base_ms, k=len(base_ms)))
                    / statistics.fmean(rng.choices(trial_ms, k=len(trial_ms))) for _ in range(RESAMPLES))
    tail = (1 - COVERAGE) / 2
    return ratios[int(tail * (RESAMPLES - 1))], ratios[int((1 - tail) * (RESAMPLES - 1))]


def steady_phase_ms(report: dict[str, Any], phase: str) -> list[float]:
    """One phase's steady steps (ms), the steps :func:`~perfhooks.offline.gate.steady_steps_ms` keeps."""
    series = report.get("series") or {}
    values = series.get(phase)
    return steady_values(series, values) if isinstance(values, list) else []


def ceilings(report: dict[str, Any]) -> dict[str, float]:
    """Each step diagnosis' ceiling on a speedup: ``1 / (1 - estimated_gain)`` (the most its fix can give)."""
    out = {}
    for diagnosis in report.get("diagnoses") or []:
        gain = diagnosis.get("estimated_gain")
        if isinstance(gain, (int, float)) and 0 <= gain < 1 and diagnosis.get("gain_basis", "step") == "step":
            out[diagnosis["id"]] = round(1 / (1 - gain), 4)
    return out


def oversubscribed(knobs: dict[str, Any], base_report: dict[str, Any], cores: int) -> str | None:
    """Why a loader-workers trial slowed the model's own phases where the workers and the intra-op threads
    together exceed the usable CPUs (they take turns on them), or None."""
    workers = int(knobs.get("num_workers") or 0)
    threads = int(((base_report.get("settings") or {}).get("intra_op_threads")) or 0)
    if not workers or not threads or workers + threads <= cores:
        return None
    return (f"{workers} worker processes and {threads} intra-op threads on {cores} usable CPUs: they take turns on "
            "the CPUs, so forward and backward slow down while the fetch speeds up. With this few CPUs, do the "
            "per-sample work once before training, or give the workers fewer threads' room "
            f"(torch.set_num_threads({max(1, cores - workers)}))")


def flags(knob: str, figures: dict[str, Any], named_by: list[str], base_ceilings: dict[str, float],
          base_reports: list[dict[str, Any]], trial_report: dict[str, Any], device: str | None,
          crowded: str | None = None) -> list[dict[str, str]]:
    """What makes a trial's figure suspect, each ``{id, text}``: ``beyond_ceiling`` (faster than the diagnosis
    that named the knob allows) and ``untouched_phase_moved`` (a phase the knob cannot change moved by more than
    the baseline's spread: the machine changed between runs, or the knob did more than it says; ``crowded``, from
    :func:`oversubscribed`, says why instead where the trial's processes outnumber the CPUs)."""
    out: list[dict[str, str]] = []
    ratio = figures.get("speedup")
    limits = [(base_ceilings[name], name) for name in named_by if name in base_ceilings]
    if ratio is not None and limits:
        ceiling, name = max(limits)
        if ratio > ceiling * CEILING_SLACK:
            out.append({"id": "beyond_ceiling", "text": f"{ratio:.2f}x is beyond the {ceiling:.2f}x that "
                        f"{name} allows (its estimated gain): the machine changed between the runs, or the change "
                        "did more than the diagnosis says"})
    changed = _machine_changed(base_reports)
    if changed:
        out.append({"id": "machine_changed", "text": changed})
    slower = slower_operator(base_reports[0], trial_report, ratio)
    if slower:
        out.append({"id": "operator_slower", "text": slower})
    untouched = UNTOUCHED.get(knob) or (UNTOUCHED_ON_CPU if device in ("cpu", None) else ())
    step_ms = figures.get("base_ms")
    for phase in untouched if step_ms else ():
        moved = _moved(phase, base_reports, trial_report, MOVED_SHARE * step_ms)
        if moved and crowded:
            out.append({"id": "oversubscribed", "text": f"{moved.split(', though')[0]}: {crowded}"})
            break
        if moved:
            out.append({"id": "untouched_phase_moved", "text": moved})
    return out


def slower_operator(base_report: dict[str, Any], trial_report: dict[str, Any], speedup: float | None) -> str | None:
    """In a trial whose step got faster, the operators of its window that took :data:`~perfhooks.offline.diff.GREW`
    times as long a step as in the baseline's window, or more (CPU flash attention's backward in bf16): said, so that
    a fix's net gain is not read as every operator's."""
    if speedup is None or speedup <= 1.0:
        return None
    before, after = _window_operators(base_report), _window_operators(trial_report)
    rows = [{"name": name, "before_us": before[name], "after_us": ms, "change_us": ms - before[name]}
            for name, ms in after.items() if name in before]
    grown = slower_operators(rows, None)
    if not grown:
        return None
    return "; ".join(f"{row['name']} took {row['ratio']:.1f}x as long a step ({row['before_us'] / 1e3:.1f} -> "
                     f"{row['after_us'] / 1e3:.1f} ms)" for row in grown[:3]) + \
        " while the step got faster: the change slows these, and another fix of them may gain more"


def _window_operators(report: dict[str, Any]) -> dict[str, float]:
    """The latest analysed window's top operators: name -> µs a step."""
    for window in reversed(report.get("windows") or []):
        operators = (window.get("metrics") or {}).get("top_operators")
        if operators:
            return {op["name"]: float(op["ms_per_step"]) * 1e3 for op in operators
                    if op.get("name") and isinstance(op.get("ms_per_step"), (int, float))}
    return {}


def _machine_changed(base_reports: list[dict[str, Any]]) -> str | None:
    """The baseline's first and last runs differ beyond their own spread (their 95% intervals of the mean step do
    not overlap) by at least :data:`MOVED_SHARE` of the step: the machine changed while the trials ran, and no
    trial's figure can be told from that change."""
    blocks = [steady_steps_ms(report) for report in (base_reports[0], base_reports[-1])] \
        if len(base_reports) > 1 else []
    if len(blocks) < 2 or min(len(block) for block in blocks) < 2:
        return None
    (first, first_low, first_high), (last, last_low, last_high) = (
        bootstrap_interval(block, statistics.fmean) for block in blocks)
    gap = max(last_low - first_high, first_low - last_high)
    drifted = abs(last - first) >= DRIFT_SHARE * first  # beyond any trial's doubt, whatever the spread
    if not drifted and (gap <= 0 or abs(last - first) < MOVED_SHARE * first):
        return None
    return (f"the baseline's step was {first:.2f} ms before the trials and {last:.2f} ms after them "
            f"({100 * (last / first - 1):+.0f}%): the machine changed while the trials ran, so this figure may be "
            "the machine's as much as the change's; run the tune again on a quiet machine")


def _moved(phase: str, base_reports: list[dict[str, Any]], trial_report: dict[str, Any], least_ms: float
           ) -> str | None:
    trial = steady_phase_ms(trial_report, phase)
    blocks = [steady_phase_ms(report, phase) for report in base_reports]
    blocks = [block for block in blocks if len(block) >= 2]
    if len(trial) < 2 or not blocks:
        return None
    lows, highs = [], []
    for block in blocks:
        mean, low, high = bootstrap_interval(block, statistics.fmean)
        lows.append(min(low, mean))
        highs.append(max(high, mean))
    low, high, mean = min(lows), max(highs), statistics.fmean(trial)
    if low / MOVED_FACTOR <= mean <= high * MOVED_FACTOR or max(low - mean, mean - high) < least_ms:
        return None
    return (f"{phase} took {mean:.2f} ms a step against the baseline's {low:.2f} to {high:.2f} ms, though this "
            "change cannot touch it: the machine changed between the runs, or the change did more than it says")


def one_time_s(report: dict[str, Any]) -> float | None:
    """What a run spent once (s): its warm-up steps' time beyond its steady mean step, plus the compilation taken
    out of the steps (``run.compiling_s``); None without steady steps."""
    steady = steady_steps_ms(report)
    series = report.get("series") or {}
    phases = [series.get(name) for name in (*PHASES, OTHER)]
    if not steady or not all(isinstance(values, list) for values in phases):
        return None
    steps = [sum(values[i] for values in phases) for i in range(len(phases[0]))]  # type: ignore[index]
    mean = statistics.fmean(steady)
    warm = sum(max(0.0, ms - mean) for ms in steps[:WARMUP_STEPS]) / 1e3
    return warm + float((report.get("run") or {}).get("compiling_s") or 0.0)


def payback(base_reports: list[dict[str, Any]], trial_report: dict[str, Any], figures: dict[str, Any],
            job_steps: int) -> dict[str, Any]:
    """A change's price and break-even: ``one_time_s`` (what the trial spent once beyond what the baseline did:
    compilation, warm-up), ``break_even_steps`` (the steady steps its saving takes to pay that back; None when the
    steady step is not faster), ``job_steps`` (the job's length it is held against), ``pays`` (within it) and
    ``net_s`` (what the whole job gains, s; negative: it loses)."""
    bases = [value for value in (one_time_s(report) for report in base_reports) if value is not None]
    trial = one_time_s(trial_report)
    base_ms, trial_ms = figures.get("base_ms"), figures.get("trial_ms")
    if not bases or trial is None or base_ms is None or trial_ms is None:
        return {"one_time_s": None, "break_even_steps": None, "job_steps": job_steps, "pays": None, "net_s": None}
    extra = trial - statistics.fmean(bases)
    saved_s = (base_ms - trial_ms) / 1e3
    if saved_s > 0:
        break_even: int | None = max(0, math.ceil(extra / saved_s)) if extra > 0 else 0
    else:
        break_even = None
    net = saved_s * job_steps - extra
    return {"one_time_s": round(extra, 3), "break_even_steps": break_even, "job_steps": job_steps,
            "pays": break_even is not None and break_even <= job_steps, "net_s": round(net, 3)}


def loss_delta(base: dict[str, float], trial: dict[str, float]) -> dict[str, Any]:
    """The trial's loss against the baseline's over the steps both reached: ``{steps, max_abs, mean, identical}``
    (``identical``: every one equal)."""
    common = sorted(set(base) & set(trial), key=int)
    if not common:
        return {"steps": 0, "max_abs": None, "mean": None, "identical": None}
    deltas = [trial[s] - base[s] for s in common]
    return {"steps": len(common), "max_abs": max(abs(d) for d in deltas), "mean": sum(deltas) / len(deltas),
            "identical": all(d == 0 for d in deltas)}


def measure(bases: list[dict[str, Any]], trial: dict[str, Any], job_steps: int | None = None) -> dict[str, Any]:
    """A trial's figures against the baseline's blocks (each run of the baseline, in order): all are
    ``{report, losses}`` (a run report and the per-step losses); the losses are the first block's. ``job_steps``:
    the job's length in optimizer steps (None: the trial's own), which a one-time cost is held against."""
    throughput = (trial["report"].get("throughput") or {})
    blocks = [steady_steps_ms(base["report"]) for base in bases]
    pooled = [ms for block in blocks for ms in block]
    figures = speedup(pooled, steady_steps_ms(trial["report"]), blocks=blocks)
    length = job_steps or int(trial["report"].get("steps") or 0)
    return {**figures, **payback([base["report"] for base in bases], trial["report"], figures, length),
            "samples_per_s": throughput.get("samples_per_s"), "tokens_per_s": throughput.get("tokens_per_s"),
            "loss_delta": loss_delta(bases[0]["losses"], trial["losses"])}


def measured_losses(trials: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The verdicts whose fix ``perfhooks tune`` measured as a loss: ``{diagnosis id: {knob, speedup, interval}}``
    for each measured trial slower than the baseline (the whole interval below 1, or under 1 where none was
    taken), by the verdicts that named its knob."""
    out: dict[str, dict[str, Any]] = {}
    for trial in trials:
        ratio, interval = trial.get("speedup"), trial.get("interval")
        if trial.get("status") != "measured" or ratio is None:
            continue
        if (interval[1] if interval else ratio) >= 1.0:
            continue
        for name in trial.get("named_by") or []:
            out[name] = {"knob": trial["knob"], "speedup": ratio, "interval": interval}
    return out


def mark_losses(report: dict[str, Any], losses: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``report`` with ``tune`` on each verdict whose fix was measured as a loss (``{knob, speedup, interval,
    loss: True}``), the evidence saying so."""
    for diagnosis in report.get("diagnoses") or []:
        loss = losses.get(diagnosis.get("id"))
        if loss is not None:
            diagnosis["tune"] = {**loss, "loss": True}
            diagnosis["evidence"] = (f"{diagnosis.get('evidence')}; perfhooks tune measured its fix "
                                     f"({loss['knob']}) as a loss: {loss['speedup']:.2f}x")
    return report


def format_table(result: dict[str, Any]) -> str:
    """The trials ranked by measured speedup (best first), the change to make for each, and the skipped knobs."""
    lines = []
    base = result.get("baseline") or {}
    if base.get("step_ms") is not None:
        low, high = base.get("p50_interval") or (base["p50_ms"], base["p50_ms"])
        lines.append(f"baseline: steady step {base['step_ms']:.2f} ms mean, {base['p50_ms']:.2f} ms p50 [{low:.2f}, "
                     f"{high:.2f}], over {base['steps']} steps"
                     + (f"; stopped by {base['stopped']}" if base.get("stopped") else ""))
        blocks = [block for block in base.get("blocks") or [] if block.get("step_ms") is not None]
        if len(blocks) > 1:
            lines.append(f"baseline again after the trials: {blocks[-1]['step_ms']:.2f} ms mean "
                         f"({100 * base.get('drift', 0.0):+.0f}%); each interval spans both")
    lines.append(f"{'change':<28}{'speedup':>9}  {'95% interval':<17}{'loss diff':>14}  what to change")
    notes = []
    for trial in ranked(result.get("trials") or []):
        if trial.get("status") != "measured":
            lines.append(f"{trial['knob']:<28}{'-':>9}  {'':<17}{'':>14}  {trial.get('status')}: "
                         f"{trial.get('error', '')}".rstrip())
            continue
        low, high = trial["interval"] or (None, None)
        interval = f"[{low:.2f}, {high:.2f}]" if low is not None else "n/a"
        mark = "*" if trial.get("flags") else ""
        per = " (per evaluation, not per step)" if trial.get("measured_on") else ""
        lines.append(f"{trial['knob'] + mark:<28}{trial['speedup']:>8.2f}x  {interval:<17}{_loss(trial):>14}  "
                     f"{trial['change']}{per}{_pays(trial)}")
        notes += [f"* {trial['knob']}: {flag['text']}" for flag in trial.get("flags") or []]
    for skip in result.get("skipped") or []:
        lines.append(f"{skip['knob']:<28}{'skipped':>9}  {skip['reason']}")
    for trial in result.get("trials") or []:
        if trial.get("status") == "measured" and _loss(trial).endswith("!"):
            notes.append(f"! {trial['knob']}: the loss moved (max {trial['loss_delta']['max_abs']:.2g}) where this "
                         "change should leave it identical: something in the data path differs with worker "
                         "processes (random draws in the dataset, its transforms or its collate; per-worker "
                         "state). Compare a few batches with num_workers=0 and with workers")
    for name, loss in measured_losses(result.get("trials") or []).items():
        notes.append(f"! {name}: its fix ({loss['knob']}) measured as a loss here ({loss['speedup']:.2f}x): do not "
                     "apply it on this machine")
    untried_ = result.get("untried") or []
    if untried_:
        notes.append("not tried (no knob of tune's answers them; the baseline's own diagnoses, largest gain first):")
        notes += [f"  {d['id']} (at most {100 * (d['estimated_gain'] or 0):.0f}% of the "
                  f"{'run' if d.get('gain_basis') == 'run' else 'step'}): {d['recommendation']}" for d in untried_]
    return "\n".join(lines + notes)


def ranked(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured trials that pay back within the job by speedup, best first; then those that do not (a steady gain
    whose one-time cost the job is too short to repay); the others after them."""
    return sorted(trials, key=lambda t: (t.get("status") != "measured", t.get("pays") is False,
                                         -(t.get("speedup") or 0.0)))


def _pays(trial: dict[str, Any]) -> str:
    """The one-time cost and its break-even, where the change has one (over 0.05 s)."""
    one_time, job = trial.get("one_time_s"), trial.get("job_steps")
    if one_time is None or one_time < 0.05:
        return ""
    said = f"; once {one_time:.1f} s"
    if trial.get("break_even_steps") is None:
        return said + f", never repaid (the steady step is not faster): a loss of {-(trial.get('net_s') or 0):.1f} s"
    if trial.get("pays"):
        return said + f", repaid after {trial['break_even_steps']} steps (the job: {job})"
    return said + (f", repaid only after {trial['break_even_steps']} steps: NOT within the job's {job} steps "
                   f"(a loss of {-(trial.get('net_s') or 0):.1f} s)")


def _loss(trial: dict[str, Any]) -> str:
    delta = trial.get("loss_delta") or {}
    if delta.get("identical"):
        return "identical"
    if delta.get("max_abs") is None:
        return "n/a"
    text = f"max {delta['max_abs']:.2g}"
    return text + ("!" if trial.get("keeps_numerics") else "")
