"""Rules across ranks: the straggler, by collective wait or by the phase outside backward."""

from __future__ import annotations

import statistics
from typing import Any

from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import make, pct

#: Verdicts only the ranks together can give: rank 0's printed table carries them beside its own.
CROSS_RANK = frozenset({"straggler", "stalled"})


def _straggler_fix(slowest: int) -> str:
    return (f"Every rank waits for rank {slowest} at each collective: check its data shard and loader, host load "
            "(other processes, CPU affinity), GPU clocks and thermals.")


def _apart(values: dict[int, float], smallest: bool) -> tuple[int, float, float]:
    """The rank with the smallest (or largest) value, that value, and the median of the other ranks'."""
    chosen, value = (min if smallest else max)(values.items(), key=lambda item: item[1])
    return chosen, value, statistics.median(v for r, v in values.items() if r != chosen)


def _straggler(slowest: int, excess_ms: float, step_ms: float, t: Thresholds, rule: str, evidence: str
               ) -> list[dict[str, Any]]:
    """The ``straggler`` verdict when the others lose ``excess_ms`` of the straggler's ``step_ms`` step waiting
    (at least ``straggler_spread`` of it); ``evidence`` has ``{share}`` and ``{step}`` left to fill."""
    if step_ms <= 0 or excess_ms / step_ms < t.straggler_spread:
        return []
    share = excess_ms / step_ms
    return [make(
        "straggler", "warning", f"Rank {slowest} is slower than the others",
        evidence.format(share=pct(share), step=f"{step_ms:.1f} ms")
        + f"; threshold {pct(t.straggler_spread)} of step time",
        share, _straggler_fix(slowest), slowest_rank=slowest, excess_ms=round(excess_ms, 3), rule=rule)]


def diagnose_stragglers(summaries: list[dict[str, Any]], t: Thresholds = Thresholds()) -> list[dict[str, Any]]:
    """The rank the others wait for, from the ranks' summaries (:func:`perfhooks.report.merge.rank_summary`).

    Every rank of a synchronised run (DDP, FSDP 1 and 2, ZeRO, tensor parallel) ends its step together: the
    others wait for the slow one inside their collectives. So the rule, in order of the evidence present:

    1. **collective wait** (any parallelism; what HTA's straggler analysis reads): with every rank's time in
       collectives per step from an analysed window, the straggler is the rank that spends the *least* time
       in them; its lead over the median of the others is what they lose waiting.
    2. **time outside backward** (DDP only, where the wait is the gradient all-reduce in backward): with
       perfhooks' phases and no window figures, the rank with the most time outside backward, less the named
       waits for the other ranks it spent there (``rank_wait_ms``).
    3. **step time** (ranks that do not synchronise): the slowest rank against the median.
    """
    ranked = [s for s in summaries if (s.get("step_ms") or {}).get("mean")]
    if len(ranked) < 2:
        return []
    step_of = {s["rank"]: s["step_ms"]["mean"] for s in ranked}
    collectives = {s["rank"]: s.get("collective_ms_per_step") for s in ranked}
    if all(value is not None for value in collectives.values()) and max(collectives.values()) > 0:
        slowest, least, others = _apart(collectives, smallest=True)
        excess = others - least
        return _straggler(slowest, excess, step_of[slowest], t, "collective_wait",
                          f"rank {slowest} spends {least:.1f} ms per step in collectives vs {others:.1f} ms on the "
                          f"others: they wait {excess:.1f} ms ({{share}} of its {{step}} step) for it. Rule: the rank "
                          f"that waits least in collectives (any parallelism)")
    backward = {s["rank"]: (s.get("phases_ms") or {}).get("backward", 0) for s in ranked}
    if all(value > 0 for value in backward.values()):
        # a rank's named waits for the others (transformers' gather of the token count) are not its own work
        waits = {s["rank"]: s.get("rank_wait_ms") or 0.0 for s in ranked}
        outside = {r: max(0.0, step_of[r] - backward[r] - waits[r]) for r in step_of}
        slowest, worst, median = _apart(outside, smallest=False)
        excess = worst - median
        return _straggler(slowest, excess, step_of[slowest], t, "outside_backward",
                          f"rank {slowest} spends {worst:.1f} ms per step outside backward vs {median:.1f} ms on the "
                          f"others (+{excess:.1f} ms, {{share}} of its {{step}} step); the other ranks wait that long "
                          f"in the gradient all-reduce or a named gather. Rule: time outside backward, less named "
                          f"waits for other ranks (DDP; no window's collective times to read)")
    median = statistics.median(step_of.values())
    slowest, worst = max(step_of.items(), key=lambda item: item[1])
    spread = (worst - median) / median if median else 0.0
    if spread < t.straggler_spread:
        return []
    return [make(
        "straggler", "warning", f"Rank {slowest} is slower than the others",
        f"rank {slowest} steps take {worst:.1f} ms vs a median of {median:.1f} ms (+{pct(spread)}). Rule: step "
        f"time (no phase or collective figures); threshold +{pct(t.straggler_spread)}",
        (worst - median) / worst, _straggler_fix(slowest), slowest_rank=slowest, spread=spread, rule="step_time")]
