"""``perfhooks diff BEFORE AFTER --gate PCT``: is AFTER a regression of BEFORE, beyond both runs' own noise?

- **Comparable** runs have the same framework, device name, world size (the device count), samples per step and
  matmul precision. Runs that differ are ``not_comparable`` (exit 2), with one reason per difference, unless
  ``force``.
- The steady step time of each run is the median of its steady steps (the report's per-step series, perfhooks'
  own steps and the first 3 left out), with a 95% bootstrap interval of that median (2,000 resamples, a fixed seed).
- ``regressed`` (exit 1): AFTER's median is more than PCT percent above BEFORE's and the two intervals do not
  overlap (the change is outside both runs' step-to-step noise). ``improved``: the same the other way. Else
  ``unchanged`` (exit 0). Throughput (samples, tokens per second) is reported beside it; with the same samples
  per step it moves with the step time.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from perfhooks.events import OTHER, PHASES

#: Exit statuses of a gated diff.
EXIT_OK, EXIT_REGRESSED, EXIT_NOT_COMPARABLE = 0, 1, 2
#: Steps at a series' start left out as warm-up.
WARMUP_STEPS = 3
#: Bootstrap resamples, and the interval's coverage.
RESAMPLES, COVERAGE = 2000, 0.95
#: Below this many steady steps, no interval is computed and no gate verdict is given but ``unchanged``.
MIN_STEPS = 10
#: Severities whose appearance the text names.
NAMED_SEVERITIES = ("critical", "warning")


def steady_steps_ms(report: dict[str, Any]) -> list[float]:
    """The steady steps' times (ms) from a run report's per-step series (empty for a trace's report)."""
    series = report.get("series") or {}
    phases = [series.get(name) for name in (*PHASES, OTHER)]
    if not all(isinstance(values, list) for values in phases) or not phases[0]:
        return []
    steps = [sum(values[i] for values in phases) for i in range(len(phases[0]))]  # type: ignore[index]
    return steady_values(series, steps)


def steady_values(series: dict[str, Any], values: list[float]) -> list[float]:
    """The values of a per-step series at the steady steps: after the warm-up, perfhooks' own steps left out."""
    own = series.get("perfhooks") or [0] * len(values)
    return [ms for i, ms in enumerate(values) if i >= WARMUP_STEPS and not (i < len(own) and own[i])]


def lower_quartile(values: list[float]) -> float:
    """The 25th percentile (inclusive method: between the sample's own values)."""
    return statistics.quantiles(values, n=4, method="inclusive")[0] if len(values) > 1 else values[0]


def bootstrap_interval(values: list[float], statistic: Any = statistics.median, seed: int = 0
                       ) -> tuple[float, float, float]:
    """``(statistic, low, high)``: the statistic of ``values`` and its bootstrap interval (:data:`COVERAGE`),
    reproducible."""
    rng = random.Random(seed)
    resampled = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(RESAMPLES))
    tail = (1 - COVERAGE) / 2
    return (statistic(values), resampled[int(tail * (RESAMPLES - 1))], resampled[int((1 - tail) * (RESAMPLES - 1))])


def median_interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """``(median, low, high)``: the median and its bootstrap interval."""
    return bootstrap_interval(values, statistics.median, seed)


def comparability(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """One line per way the two runs differ that makes their step times not comparable."""
    def facts(report: dict[str, Any]) -> dict[str, Any]:
        throughput = report.get("throughput") or {}
        device = report.get("device") or {}
        return {"framework": report.get("framework"), "device": device.get("name") or device.get("type"),
                "world size (devices)": report.get("world_size"),
                "samples per step": throughput.get("samples_per_step"),
                "precision": throughput.get("matmul_dtype")}

    b, a = facts(before), facts(after)
    return [f"{name}: {b[name]!r} before, {a[name]!r} after" for name in b if b[name] != a[name]]


def gate(before: dict[str, Any], after: dict[str, Any], percent: float, force: bool = False) -> dict[str, Any]:
    """The gate's verdict on two run reports: ``{verdict, exit, percent, reasons, step_ms, throughput,
    appeared, went_away, named}`` (see the module docstring)."""
    reasons = comparability(before, after)
    b_ids = {d["id"]: d for d in before.get("diagnoses") or []}
    a_ids = {d["id"]: d for d in after.get("diagnoses") or []}
    appeared = [i for i in a_ids if i not in b_ids]
    result: dict[str, Any] = {
        "percent": percent, "reasons": reasons, "forced": bool(force and reasons),
        "appeared": appeared, "went_away": [i for i in b_ids if i not in a_ids],
        "named": [i for i in appeared if a_ids[i].get("severity") in NAMED_SEVERITIES],
        "throughput": {key: {"before": (before.get("throughput") or {}).get(key),
                             "after": (after.get("throughput") or {}).get(key)}
                       for key in ("samples_per_s", "tokens_per_s")},
    }
    b_steps, a_steps = steady_steps_ms(before), steady_steps_ms(after)
    if len(b_steps) >= MIN_STEPS and len(a_steps) >= MIN_STEPS:
        b_q, b_low, b_high = bootstrap_interval(b_steps, lower_quartile)
        a_q, a_low, a_high = bootstrap_interval(a_steps, lower_quartile)
        result["step_ms"] = {"statistic": "p25", "before": b_q, "after": a_q,
                             "change": a_q / b_q - 1 if b_q else None,
                             "before_interval": [b_low, b_high], "after_interval": [a_low, a_high],
                             "median": [statistics.median(b_steps), statistics.median(a_steps)],
                             "steps": [len(b_steps), len(a_steps)]}
    else:
        result["step_ms"] = {"steps": [len(b_steps), len(a_steps)],
                             "missing": f"fewer than {MIN_STEPS} steady steps in a run's per-step series"}
    result["verdict"], result["exit"] = _verdict(result, reasons, force, percent)
    return result


def _verdict(result: dict[str, Any], reasons: list[str], force: bool, percent: float) -> tuple[str, int]:
    if reasons and not force:
        return "not_comparable", EXIT_NOT_COMPARABLE
    step = result["step_ms"]
    change = step.get("change")
    if change is None:
        return "unchanged", EXIT_OK
    (b_low, b_high), (a_low, a_high) = step["before_interval"], step["after_interval"]
    if change > percent / 100 and a_low > b_high:
        return "regressed", EXIT_REGRESSED
    if change < -percent / 100 and a_high < b_low:
        return "improved", EXIT_OK
    return "unchanged", EXIT_OK


def format_gate(result: dict[str, Any]) -> str:
    """The gate's lines for the text view."""
    verdict, step = result["verdict"], result["step_ms"]
    said = verdict
    if verdict == "unchanged":  # the JSON's word; in words: no change the gate can tell from noise
        change = step.get("change")
        if change is None:
            said = "within noise (no interval: too few steady steps)"
        elif abs(change) <= result["percent"] / 100:
            said = f"within noise ({change:+.1%} is inside the {result['percent']:g}% gate)"
        else:
            said = f"within noise ({change:+.1%}, but the two runs' 95% intervals overlap)"
    lines = [f"gate {result['percent']:g}%: {said}"]
    if result["reasons"]:
        lines.append(("  compared anyway (--force); " if result["forced"] else "  not comparable: ")
                     + "; ".join(result["reasons"]))
    if "change" in step:
        (b_low, b_high), (a_low, a_high) = step["before_interval"], step["after_interval"]
        b_median, a_median = step["median"]
        lines.append(f"  steady step p25 {step['before']:.2f} ms [{b_low:.2f}, {b_high:.2f}] -> {step['after']:.2f}"
                     f" ms [{a_low:.2f}, {a_high:.2f}] ({step['change']:+.1%}; 95% bootstrap intervals over "
                     f"{step['steps'][0]} and {step['steps'][1]} steady steps); median {b_median:.2f} -> "
                     f"{a_median:.2f} ms")
    else:
        lines.append(f"  {step['missing']}")
    if result["named"]:
        lines.append(f"  new verdicts at warning or above: {', '.join(result['named'])}")
    return "\n".join(lines)
