"""The live watch: one thread per run that keeps a small live file, prints a live line and names stalls as they
happen, all from the published state; nothing of it runs on the training thread.

- **The live file** (``live.rank<R>.json`` beside the report, every :data:`LIVE_EVERY_S` seconds, atomically):
  step, steps/s, step p50/p95, phase shares, the phase open now and for how long, memory, throughput, verdicts,
  and the stall, if any. ``perfhooks top`` reads these files, one folder per node or one shared folder.
- **The live line** (rank 0, every ``console_every_s`` seconds): one line on standard error, on a line of its own
  when a progress bar is open.
- **Stalls**: when the phase open now has lasted longer than ``stall_after_s`` (default the larger of 120 s and
  20 x the p95 step), the watch records the rank, step, phase and seconds so far, the training thread's Python
  stack (innermost last), all threads' stacks in ``stalls/rank<R>.step<N>.txt``, the device's queue (drained,
  busy, or none on a CPU: one bounded query, never a synchronize) and the memory in use; prints one line; writes
  the live file and the report at once; and updates the record with its length when the phase moves on.

The training thread's only part is the tracker's ``phase_now`` (the open phase, since when, the step), set at each
phase change (one tuple assignment).
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfhooks.events import OTHER, PHASES
from perfhooks.faults import FaultLog
from perfhooks.files.atomic import atomic_write_json
from perfhooks.locks import bounded, holds_lock
from perfhooks.runtime.state.run_state import RunState
from perfhooks.timebase import monotonic

#: Seconds between two looks, and between two writes of the live file.
TICK_S = 1.0
LIVE_EVERY_S = 2.0
#: The shortest default stall bound (s), and how many p95 steps a phase may last before it is a stall.
MIN_STALL_S = 120.0
STALL_P95_STEPS = 20.0
#: Stack frames kept in a stall's record (the innermost).
STACK_FRAMES = 30


def live_name(rank: int) -> str:
    return f"live.rank{rank}.json"


def frame_line(frame: traceback.FrameSummary, short: bool = False) -> str:
    """``file:line in function`` (the file's name only, with ``short``)."""
    name = os.path.basename(frame.filename) if short else frame.filename
    return f"{name}:{frame.lineno} in {frame.name}"


class LiveWatch:
    """The live file, the live line and the stall watch of one run (a daemon thread)."""

    def __init__(self, *, rank: int, world_size: int, output_dir: Path, stall_after_s: float | None,
                 console_every_s: float, state: Callable[[], RunState], phase_now: Callable[[], tuple[Any, ...]],
                 device: Callable[[], str], on_stall: Callable[[], None], faults: FaultLog,
                 thread_id: int | None = None, clock: Callable[[], float] = monotonic,
                 left_open: Callable[[float, float], str | None] | None = None,
                 on_left_open: Callable[[str], None] | None = None, trace: Callable[[], Any] | None = None) -> None:
        self.rank, self.world_size, self.output_dir = rank, world_size, output_dir
        self.stall_after_s = stall_after_s
        #: When the watch began, on its clock: no phase of this run started before.
        self._born = clock()
        self.console_every_s = console_every_s
        self.state, self.phase_now, self.device, self.on_stall = state, phase_now, device, on_stall
        #: Why the run is taken as left open, given the seconds since its last step and the stall limit
        #: (:mod:`perfhooks.runtime.ending.orphans`), and what closes it then (on this thread).
        self.left_open, self.on_left_open = left_open, on_left_open
        #: The latest analysed window's verdicts, read straight from where the writer swaps them in (the
        #: published state carries them from the next step on): the live file has them within one look.
        self.trace = trace
        self._trace_seen: Any = None
        self._last_step: tuple[int, float] = (-1, clock())
        self.faults = faults
        self.thread_id = threading.get_ident() if thread_id is None else thread_id
        self.clock = clock
        self._stalls: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_live = self._next_line = clock()
        if console_every_s:
            self._next_line += console_every_s
        self._rate: tuple[float, int] | None = None
        self._limit: tuple[int, float] | None = None
        self.host = socket.gethostname()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="perfhooks-watch", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread; a stall whose phase has moved on since its last look gets its length (one last look)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if self._open is not None:
            try:
                phase, since, step = self.phase_now()
                self._follow_stall(self.state(), phase, since, step, 0.0)
            except Exception as error:
                self.faults.report("live_watch", error)

    def records(self) -> list[dict[str, Any]]:
        """The stalls so far (copies; the open one with its seconds so far)."""
        with bounded(self._lock):  # a signal's saving reads them: the lock's holder may be interrupted
            return [{k: v for k, v in record.items() if not k.startswith("_")} for record in self._stalls]

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception as error:
                self.faults.report("live_watch", error)

    # ----------------------------------------------------------------- one look
    def in_phase_s(self, now: float, since: float | None) -> float:
        """Seconds in the open phase; 0 when the phase_now's time is not to be trusted: after ``now`` (a clock that
        went backwards) or before this watch began (a jump larger than the run's age)."""
        if since is None or since > now or since < self._born - TICK_S:
            return 0.0
        return now - since

    def tick(self) -> None:
        now = self.clock()
        state = self.state()
        phase, since, step = self.phase_now()
        if step != self._last_step[0]:
            self._last_step = (step, now)
        if self.left_open is not None and self.on_left_open is not None:
            reason = self.left_open(max(0.0, now - self._last_step[1]), self.stall_limit(state))
            if reason is not None:
                self._stop.set()
                self.on_left_open(reason)
                return
        in_phase_s = self.in_phase_s(now, since)
        changed = self._follow_stall(state, phase, since, step, in_phase_s)
        trace = self.trace() if self.trace is not None else None
        if trace is not None and trace is not self._trace_seen:  # a window was analysed: its verdicts now
            self._trace_seen, changed = trace, True
        if changed or now >= self._next_live:
            self._next_live = now + LIVE_EVERY_S
            self.write_live(state, phase, in_phase_s, now)
        if self.console_every_s and self.rank == 0 and now >= self._next_line:
            self._next_line = now + self.console_every_s
            self._print_line(state)

    def stall_limit(self, state: RunState) -> float:
        """Seconds a phase may last before it is a stall: the setting, else max(120 s, 20 x the p95 step)."""
        if self.stall_after_s:
            return self.stall_after_s
        if self._limit is None or self._limit[0] != state.step:
            stats = state.stats.thaw() if state.stats.steps else None
            p95_s = stats.step.quantile(0.95) / 1e3 if stats is not None else 0.0
            self._limit = (state.step, max(MIN_STALL_S, STALL_P95_STEPS * p95_s))
        return self._limit[1]

    @holds_lock
    def _follow_stall(self, state: RunState, phase: str | None, since: float | None, step: int,
                      in_phase_s: float) -> bool:
        """Open, update or end the stall; True when one opened or ended (the files are rewritten now)."""
        opened = self._open
        if opened is not None:
            if since != opened["_since"]:  # the phase moved on: the stall ended
                with self._lock:
                    opened["seconds"] = round(max(0.0, (since or self.clock()) - opened["_since"]), 3)
                    opened["ended"] = True
                self._open = None
                self._changed()
                return True
            with self._lock:
                opened["seconds"] = round(in_phase_s, 3)
            return False
        if since is None or state.status != "running" or in_phase_s <= self.stall_limit(state):
            return False
        self._open = self._record(phase, since, step, in_phase_s)
        self._changed()
        return True

    @holds_lock
    def _record(self, phase: str | None, since: float, step: int, in_phase_s: float) -> dict[str, Any]:
        frames = self._stack()
        record = {"rank": self.rank, "step": step, "phase": phase or OTHER, "seconds": round(in_phase_s, 3),
                  "started_at": round(time.time() - in_phase_s, 3),
                  "stack": [frame_line(frame) for frame in frames], "device": self._device(),
                  "threads_file": self._dump_threads(step), "ended": False, "_since": since}
        where = f": {frame_line(frames[-1], short=True)}" if frames else ""
        print(f"perfhooks: rank {self.rank} stalled in {record['phase']} for {in_phase_s:.0f} s at step {step}{where}",
              file=sys.stderr, flush=True)
        with self._lock:
            self._stalls.append(record)
        return record

    def _changed(self) -> None:
        try:
            self.on_stall()
        except Exception as error:
            self.faults.report("stall_report", error)

    def _stack(self) -> list[traceback.FrameSummary]:
        frame = sys._current_frames().get(self.thread_id)
        return list(traceback.extract_stack(frame))[-STACK_FRAMES:] if frame is not None else []

    def _device(self) -> str:
        try:
            return self.device()
        except Exception:
            return "unknown"

    def _dump_threads(self, step: int) -> str | None:
        path = self.output_dir / "stalls" / f"rank{self.rank}.step{step}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as handle:
                faulthandler.dump_traceback(handle, all_threads=True)
            return str(path)
        except OSError:
            return None

    # ----------------------------------------------------------------- the live file and line
    def figures(self, state: RunState, phase: str | None, in_phase_s: float, now: float) -> dict[str, Any]:
        """This rank's live figures (the live file's content)."""
        stats = state.stats.thaw()
        rate = None
        if self._rate is not None and state.published_s > self._rate[0] and state.step > self._rate[1]:
            rate = (state.step - self._rate[1]) / (state.published_s - self._rate[0])
        if self._rate is None or state.step != self._rate[1]:
            self._rate = (state.published_s, state.step)
        total = stats.step.total
        samples_per_s, tokens_per_s, _ = stats.throughput()
        memory = state.parts.memory_figures.latest if state.parts.memory_figures is not None else {}
        open_stall = self._open
        return {
            "rank": self.rank, "world_size": self.world_size, "host": self.host, "pid": os.getpid(),
            "updated_at": round(time.time(), 3), "status": state.status, "step": state.step,
            "global_step": state.global_step, "steps_per_s": round(rate, 4) if rate else None,
            "step_p50_ms": round(stats.step.quantile(0.5), 4), "step_p95_ms": round(stats.step.quantile(0.95), 4),
            "shares": {name: round(stats.phases[name].total / total, 4) if total else 0.0 for name in (*PHASES, OTHER)},
            "phase": phase or OTHER, "in_phase_s": round(in_phase_s, 3),
            "stalled": open_stall is not None, "stack": list(open_stall["stack"]) if open_stall else [],
            "memory_bytes": memory.get("used_bytes"), "samples_per_s": round(samples_per_s, 4) or None,
            "tokens_per_s": round(tokens_per_s, 4) or None,
            "verdicts": [d["id"] for d in (self._trace_seen or state.parts.trace).diagnoses],
            "phase_steps": stats.sampled_steps,
            "overhead": round(state.own_share, 6),
            "stalls": self.records(),
        }

    def write_live(self, state: RunState, phase: str | None, in_phase_s: float, now: float) -> None:
        if not self.output_dir.is_dir():  # not made yet, or removed by the user: perfhooks never makes it again
            return
        try:
            atomic_write_json(self.output_dir / live_name(self.rank), self.figures(state, phase, in_phase_s, now))
        except OSError as error:
            self.faults.report("live_file", error)

    def _print_line(self, state: RunState) -> None:
        from perfhooks.sinks.console import fresh_line, live_line

        print(fresh_line() + live_line(self.figures(state, None, 0.0, self.clock())), file=sys.stderr, flush=True)
