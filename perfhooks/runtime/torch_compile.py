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

Inside the run, a compilation pauses the open phase and is timed as the ``compiling`` aside.

Dynamo's callbacks (:class:`CompileWatch`) call :meth:`CompileTracking.started`
and :meth:`CompileTracking.ended` around each compilation; only those on the training thread count (the engine
is not thread-safe). The phase a compilation interrupted resumes when it ends.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from typing import Any

from perfhooks.events import COMPILING
from perfhooks.faults import FaultLog
from perfhooks.runtime.step.tracker import StepTracker

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


#: Steps listed in the report's ``compile.compiled_steps``.
MAX_COMPILED_STEPS = 50


def compiled_graphs() -> int:
    """Graphs torch.compile (dynamo) has compiled in this process; 0 when dynamo was never imported."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    try:
        return int(utils.counters["stats"]["unique_graphs"])
    except Exception:
        return 0


class CompileTracking:
    """Compile spans taken out of the steps, the steps that compiled, and dynamo's counts for this run."""

    def __init__(self, tracker: StepTracker, faults: FaultLog) -> None:
        self.tracker = tracker
        self.faults = faults
        self.thread = threading.get_ident()
        #: The steps in which torch.compile compiled.
        self.steps: list[int] = []
        #: A watched model is torch.compile'd: no dispatch mode is entered (FLOP counting skips).
        self.model_compiled = False
        self._graphs_at_start = compiled_graphs()
        self._resume: str | None = None
        self.watch = CompileWatch(self.started, self.ended)
        self.watch.maybe_install()

    def compiled_in_run(self) -> bool:
        """True when torch.compile compiled a graph in this process since this run started."""
        return compiled_graphs() > self._graphs_at_start

    def started(self, _args: Any) -> None:
        """Dynamo starts compiling (a frame, or a backward compiled lazily): the open phase pauses, and the time
        goes to the run account's ``compiling``."""
        try:
            tracker = self.tracker
            if tracker.closed or threading.get_ident() != self.thread:
                return
            self._resume = tracker.open_phase
            tracker.aside_start(COMPILING)
        except Exception as error:
            self.faults.report("compile", error)

    def ended(self, _args: Any) -> None:
        try:
            tracker = self.tracker
            if tracker.closed or threading.get_ident() != self.thread or tracker.account.innermost != COMPILING:
                return
            tracker.aside_end(COMPILING)
            if tracker.step_open:
                if tracker.record is not None:
                    tracker.record.compiled = True
                else:
                    tracker.light_compiled_now()
                if not self.steps or self.steps[-1] != tracker.step:
                    self.steps.append(tracker.step)
            resume, self._resume = self._resume, None
            if resume is not None and tracker.record is not None and tracker.account.depth == 0:
                tracker.phase_start(resume)
        except Exception as error:
            self.faults.report("compile", error)

    def section(self) -> dict[str, Any] | None:
        """The report's ``compile`` section: dynamo's counts for this run and the steps that compiled."""
        summary = self.watch.summary()
        if summary is None:
            return None
        summary["compiled_steps"] = list(self.steps[:MAX_COMPILED_STEPS])
        return summary

    def remove(self) -> None:
        self.watch.remove()
