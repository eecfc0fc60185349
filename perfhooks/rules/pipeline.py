"""The one rules pipeline: every source of verdicts merged in one place.

A run's verdicts come from five sources: the live phase statistics (:mod:`~perfhooks.rules.live`), torch.compile's
counters (:mod:`~perfhooks.rules.compile`), memory (:mod:`~perfhooks.rules.memory`), the latest analysed capture
window (:mod:`~perfhooks.rules.trace`) and the ranks together (:mod:`~perfhooks.rules.ranks`). :func:`merge_verdicts`
is the only place they meet:

1. a trace verdict the live figures also decide stands only when the live figures, over more steps than the
   window's, agree (:func:`reconcile`); a window whose steps ran slower than the run's steady step (the
   profiler's own cost) has its utilization restated against the steady step, or dropped when the steady step
   keeps the GPU busy enough (:func:`against_steady`);
2. verdicts quoted from one rank of several name it (``rank``, the evidence prefixed, ``also_ranks``);
3. one entry per id (the larger estimated gain), largest gain first, severity breaking ties
   (:func:`~perfhooks.rules.verdicts.rank`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from perfhooks.rules.live import loader_fix
from perfhooks.rules.thresholds import Thresholds
from perfhooks.rules.verdicts import Diagnosis, pct, rank

#: Trace verdicts the live statistics also decide.
CHECKED_LIVE = frozenset({"dataloader_bound"})
#: A window whose steps took this many times the run's steady step measured the profiler as well as the run.
WINDOW_SLOWER = 1.2


def merge_verdicts(*, live: Iterable[Diagnosis] = (), compile: Iterable[Diagnosis] = (),
                   memory: Iterable[Diagnosis] = (), trace: Iterable[Diagnosis] = (),
                   ranks: Iterable[Diagnosis] = (), live_steps: int = 0, window_steps: int | None = None,
                   steady_step_ms: float | None = None, thresholds: Thresholds | None = None) -> list[Diagnosis]:
    """Every source's verdicts, reconciled, de-duplicated and ordered.

    ``live_steps``: steady steps behind the live verdicts; ``window_steps``: steps in the analysed window whose
    verdicts ``trace`` holds (None: no window was analysed); ``steady_step_ms``: the run's steady step (p50, ms).
    """
    local = [*live, *compile, *memory]
    trace = against_steady(list(trace), steady_step_ms, thresholds or Thresholds())
    return rank(reconcile(local, trace, live_steps, window_steps) + list(ranks))


def against_steady(trace: list[Diagnosis], steady_step_ms: float | None, t: Thresholds) -> list[Diagnosis]:
    """The window's utilization verdict judged against the run's steady step when the window's steps ran at least
    :data:`WINDOW_SLOWER` times slower: the profiler slows the host, not the kernels, so the kernels' time per step
    (utilization x the window's step) over the steady step is what the run has. Restated (severity, gain, the
    ratio in the evidence) while still under the threshold; dropped when the steady step is busy enough."""
    if not steady_step_ms or steady_step_ms <= 0:
        return trace
    out: list[Diagnosis] = []
    for diagnosis in trace:
        measured = diagnosis.get("measured") or {}
        window_ms, utilization = measured.get("step_ms"), measured.get("gpu_utilization")
        if (diagnosis["id"] not in ("low_gpu_utilization", "host_bound") or not window_ms or utilization is None
                or window_ms < WINDOW_SLOWER * steady_step_ms):
            out.append(diagnosis)
            continue
        ratio, kernels_ms = window_ms / steady_step_ms, utilization * window_ms
        steady = min(1.0, kernels_ms / steady_step_ms)
        said = (f"; the window's steps took {ratio:.1f}x the run's steady step ({window_ms:.1f} ms against "
                f"{steady_step_ms:.1f} ms, the profiler's own cost), so against the steady step the kernels run "
                f"{kernels_ms:.1f} ms of {steady_step_ms:.1f} ms, {pct(steady)}")
        figures = {**measured, "gpu_utilization_steady": round(steady, 4), "window_over_steady": round(ratio, 3)}
        if diagnosis["id"] == "host_bound":
            # the GPU's idle time at the steady step, in the share the window found waiting on the host
            waiting = measured.get("host_wait_share_of_step", 0.0) / max(1e-9, 1 - utilization)
            gain = (1 - steady) * min(1.0, waiting)
            if gain < t.host_bound_share:
                continue
            out.append({**diagnosis, "estimated_gain": round(gain, 4), "evidence": diagnosis["evidence"] + said,
                        "measured": {**figures, "host_wait_share_steady": round(gain, 4)}})
            continue
        if steady >= t.gpu_utilization:
            continue  # the window's idle time was the profiler's: the steady run keeps the GPU busy enough
        out.append({**diagnosis, "severity": "critical" if steady < t.gpu_utilization / 2 else "warning",
                    "estimated_gain": round(1 - steady, 4), "evidence": diagnosis["evidence"] + said,
                    "measured": figures})
    return out


def reconcile(live: list[Diagnosis], trace: list[Diagnosis], live_steps: int,
              window_steps: int | None) -> list[Diagnosis]:
    """``live`` plus the ``trace`` verdicts that the live evidence does not contradict.

    A capture window sees a few steps (3 by default); the live statistics see every steady step of the run. A
    trace verdict the live figures can check (``dataloader_bound``: the data wait) stands only when the live
    statistics, over more steps than the window, agree; with fewer live steps than the window's, it stands and
    says how few steps it rests on.
    """
    live_ids = {diagnosis["id"] for diagnosis in live}
    kept: list[Diagnosis] = []
    for diagnosis in trace:
        checked = diagnosis["id"] in CHECKED_LIVE
        if checked and diagnosis["id"] not in live_ids and window_steps and live_steps > window_steps:
            continue  # the run's many steps say otherwise
        if checked and window_steps and live_steps <= window_steps:
            diagnosis = {**diagnosis, "evidence": f"{diagnosis['evidence']} (seen in a {window_steps}-step "  # type: ignore[typeddict-item]
                                                  "window; the run has too few steps to confirm it)"}
        kept.append(diagnosis)
    return live + kept


def name_ranks(per_rank: Sequence[tuple[int, Sequence[Diagnosis]]]) -> list[Diagnosis]:
    """Every rank's verdicts, each naming the rank whose figures it quotes (``rank``, and the evidence prefixed),
    and the other ranks where the same verdict fired (``also_ranks``): in a merged report a figure never reads as
    another rank's. ``per_rank``: ``(rank, its verdicts)``."""
    fired: dict[str, list[int]] = {}
    for rank_index, diagnoses in per_rank:
        for diagnosis in diagnoses:
            fired.setdefault(diagnosis["id"], []).append(rank_index)
    named: list[Diagnosis] = []
    for rank_index, diagnoses in per_rank:
        for diagnosis in diagnoses:
            named.append({**diagnosis, "rank": rank_index,  # type: ignore[typeddict-item]
                          "evidence": f"rank {rank_index}: {diagnosis['evidence']}",
                          "also_ranks": [r for r in fired[diagnosis["id"]] if r != rank_index]})
    return named


def with_cross_rank(local: Iterable[Diagnosis], merged: Iterable[Any], cross_ids: frozenset[str]) -> list[Diagnosis]:
    """A rank's own verdicts with those only the ranks together give (``cross_ids``, e.g. a straggler) taken from
    the run's merged verdicts ``merged``."""
    cross = [d for d in merged if d["id"] in cross_ids]
    replaced = {d["id"] for d in cross}  # the ranks' verdict stands for this rank's own of the same id
    return merge_verdicts(live=[d for d in local if d["id"] not in replaced], ranks=cross)


#: What a CPU in bf16 does to attention: PyTorch's CPU flash attention backward ran 1.5x slower in bf16 than the
#: hand-written attention in a user's study (going back to it saved 26% of the step).
CPU_BF16_ATTENTION = ("; on a CPU in bf16 the fused kernel is not sure to be faster: PyTorch's CPU flash attention "
                      "backward ran 1.5x slower in bf16 than attention written out by hand in a user's job, so no gain "
                      "is promised here: measure both")


def fitted_to_run(diagnoses: list[Diagnosis], *, framework: str | None, accelerator: bool, cpus: int | None,
                  device_type: str, matmul_dtype: str) -> list[Diagnosis]:
    """A window's verdicts restated with what the run knows and the trace does not: the loader fix fitted to the
    CPUs the process may use (the trace's rule knows none), and no gain promised for fused attention on a CPU that
    trains in bf16."""
    out: list[Diagnosis] = []
    for diagnosis in diagnoses:
        if diagnosis["id"] == "dataloader_bound" and cpus is not None:
            diagnosis = {**diagnosis, "recommendation": loader_fix(framework, accelerator, cpus)}  # type: ignore[typeddict-item]
        elif diagnosis["id"] == "unfused_attention" and device_type == "cpu" and matmul_dtype == "bf16":
            diagnosis = {**diagnosis, "severity": "info", "estimated_gain": 0.0,  # type: ignore[typeddict-item]
                         "evidence": diagnosis["evidence"] + CPU_BF16_ATTENTION}
        out.append(diagnosis)
    return rank(out)
