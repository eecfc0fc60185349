"""Where a window's trace and the run's live statistics judge the same thing, the larger evidence decides.

A capture window sees a few steps (3 by default); the live statistics see every steady step of the run. A trace
verdict the live figures can check (``dataloader_bound``: the data wait) stands only when the live statistics,
over more steps than the window, agree; with fewer live steps than the window's, it stands and says how few
steps it rests on.
"""

from __future__ import annotations

from typing import Any

#: Trace verdicts the live statistics also decide.
CHECKED_LIVE = frozenset({"dataloader_bound"})


def reconcile(live: list[dict[str, Any]], trace: list[dict[str, Any]], live_steps: int,
              window_steps: int | None) -> list[dict[str, Any]]:
    """``live`` plus the ``trace`` verdicts that the live evidence does not contradict.

    ``live_steps``: steady steps behind the live verdicts; ``window_steps``: steps in the analysed window.
    """
    live_ids = {diagnosis["id"] for diagnosis in live}
    kept: list[dict[str, Any]] = []
    for diagnosis in trace:
        checked = diagnosis["id"] in CHECKED_LIVE
        if checked and diagnosis["id"] not in live_ids and window_steps and live_steps > window_steps:
            continue  # the run's many steps say otherwise
        if checked and window_steps and live_steps <= window_steps:
            diagnosis = {**diagnosis, "evidence": f"{diagnosis['evidence']} (seen in a {window_steps}-step "
                                                  "window; the run has too few steps to confirm it)"}
        kept.append(diagnosis)
    return live + kept
