"""``perfhooks tune``'s plan and verdicts, without torch: which knobs to try on a script (from the baseline trial's
facts and diagnoses), and what each trial measured against the baseline.

- **Knobs** (:data:`KNOBS`): DataLoader workers (with ``persistent_workers``, and ``pin_memory`` on an
  accelerator), TF32 matmuls, bf16 autocast, ``torch.compile`` and SDPA attention, each set at the framework's own
  seam (:mod:`perfhooks.integrations.trials`). One that does not apply to the run, or that the framework has no
  setting for, is skipped with its reason.
- **Speedup**: the baseline's mean steady step over the trial's (what throughput gains: a loader with workers
  makes some steps wait and others not, and the median alone would flatter it), with a 95% bootstrap interval of
  that ratio (both runs' steady steps resampled, 2,000 times, a fixed seed); each side's median (p50) is given
  beside it. Steady steps are the report's per-step series after the warm-up
  (:data:`perfhooks.offline.gate.WARMUP_STEPS`), perfhooks' own steps left out.
- **Loss**: the trial's loss minus the baseline's at each step both reached; DataLoader knobs should leave it
  identical (``numerics: "unchanged"``), the others change numerics and report the difference.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any

from perfhooks.offline.gate import COVERAGE, RESAMPLES, steady_steps_ms


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
)
KNOB_NAMES = tuple(k.name for k in KNOBS)


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
        setting, reason = _setting(knob.name, framework, facts, accelerator, cores)
        if reason:
            skipped.append({"knob": knob.name, "reason": reason})
            continue
        named = [d for d in diagnoses if d in knob.named_by]
        trials.append({"knob": knob.name, "title": knob.title, "knobs": setting[0], "change": setting[1],
                       "named_by": named, "keeps_numerics": knob.keeps_numerics})
    trials.sort(key=lambda t: not t["named_by"])
    return trials, skipped


def _setting(name: str, framework: str | None, facts: dict[str, Any], accelerator: bool, cores: int
             ) -> tuple[tuple[dict[str, Any], str], str | None]:
    """``((knobs, the change to make in the user's code), None)``, or ``(_, why it is skipped)``."""
    none: tuple[dict[str, Any], str] = ({}, "")
    if framework not in ("lightning", "transformers", "accelerate"):
        return none, "no Lightning Trainer, transformers Trainer or Accelerator was built by the script"
    if name == "dataloader_workers":
        return _workers(framework, facts, accelerator, cores)
    if name == "tf32":
        if not accelerator:
            return none, "TF32 is a matmul mode of NVIDIA GPUs (Ampere and later); on CPU it changes nothing"
        return ({"tf32": True}, 'torch.set_float32_matmul_precision("high") at the top of the script'), None
    if name == "bf16":
        if str(facts.get("precision") or "") not in ("32-true", "32", "fp32", "no", "None"):
            return none, f"the run already uses {facts.get('precision')} precision"
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
        return none, (f"{shown} has no attention switch; use torch.nn.functional.scaled_dot_product_attention "
                      "in the model's attention")
    implementation = facts.get("attn_implementation")
    if implementation != "eager":
        return none, f"the model's attention is {implementation!r}, not eager"
    return ({"sdpa": True}, 'attn_implementation="sdpa" where the model is built (from_pretrained or the config), '
                            'or model.set_attn_implementation("sdpa")'), None


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
def speedup(base_ms: list[float], trial_ms: list[float], seed: int = 0) -> dict[str, Any]:
    """``{speedup, interval, base_ms, trial_ms, base_p50_ms, trial_p50_ms, steps}``: the baseline's mean steady
    step over the trial's, and the 95% bootstrap interval of that ratio."""
    if not base_ms or not trial_ms:
        return {"speedup": None, "interval": None, "steps": [len(base_ms), len(trial_ms)]}
    rng = random.Random(seed)
    ratios = sorted(statistics.fmean(rng.choices(base_ms, k=len(base_ms)))
                    / statistics.fmean(rng.choices(trial_ms, k=len(trial_ms))) for _ in range(RESAMPLES))
    tail = (1 - COVERAGE) / 2
    base, trial = statistics.fmean(base_ms), statistics.fmean(trial_ms)
    return {"speedup": round(base / trial, 4), "interval": [round(ratios[int(tail * (RESAMPLES - 1))], 4),
                                                           round(ratios[int((1 - tail) * (RESAMPLES - 1))], 4)],
            "base_ms": round(base, 4), "trial_ms": round(trial, 4),
            "base_p50_ms": round(statistics.median(base_ms), 4), "trial_p50_ms": round(statistics.median(trial_ms), 4),
            "steps": [len(base_ms), len(trial_ms)]}


def loss_delta(base: dict[str, float], trial: dict[str, float]) -> dict[str, Any]:
    """The trial's loss against the baseline's over the steps both reached: ``{steps, max_abs, mean, identical}``
    (``identical``: every one equal)."""
    common = sorted(set(base) & set(trial), key=int)
    if not common:
        return {"steps": 0, "max_abs": None, "mean": None, "identical": None}
    deltas = [trial[s] - base[s] for s in common]
    return {"steps": len(common), "max_abs": max(abs(d) for d in deltas), "mean": sum(deltas) / len(deltas),
            "identical": all(d == 0 for d in deltas)}


def measure(base: dict[str, Any], trial: dict[str, Any]) -> dict[str, Any]:
    """A trial's figures against the baseline's: both are ``{report, losses}`` (a run report and the per-step
    losses)."""
    throughput = (trial["report"].get("throughput") or {})
    return {**speedup(steady_steps_ms(base["report"]), steady_steps_ms(trial["report"])),
            "samples_per_s": throughput.get("samples_per_s"), "tokens_per_s": throughput.get("tokens_per_s"),
            "loss_delta": loss_delta(base["losses"], trial["losses"])}


def format_table(result: dict[str, Any]) -> str:
    """The trials ranked by measured speedup (best first), the change to make for each, and the skipped knobs."""
    lines = []
    base = result.get("baseline") or {}
    if base.get("step_ms") is not None:
        low, high = base.get("p50_interval") or (base["p50_ms"], base["p50_ms"])
        lines.append(f"baseline: steady step {base['step_ms']:.2f} ms mean, {base['p50_ms']:.2f} ms p50 [{low:.2f}, "
                     f"{high:.2f}], over {base['steps']} steps"
                     + (f"; stopped by {base['stopped']}" if base.get("stopped") else ""))
    lines.append(f"{'change':<28}{'speedup':>9}  {'95% interval':<17}{'loss diff':>14}  what to change")
    for trial in ranked(result.get("trials") or []):
        if trial.get("status") != "measured":
            lines.append(f"{trial['knob']:<28}{'-':>9}  {'':<17}{'':>14}  {trial.get('status')}: "
                         f"{trial.get('error', '')}".rstrip())
            continue
        low, high = trial["interval"] or (None, None)
        interval = f"[{low:.2f}, {high:.2f}]" if low is not None else "n/a"
        lines.append(f"{trial['knob']:<28}{trial['speedup']:>8.2f}x  {interval:<17}{_loss(trial):>14}  "
                     f"{trial['change']}")
    for skip in result.get("skipped") or []:
        lines.append(f"{skip['knob']:<28}{'skipped':>9}  {skip['reason']}")
    return "\n".join(lines)


def ranked(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measured trials by speedup, best first; the others after them."""
    return sorted(trials, key=lambda t: (t.get("status") != "measured", -(t.get("speedup") or 0.0)))


def _loss(trial: dict[str, Any]) -> str:
    delta = trial.get("loss_delta") or {}
    if delta.get("identical"):
        return "identical"
    if delta.get("max_abs") is None:
        return "n/a"
    text = f"max {delta['max_abs']:.2g}"
    return text + ("!" if trial.get("keeps_numerics") else "")
