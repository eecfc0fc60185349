"""A run that stopped moving: a phase that lasted longer than the stall bound (the live watch's records)."""

from __future__ import annotations

from typing import Any

from perfhooks.rules.verdicts import Diagnosis, make


def diagnose_stalls(stalls: list[dict[str, Any]]) -> list[Diagnosis]:
    """``stalled`` for the longest stall: the rank, the phase, how long, and where in the code (the innermost
    frame of the training thread's stack, which the record lists innermost last)."""
    if not stalls:
        return []
    longest = max(stalls, key=lambda stall: stall.get("seconds") or 0.0)
    where = f" at {longest['stack'][-1]}" if longest.get("stack") else ""
    state = "ended after" if longest.get("ended") else "still going after"
    others = f"; {len(stalls) - 1} other stall(s) in the report's stalls" if len(stalls) > 1 else ""
    return [make(
        "stalled", "critical", f"Rank {longest['rank']} stalled in {longest['phase']}",
        f"rank {longest['rank']} spent {longest['seconds']:.0f} s in {longest['phase']} at step {longest['step']} "
        f"({state} {longest['seconds']:.0f} s; device queue: {longest.get('device', 'unknown')}){where}{others}",
        0.0,
        "Read the stack: a loader stuck in __getitem__ (a network file system, a lock), a collective waiting for a "
        "rank that is elsewhere (its own stall says where), or a host sync on a hung kernel. Every thread's stack "
        "is in the file the stall names (threads_file).",
        seconds=longest["seconds"], rank=longest["rank"], phase=longest["phase"])]
