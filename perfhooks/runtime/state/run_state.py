"""One published state of the run: what every thread other than the training thread reads.

At each step boundary the training thread builds a :class:`RunState` and swaps it in with one assignment
(:meth:`perfhooks.runtime.engine.Engine.publish`). The report, the background writer, W&B and any watcher read
the latest state and never the live objects: nothing in a state is mutated after it is published (the dicts it
holds are built for it, and readers copy what they change). A state is a ``NamedTuple``: a few hundred
nanoseconds to build, so publishing costs the training thread next to nothing.

The per-step fields (step, phase, statistics) are fresh at every publication; the report's slower parts
(:class:`ReportParts`: memory, compile counts, the run account, faults, windows) are taken at a *full*
publication (a window's end, the close) and carried forward in between.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from perfhooks.report.statistics import StatsSnapshot
from perfhooks.rules.memory import MemoryFigures
from perfhooks.rules.verdicts import Diagnosis


class TraceVerdicts(NamedTuple):
    """The latest analysed window's verdicts and how many steps it held, swapped in as one value (the writer
    thread sets it; a reader never sees one without the other)."""

    diagnoses: tuple[Diagnosis, ...] = ()
    window_steps: int | None = None


class RunFacts(NamedTuple):
    """What does not change during a run."""

    framework: str
    rank: int
    world_size: int
    #: ``{type, name, ...}`` of the device (``DeviceRoom.describe``).
    device: dict[str, Any]
    run_id: str
    #: ``time.time()`` when the engine started (s).
    started_at: float
    #: The price of a device-hour (the ``device_hour_cost`` setting), or None.
    device_hour_cost: float | None = None
    #: The framework's installed version (``transformers`` 5.24.0), for fixes spelled as it takes them.
    framework_version: str | None = None


class ReportParts(NamedTuple):
    """The report's slower-changing parts, taken on the training thread at a full publication."""

    #: The report's ``run`` section (s), or None before the first step.
    run: dict[str, Any] | None = None
    #: Largest named host work, ms per step.
    named_work: dict[str, float] | None = None
    #: The report's ``compile`` section, or None when dynamo never loaded.
    compile: dict[str, Any] | None = None
    compiled_in_run: bool = False
    #: The report's ``memory`` section and what the memory verdicts read (None when memory is off).
    memory: dict[str, Any] | None = None
    memory_figures: MemoryFigures | None = None
    #: FLOPs per step and their source (``{"per_step", "source"}`` or ``{"missing"}``), the matmul dtype and its
    #: source, the device's peak for it, and where the token count came from.
    flops: dict[str, Any] | None = None
    matmul_dtype: tuple[str, str] = ("fp32", "no mixed precision setting seen")
    device_peak: tuple[float, str] | None = None
    token_source: str | None = None
    faults: tuple[dict[str, Any], ...] = ()
    error: dict[str, Any] | None = None
    unfinished_steps: int = 0
    #: The capture windows' records, and the latest analysed window's verdicts.
    windows: tuple[dict[str, Any], ...] = ()
    trace: TraceVerdicts = TraceVerdicts()
    #: On-demand windows every rank agreed on that the run ended before recording.
    missed_windows: tuple[dict[str, int], ...] = ()
    #: The report's ``overhead`` section: the budget, the detailed and light steps, perfhooks' own cost.
    overhead: dict[str, Any] | None = None
    #: The framework's setting that already batches samples of similar length, as the user wrote it
    #: (``TrainingArguments(group_by_length=True)``), or None.
    length_grouped: str | None = None
    #: The settings audit's latest read (``report.json``'s ``settings``), or None.
    settings: dict[str, Any] | None = None
    #: Why the run's forward was never seen (the plain loop was given a module the loop does not call), or None.
    module_not_called: str | None = None
    #: The recipe the framework's objects hold (``report.json``'s ``recipe``; :mod:`perfhooks.integrations.recipe`),
    #: with what the engine counted (micro-batches a step and their samples), or None.
    recipe: dict[str, Any] | None = None


class RunState(NamedTuple):
    """The run at one step boundary."""

    #: perfhooks' optimizer steps so far, and the framework's own counter.
    step: int
    global_step: int
    #: ``running``, ``completed``, ``failed`` or ``terminated`` (a signal).
    status: str
    #: The phase open at publication (None between steps) and ``time.monotonic()`` when it started (s).
    phase: str | None
    phase_since_s: float | None
    #: ``time.monotonic()`` at publication (s).
    published_s: float
    #: The resolved steps' statistics.
    stats: StatsSnapshot
    parts: ReportParts
    #: The signal that ended the run (``SIGTERM``), once one arrived (a run that went on to complete survived it).
    signal: str | None = None
    #: What perfhooks costs the steps so far, a share of their time: ``overhead.measured.share`` once resolved, else
    #: its own time on the training thread (``overhead.share_of_run``); fresh at each publication.
    own_share: float = 0.0

    def with_parts(self, **changes: Any) -> RunState:
        """This state with some of its report parts replaced (a new state; this one is unchanged)."""
        return self._replace(parts=self.parts._replace(**changes))
