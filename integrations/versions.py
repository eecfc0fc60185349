"""The framework versions each integration was tested on, in one place: the integrations reach into framework
internals (private methods wrapped on instances, loop state, transformers' ``_get_num_items_in_batch``, the
profiler's ``_prev_schedule_action``), and each such reach is guarded by a ``getattr``/``hasattr`` check at its
use. A version outside these ranges is not refused: the run is profiled, and says once that it was not tested.
``perfhooks run`` reads the same table.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

#: distribution -> ((major, minor) oldest, (major, minor) newest) tested, inclusive.
TESTED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "lightning": ((2, 2), (2, 6)),
    "transformers": ((4, 46), (5, 24)),
    "accelerate": ((1, 0), (1, 15)),
    "torch": ((2, 4), (2, 13)),
}


def untested(distribution: str) -> str | None:
    """A one-line note when the installed ``distribution`` is outside its tested range, else None (in range, not
    installed, or a version with no major.minor)."""
    low, high = TESTED[distribution]
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if len(parts) != 2 or low <= parts <= high:
        return None
    return (f"{distribution} {version} was not tested with perfhooks (tested {low[0]}.{low[1]} to "
            f"{high[0]}.{high[1]}); profiling it anyway: a changed internal is skipped with a warning")


def note_versions(engine: Any, framework: str) -> None:
    """Say once, through the run's engine, which of ``framework`` and torch are outside their tested ranges."""
    once = getattr(engine, "once", None)
    if once is None:
        return
    for distribution in (framework, "torch"):
        note = untested(distribution)
        if note is not None:
            once.warn(f"untested_{distribution}", note)
