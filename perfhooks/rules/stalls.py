"""A run that stopped moving: a phase that lasted longer than the stall bound (the live watch's records)."""

from __future__ import annotations

from typing import Any

from perfhooks.rules.verdicts import Diagnosis, make

#: Phases whose wait is the rank's own (its data loader), never a wait for another rank.
OWN_WAITS = frozenset({"data_wait"})


def diagnose_stalls(stalls: list[dict[str, Any]]) -> list[Diagnosis]:
    """``stalled``: with one rank's stalls, the longest; with several ranks', the stuck one and what the others
    waited in meanwhile. The stuck rank is one stalled in ``data_wait`` if any (a wait for its own loader, never
    for another rank: the others then wait for it in their next collective), else the rank that stalled first;
    the phases of synchronised ranks start within milliseconds of each other, so start times alone can name the
    waiting rank on a busy host. The line is the innermost frame of the training thread's stack (records list
    it innermost last)."""
    if not stalls:
        return []
    ranks = {stall["rank"] for stall in stalls}
    if len(ranks) > 1 and all(stall.get("started_at") for stall in stalls):
        stuck = min(stalls, key=lambda stall: (stall["phase"] not in OWN_WAITS, stall["started_at"]))
        waited = sorted({(s["rank"], s["phase"]) for s in stalls if s["rank"] != stuck["rank"]})
        others = "; " + ", ".join(f"rank {rank} waited in {phase}" for rank, phase in waited)
    else:
        stuck = max(stalls, key=lambda stall: stall.get("seconds") or 0.0)
        others = f"; {len(stalls) - 1} other stall(s) in the report's stalls" if len(stalls) > 1 else ""
    where = f" at {stuck['stack'][-1]}" if stuck.get("stack") else ""
    state = "ended after" if stuck.get("ended") else "still going after"
    return [make(
        "stalled", "critical", f"Rank {stuck['rank']} stalled in {stuck['phase']}",
        f"rank {stuck['rank']} spent {stuck['seconds']:.0f} s in {stuck['phase']} at step {stuck['step']} "
        f"({state} {stuck['seconds']:.0f} s; device queue: {stuck.get('device', 'unknown')}){where}{others}",
        0.0,
        "Read the stack: a loader stuck in __getitem__ (a network file system, a lock), a collective waiting for a "
        "rank that is elsewhere (its own stall says where), or a host sync on a hung kernel. Every thread's stack "
        "is in the file the stall names (threads_file).",
        seconds=stuck["seconds"], rank=stuck["rank"], phase=stuck["phase"])]
