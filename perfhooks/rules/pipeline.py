"""The one rules pipeline: every source of verdicts merged in one place.

A run's verdicts come from five sources: the live phase statistics (:mod:`~perfhooks.rules.live`), torch.compile's
counters (:mod:`~perfhooks.rules.compile`), memory (:mod:`~perfhooks.rules.memory`), the latest analysed capture
window (:mod:`~perfhooks.rules.trace`) and the ranks together (:mod:`~perfhooks.rules.ranks`). :func:`merge_verdicts`
is the only place they meet:

1. a trace verdict the live figures also decide stands only when the live figures, over more steps than the
   window's, agree (:func:`reconcile`);
2. verdicts quoted from one rank of several name it (``rank``, the evidence prefixed, ``also_ranks``);
3. one entry per id (the larger estimated gain), largest gain first, severity breaking ties
   (:func:`~perfhooks.rules.verdicts.rank`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from perfhooks.rules.verdicts import Diagnosis, rank

#: Trace verdicts the live statistics also decide.
CHECKED_LIVE = frozenset({"dataloader_bound"})


def merge_verdicts(*, live: Iterable[Diagnosis] = (), compile: Iterable[Diagnosis] = (),
                   memory: Iterable[Diagnosis] = (), trace: Iterable[Diagnosis] = (),
                   ranks: Iterable[Diagnosis] = (), live_steps: int = 0, window_steps: int | None = None
                   ) -> list[Diagnosis]:
    """Every source's verdicts, reconciled, de-duplicated and ordered.

    ``live_steps``: steady steps behind the live verdicts; ``window_steps``: steps in the analysed window whose
    verdicts ``trace`` holds (None: no window was analysed).
    """
    local = [*live, *compile, *memory]
    return rank(reconcile(local, list(trace), live_steps, window_steps) + list(ranks))


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
