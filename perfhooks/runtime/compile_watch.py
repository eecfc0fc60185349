"""torch.compile as the run sees it: compile spans from dynamo's own callbacks, and what dynamo counted.

Every access to dynamo's state is here, each behind a check that it exists (torch 2.13 has all of them):

- ``torch._dynamo.callback.callback_handler``: ``register_start_callback``/``register_end_callback`` (and their
  ``remove_*``), called around every compilation (a frame, a lazily compiled backward);
- ``torch._dynamo.utils.guard_failures``: ``{code: [reason]}``, a reason each time compiled code's guards failed
  and it was compiled again (a recompile);
- ``torch._dynamo.utils.graph_break_reasons``: a ``GraphCompileReason`` per graph compiled, with ``graph_break``
  and the user's stack where it broke;
- ``torch._dynamo.utils.counters``: ``graph_break`` (reason -> count) and ``stats.unique_graphs``.

Nothing is imported: dynamo is looked for in ``sys.modules`` (a run that never compiles never loads it), and the
figures are this run's: differences from what dynamo held when the watch was installed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

#: Reasons and break sites kept in the report.
MAX_REASONS = 5


class CompileWatch:
    """Dynamo's compile callbacks, installed once dynamo is loaded, and this run's share of its counters."""

    def __init__(self, on_start: Callable[[Any], None], on_end: Callable[[Any], None]) -> None:
        self._on_start = on_start
        self._on_end = on_end
        self._handler: Any = None
        self._baseline: dict[str, Any] | None = None

    @property
    def installed(self) -> bool:
        return self._handler is not None

    def maybe_install(self) -> bool:
        """Install the callbacks if dynamo is loaded now (cheap when it is not, or when installed already)."""
        if self._handler is not None:
            return True
        module = sys.modules.get("torch._dynamo.callback")
        handler = getattr(module, "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            return False
        handler.register_start_callback(self._on_start)
        handler.register_end_callback(self._on_end)
        self._handler = handler
        self._baseline = _dynamo_state()
        return True

    def remove(self) -> None:
        handler, self._handler = self._handler, None
        if handler is None:
            return
        for remove, callback in ((getattr(handler, "remove_start_callback", None), self._on_start),
                                 (getattr(handler, "remove_end_callback", None), self._on_end)):
            if remove is not None:
                with contextlib.suppress(ValueError):  # dynamo's callbacks were cleared meanwhile
                    remove(callback)

    def summary(self) -> dict[str, Any] | None:
        """This run's graphs, graph breaks (reasons and where) and recompiles (reasons); None before dynamo."""
        if self._baseline is None:
            return None
        now, before = _dynamo_state(), self._baseline
        breaks = {reason: count - before["break_counts"].get(reason, 0)
                  for reason, count in now["break_counts"].items() if count > before["break_counts"].get(reason, 0)}
        start = before["break_sites_len"] if len(now["break_sites"]) >= before["break_sites_len"] else 0
        sites = now["break_sites"][start:]  # dynamo.reset() empties the list: then all of it is this run's
        recompiles = [reason for code, reasons in now["guard_failures"].items()
                      for reason in reasons[len(before["guard_failures"].get(code, ())):]]
        return {
            "graphs": max(0, now["unique_graphs"] - before["unique_graphs"]),
            "graph_breaks": {"count": sum(breaks.values()),
                             "reasons": [{"reason": reason, "count": count}
                                         for reason, count in sorted(breaks.items(), key=lambda item: -item[1])
                                         ][:MAX_REASONS],
                             "sites": _unique(sites)[:MAX_REASONS]},
            "recompiles": {"count": len(recompiles), "reasons": _unique(recompiles)[:MAX_REASONS]},
        }


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _dynamo_state() -> dict[str, Any]:
    utils = sys.modules.get("torch._dynamo.utils")
    state: dict[str, Any] = {"break_counts": {}, "break_sites": [], "break_sites_len": 0, "guard_failures": {},
                             "unique_graphs": 0}
    if utils is None:
        return state
    counters = getattr(utils, "counters", {})
    try:
        state["break_counts"] = {str(reason): int(count) for reason, count in dict(counters.get("graph_break", {})
                                                                                    ).items()}
        state["unique_graphs"] = int(counters.get("stats", {}).get("unique_graphs", 0))
    except Exception:
        pass
    sites = []
    for reason in list(getattr(utils, "graph_break_reasons", [])):
        if not getattr(reason, "graph_break", True):
            continue
        stack = getattr(reason, "user_stack", None) or []
        where = f"{stack[-1].filename}:{stack[-1].lineno}" if stack else "unknown location"
        sites.append(f"{where}: {getattr(reason, 'reason', '')}".strip())
    state["break_sites"] = sites
    state["break_sites_len"] = len(sites)
    state["guard_failures"] = {code: list(map(str, reasons))
                               for code, reasons in dict(getattr(utils, "guard_failures", {})).items()}
    return state
