"""torch.compile inside the run: a compilation pauses the open phase and is timed as the ``compiling`` aside.

Dynamo's callbacks (:class:`~perfhooks.runtime.compile_watch.CompileWatch`) call :meth:`CompileTracking.started`
and :meth:`CompileTracking.ended` around each compilation; only those on the training thread count (the engine
is not thread-safe). The phase a compilation interrupted resumes when it ends.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from perfhooks.events import COMPILING
from perfhooks.faults import FaultLog
from perfhooks.runtime.compile_watch import CompileWatch
from perfhooks.runtime.tracker import StepTracker

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
            tracker.begin_aside(COMPILING)
        except Exception as error:
            self.faults.report("compile", error)

    def ended(self, _args: Any) -> None:
        try:
            tracker = self.tracker
            if tracker.closed or threading.get_ident() != self.thread or tracker.account.innermost != COMPILING:
                return
            tracker.end_aside(COMPILING)
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
