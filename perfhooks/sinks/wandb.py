"""Weights & Biases: ``perf/*`` metrics, the diagnoses table, traces and memory snapshots, in the user's run.

perfhooks logs into the run that already exists (the framework's, found by the integration, or
``wandb.run``) and never opens a second one. It opens a run only for ``wandb=True`` when none
exists, and then finishes it too. wandb is imported only once a run is in play: a user who never
imported it pays nothing.

Everything that talks to wandb runs on one background thread fed by a bounded queue; a full queue
drops jobs and counts them. The first error from wandb is reported once and turns the sink off:
local files go on being written and training goes on.

Step axis. With a framework step key (Lightning ``trainer/global_step``, HF ``train/global_step``)
each row carries that key, and ``perf/*`` is declared against it with ``define_metric``, so the
charts line up with the loss. Without one (accelerate, a bare ``wandb.run``) rows join the user's
current row (``commit=False``, so wandb's own step is never advanced under the user's explicit
``step=``) and carry ``perf/step``, the optimizer step, which ``perf/*`` is declared against.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfhooks.faults import FaultLog, Once
from perfhooks.files.writer import BackgroundWriter
from perfhooks.locks import holds_lock
from perfhooks.report.build import headline_metrics, interval_metrics
from perfhooks.timebase import monotonic

#: The step metric when the framework has none: the optimizer step (0-based count of steps done).
PERF_STEP = "perf/step"
#: Columns of the ``perf/diagnoses`` table.
DIAGNOSIS_COLUMNS = ("id", "severity", "title", "evidence", "estimated_gain", "recommendation", "step",
                     "device_hours")
#: Diagnoses whose id and gain go to the run summary.
SUMMARY_TOP = 3
#: A window's figures logged as ``perf/<name>`` (from its trace; CUDA only).
WINDOW_FIGURES = ("gpu_utilization", "sm_efficiency", "achieved_occupancy")
#: Window results kept while the run is not found yet (the latest).
MAX_PENDING_WINDOWS = 8
#: Seconds the W&B thread waits for the user's next row before a ``perf/*`` row joins the one it already joined.
JOIN_WAIT_S = 2.0


@dataclass(frozen=True)
class RunSource:
    """Where an integration's framework keeps its W&B run.

    Args:
        find: returns the framework's run or ``None`` (called on the training thread, until found).
        step_key: the framework's step metric, logged in each row of the run ``find`` returned
            (``None``, or a run found elsewhere: ``perf/step``).
        log_every: the framework's own logging cadence in steps (Lightning's ``log_every_n_steps``,
            transformers' ``logging_steps``), which ``perf/*`` rows follow unless ``wandb_log_every`` is set.
    """

    find: Callable[[], Any] | None = None
    step_key: str | None = None
    log_every: int | None = None


def current_run() -> Any | None:
    """``wandb.run`` if the user's code imported wandb and has a run; never imports wandb itself."""
    module = sys.modules.get("wandb")
    return getattr(module, "run", None) if module is not None else None


class WandbSink:
    """Logs one engine's figures into one W&B run; every public method is safe to call and never raises."""

    def __init__(self, *, source: RunSource, explicit_run: Any, open_if_missing: bool, queue: int,
                 output_dir: Path, faults: FaultLog, once: Once) -> None:
        self.source = source
        self.output_dir = output_dir
        self.faults = faults
        self.once = once
        self.run: Any = explicit_run
        self.owned = False
        self.step_key: str | None = None
        self.commit = True
        self.rows = 0
        #: The user's row (wandb's ``run.step``) the last ``perf/*`` row joined, with ``commit=False``.
        self._joined_step: int | None = None
        self.failed: str | None = None
        self._open_if_missing = open_if_missing
        #: Look for a run (False once the engine is abandoned: a run found then is the next one's)
        self._searching = True
        self._thread = BackgroundWriter(faults, capacity=queue, name="perfhooks-wandb")
        self._last_step = -1
        self._declared = False
        self._quiet: set[str] = set()  # perf/* keys declared with summary="none"
        #: Window results that came before the run was found (windows can end before the first row): logged,
        #: in order, on the training thread as soon as the run is found. At most MAX_PENDING_WINDOWS kept.
        self._pending_windows: deque[tuple[int, dict[str, Any], list[dict[str, Any]]]] = deque(
            maxlen=MAX_PENDING_WINDOWS)
        self._pending_lock = threading.Lock()
        if self.run is not None:
            self._adopt(self.run)

    # ------------------------------------------------------------------ training thread
    @holds_lock
    def keep_to_its_run(self) -> None:
        """The engine is abandoned (a new run started, or it was left open): it logs to the run it found, if any,
        and looks for none now: ``wandb.run`` may by then be the next fit's (its logger's run), which this
        engine's end must not write into."""
        self._searching = False

    def resolve(self) -> bool:
        """Find the run (framework's, then ``wandb.run``); with ``wandb=True`` open one at the end of the search."""
        if self.run is not None:
            return True
        if self.failed or not self._searching:
            return False
        try:
            run = self.source.find() if self.source.find is not None else None
            if run is not None:
                self.step_key = self.source.step_key  # the framework's own run: its step axis
            else:
                run = current_run()
            if run is None and self._open_if_missing:
                run = self._open_run()
        except Exception as error:
            self._fail("wandb_run", error)
            return False
        if run is None:
            return False
        with self._pending_lock:  # a window's results arriving now are either pending here or see the run
            self._adopt(run)
            pending = list(self._pending_windows)
            self._pending_windows.clear()
        for step, window, diagnoses in pending:
            self.log_window(step, window, diagnoses)
        return True

    def log_steps(self, step: int, timings: list[Any], memory: dict[str, Any] | None) -> None:
        """A ``perf/*`` row for the steps resolved since the last row; ``step`` is the count of steps done."""

        if not self.resolve():
            return
        fresh = [t for t in timings if t.step > self._last_step]
        if not fresh and not memory:
            return
        if fresh:
            self._last_step = fresh[-1].step
        row = interval_metrics(fresh, memory)
        self._submit("wandb_log", lambda: self._log_row(row, step, wait_for_user=True))

    def alert(self, title: str, text: str) -> None:
        """A W&B alert (``run.alert``), when a run is known: a stall (any thread; sent from the sink's queue)."""
        run = self.run
        if run is None or not callable(getattr(run, "alert", None)):
            return
        self._submit("wandb_alert", lambda: run.alert(title=title, text=text))

    @holds_lock
    def log_window(self, step: int, window: dict[str, Any], diagnoses: list[dict[str, Any]]) -> None:
        """After a window's analysis (any thread): its GPU figures, the diagnoses table and the trace artifact.
        Before the run is found (that lookup belongs to the training thread), they wait for it."""
        with self._pending_lock:
            if self.run is None:
                if not self.failed:
                    self._pending_windows.append((step, window, diagnoses))
                return
        metrics = window.get("metrics") or {}
        row = {f"perf/{key}": value for key, value in metrics.items() if key in WINDOW_FIGURES and value is not None}
        rows = [dict(d) for d in diagnoses]
        path = Path(window["path"])

        def job() -> None:
            self._log_row({**row, "perf/diagnoses": self._table(rows)}, step)
            self._log_files("perf-trace", [path], {"first_step": window.get("first_step"),
                                                    "last_step": window.get("last_step")},
                            aliases=[f"step{window.get('first_step')}"])

        self._submit("wandb_window", job)

    def log_diagnoses(self, step: int, diagnoses: list[dict[str, Any]]) -> None:
        """The diagnoses table alone (any thread): the run's first answer, before any window. Before the run is
        found, nothing is logged (the window's and the last table follow)."""
        with self._pending_lock:
            if self.run is None:
                return
        rows = [dict(d) for d in diagnoses]
        self._submit("wandb_diagnoses", lambda: self._log_row({"perf/diagnoses": self._table(rows)}, step))

    def close(self, step: int, report: dict[str, Any], timings: list[Any], memory_latest: dict[str, Any] | None,
              html: str, timeout_s: float = 30.0) -> None:
        """End of training: a last row, the diagnoses table, the summary, the HTML report and memory files;
        with a multi-rank ``report`` (a ``ranks`` section), the ``perf/ranks`` table too.

        Waits at most ``timeout_s`` for the queue to drain (what is left then is dropped).
        """
        if not self.resolve():
            self._thread.close(1.0)
            return

        memory = report.get("memory") or {}
        row = interval_metrics([t for t in timings if t.step > self._last_step], memory_latest)
        diagnoses = [dict(d) for d in report.get("diagnoses", [])]
        summary = summary_keys(report, diagnoses)
        figures = _figures_table(report, memory)
        headline = headline_metrics(report, top=0)  # the run's MFU and FLOP/s: a point on their panels' lines
        row.update({key: headline[key] for key in ("perf/mfu", "perf/achieved_flops_per_s") if key in headline})
        memory_files = self._memory_files(memory)
        ranks = (report.get("ranks") or {}).get("per_rank")

        def job() -> None:
            import wandb

            extra = {"perf/ranks": _ranks_table(ranks)} if ranks else {}
            self._log_row({**row, **extra, "perf/diagnoses": self._table(diagnoses), "perf/figures": figures(),
                           "perf/report": wandb.Html(html, inject=False)}, step)
            self.run.summary.update(summary)
            if memory_files:
                self._log_files("memory-snapshot", memory_files, {"reasons": sorted({p.parent.name for p in
                                                                                     memory_files})})
            if self.owned:
                self.run.finish()

        self._submit("wandb_close", job)
        if not self._thread.flush(timeout_s):
            self.once.warn("wandb_slow", f"W&B logging did not finish within {timeout_s:.0f} s; the rest is dropped")
        self._thread.close(1.0)

    def section(self) -> dict[str, Any]:
        """The ``wandb`` entry of ``report.json``."""
        run = self.run
        return {"run_id": getattr(run, "id", None), "project": getattr(run, "project", None),
                "step_metric": self.step_key, "rows": self.rows, "dropped": self._thread.dropped,
                "status": "failed" if self.failed else ("logging" if run is not None else "no run")}

    # ------------------------------------------------------------------ wandb thread
    def _log_row(self, row: dict[str, Any], step: int, wait_for_user: bool = False) -> None:
        """Log ``row`` at perfhooks' ``step``. Joining the user's row (``commit=False``), two ``perf/*`` rows must
        not join the same one (the second would overwrite the first): with ``wait_for_user``, wait up to
        :data:`JOIN_WAIT_S` on this thread for the user's next row before joining."""
        self._declare()
        data = {**row, PERF_STEP: step}
        for key in data.keys() - self._quiet:  # each figure's first row: kept out of the summary by name (a glob's
            self._quiet.add(key)              # summary setting is not applied to the keys it matches)
            if key.startswith("perf/") and key != self.step_key:
                self.run.define_metric(key, step_metric=self.step_key, summary="none")
        if self.step_key != PERF_STEP:
            data[self.step_key] = step
        if not self.commit:
            if wait_for_user:
                deadline = monotonic() + JOIN_WAIT_S
                while self.run.step == self._joined_step and monotonic() < deadline:
                    time.sleep(0.005)
            self._joined_step = self.run.step
        self.run.log(data, commit=self.commit)
        self.rows += 1

    def _declare(self) -> None:
        if self._declared:
            return
        self._declared = True
        self.run.define_metric(self.step_key)
        # the rows' figures stay out of the run's summary (see _log_row), whose end-of-run printout would list them
        # ahead of the user's own metrics ("perf" sorts before "train"); the summary gets a few keys of its own
        self.run.define_metric("perf/*", step_metric=self.step_key)

    def _table(self, diagnoses: list[dict[str, Any]]) -> Any:
        import wandb

        return wandb.Table(columns=list(DIAGNOSIS_COLUMNS),
                           data=[_row(d) for d in diagnoses])

    def _log_files(self, kind: str, paths: list[Path], metadata: dict[str, Any], aliases: list[str] | None = None
                   ) -> None:
        import wandb

        paths = [p for p in paths if p.exists()]
        if not paths:
            return
        artifact = wandb.Artifact(f"{kind}-{self.run.id}", type=kind, metadata=metadata)
        for path in paths:
            if path.is_dir():
                artifact.add_dir(str(path), name=path.name)
            else:
                artifact.add_file(str(path), name=path.name)
        self.run.log_artifact(artifact, aliases=aliases)

    # ------------------------------------------------------------------ internals
    def _adopt(self, run: Any) -> None:
        self.run = run
        if self.step_key is None:
            self.step_key = PERF_STEP
            self.commit = self.owned  # join the user's row: never advance their step

    def _open_run(self) -> Any:
        try:
            import wandb
        except ImportError:
            self.once.warn("wandb_missing", "wandb=True but wandb is not installed (pip install wandb); "
                                            "W&B logging is off, local files are written")
            self.failed = "not installed"
            return None
        # The run's files go beside perfhooks' own, unless the user chose a place (WANDB_DIR).
        where = {} if os.environ.get("WANDB_DIR") else {"dir": str(self.output_dir)}
        self.output_dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "perfhooks"), job_type="perfhooks", **where)
        self.owned = True
        return run

    def _submit(self, kind: str, job: Callable[[], None]) -> None:
        if self.failed or self.run is None:
            return

        def guarded() -> None:
            if self.failed:
                return
            try:
                job()
            except Exception as error:
                self._fail(kind, error)

        self._thread.submit(kind, guarded)

    def _fail(self, kind: str, error: BaseException) -> None:
        self.failed = f"{type(error).__name__}: {error}"
        self.faults.report(kind, error)
        self.once.warn("wandb_off", "W&B logging is off for the rest of this run; local files are still written")

    def _memory_files(self, memory: dict[str, Any]) -> list[Path]:
        folders = [Path(c["path"]) for c in memory.get("captures", [])]
        oom = self.output_dir / "oom"
        if oom.is_dir():
            folders.append(oom)
        return folders


def _row(diagnosis: dict[str, Any]) -> list[Any]:
    """A diagnosis as a table row; one type per column (wandb checks), ``None`` where a value is missing."""
    gain = diagnosis.get("estimated_gain")
    step = diagnosis.get("step")
    return [str(diagnosis.get("id", "")), str(diagnosis.get("severity", "")), str(diagnosis.get("title", "")),
            str(diagnosis.get("evidence", "")), round(float(gain), 4) if gain is not None else None,
            str(diagnosis.get("recommendation", "")), int(step) if step is not None else None,
            _device_hours(diagnosis)]


def _device_hours(diagnosis: dict[str, Any]) -> float | None:
    """The diagnosis' waste in device-hours (its ``cost``), or None without a ledger."""
    cost = diagnosis.get("cost") or {}
    return float(cost["device_hours"]) if cost.get("device_hours") is not None else None


RANK_COLUMNS = ("rank", "status", "steps", "step_ms", "coverage", "data_wait_share", "forward_share",
                "backward_share", "optimizer_share", "diagnoses")


#: The run summary's own keys (at most these, so that the user's metrics lead W&B's end-of-run printout).
SUMMARY_KEYS = ("perf/step_ms", "perf/steps", "perf/top1/id", "perf/top1/gain", "perf/top1/device_hours",
                "perf/tokens_per_s", "perf/mfu", "perf/overhead")


def summary_keys(report: dict[str, Any], diagnoses: list[dict[str, Any]]) -> dict[str, Any]:
    """The few keys perfhooks puts in the W&B run summary: step time, steps, the top diagnosis, its gain and its
    waste in device-hours (the ledger), tokens per second (samples where no tokens were counted), MFU where
    known, and perfhooks' own share of the steps. The rest is the ``perf/figures`` table."""
    headline = headline_metrics(report, top=0)
    summary: dict[str, Any] = {"perf/step_ms": headline["perf/step_ms"], "perf/steps": report.get("steps", 0)}
    if diagnoses:
        summary["perf/top1/id"] = diagnoses[0]["id"]
        summary["perf/top1/gain"] = float(diagnoses[0].get("estimated_gain", 0.0))
        if _device_hours(diagnoses[0]) is not None:
            summary["perf/top1/device_hours"] = _device_hours(diagnoses[0])
    rate = headline.get("perf/tokens_per_s")
    if rate is not None:
        summary["perf/tokens_per_s"] = rate
    elif headline.get("perf/samples_per_s") is not None:
        summary["perf/samples_per_s"] = headline["perf/samples_per_s"]
    if headline.get("perf/mfu") is not None:
        summary["perf/mfu"] = headline["perf/mfu"]
    overhead = report.get("overhead") or {}
    if overhead:  # perfhooks' own time, a share of the steps' (its budget is in the perf/figures table)
        measured = overhead.get("measured") or {}
        summary["perf/overhead"] = measured["share"] if measured.get("resolved") else overhead.get("share_of_run", 0.0)
    return summary


def _figures_table(report: dict[str, Any], memory: dict[str, Any]) -> Any:
    """Every headline figure, the run account (s), the top diagnoses and the memory peak, as one ``wandb.Table``
    of (figure, value) rows, built on the logging thread."""
    figures: dict[str, Any] = dict(headline_metrics(report, top=SUMMARY_TOP))
    figures["perf/global_step"] = report.get("global_step", report.get("steps", 0))
    overhead = report.get("overhead") or {}
    if overhead:  # what perfhooks cost, and how many steps the phases come from
        figures["perf/overhead/share_of_run"] = overhead.get("share_of_run", 0.0)
        measured = overhead.get("measured") or {}
        figures["perf/overhead/measured"] = measured.get("share") if measured.get("resolved") else "unresolved"
        figures["perf/overhead/phase_steps"] = report.get("phase_steps", 0)
        figures["perf/overhead/kept"] = str(overhead.get("kept"))
        figures["perf/overhead/budget"] = str(overhead.get("budget"))
        windows = overhead.get("windows") or {}
        if windows.get("time_share") is not None:  # the windows' and exports' steps against the steady ones
            figures["perf/overhead/windows_time_share"] = windows["time_share"]
    for key, value in (report.get("run") or {}).items():
        if isinstance(value, (int, float)):
            figures[f"perf/run/{key}"] = value
    for index, diagnosis in enumerate(report.get("diagnoses", [])[:SUMMARY_TOP], 1):
        figures[f"perf/top{index}/id"] = diagnosis["id"]
        figures[f"perf/top{index}/gain"] = float(diagnosis.get("estimated_gain", 0.0))
        if _device_hours(diagnosis) is not None:
            figures[f"perf/top{index}/device_hours"] = _device_hours(diagnosis)
            if (diagnosis.get("cost") or {}).get("money") is not None:
                figures[f"perf/top{index}/device_cost"] = diagnosis["cost"]["money"]
    for key, value in (report.get("ledger") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            figures[f"perf/ledger/{key}"] = value
    if "capacity_bytes" in memory:
        figures["perf/mem/capacity_bytes"] = memory["capacity_bytes"]
        figures["perf/mem/peak_used_bytes"] = memory.get("peak_used_bytes", 0)

    def table() -> Any:
        import wandb

        return wandb.Table(columns=["figure", "value"], data=[[key, str(value)] for key, value in figures.items()])

    return table


def _ranks_table(per_rank: list[dict[str, Any]]) -> Any:
    """One row per rank: status, steps, mean step time (ms), coverage and phase shares (0..1), diagnosis ids."""
    import wandb

    rows = [[int(r["rank"]), str(r["status"]), int(r["steps"]), float(r["step_ms"]["mean"]), float(r["coverage"]),
             *(float(r["shares"].get(name, 0.0)) for name in ("data_wait", "forward", "backward", "optimizer")),
             ", ".join(r["diagnoses"])] for r in per_rank]
    return wandb.Table(columns=list(RANK_COLUMNS), data=rows)
