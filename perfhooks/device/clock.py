"""Timestamps for phase and step boundaries, on the host or on the device's stream.

On the host a mark is the integer ``time.perf_counter_ns()`` (marks are taken ~9 times a step, so they stay as
cheap as that). On an accelerator a mark is a :class:`Mark`: the host time plus an event recorded on the run's
device's current stream (through :class:`~perfhooks.device.room.DeviceRoom`). Intervals between two device
marks are read later, once both events have completed (``Event.query()`` never blocks), so timing a step never
stalls the device. :meth:`DeviceClock.wait` polls against a deadline; nothing here ever blocks without one.

After a CUDA error (the room marked lost, ``DeviceRoom.lose``) marks are host-only and no
device call is made: the context may be broken, and a call would raise again after the user's traceback. While
the calling thread's stream captures a CUDA graph, marks are host-only too (a query during a capture would
invalidate the user's graph), and pending marks are not polled until the capture ends.

A step's marks may sit on several streams (a forward under ``torch.cuda.stream(s)``): :meth:`DeviceClock.all_ready`
checks each before a step is read. Events on one stream complete in the order they were recorded, so the
clock keeps, per stream, the newest mark known complete: every older mark on that stream is complete without a
query, and one query of a step's newest mark answers for the whole step.

The device calls of a step (counted on the simulated GPU by ``tests/device/test_device_calls.py``): one capture
check when it opens (:meth:`DeviceClock.step_opening`), one event record per mark (a step's end is the next
step's start: :meth:`DeviceClock.share`), about one query, and one ``elapsed_time`` per mark after the first, read
against the step's first mark (:meth:`DeviceClock.reader`). On CUDA the timing reader's thread reads them through
one ``cudaEventElapsedTime`` each, which releases the GIL (:meth:`DeviceClock.bind_reader`); torch's
``elapsed_time`` holds it for three runtime calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfhooks.device import capture_watch
from perfhooks.device.cuda_extras import TIMER_TOLERANCE_MS
from perfhooks.device.room import DeviceRoom
from perfhooks.faults import DeviceLost
from perfhooks.timebase import monotonic_ns

#: Most device events kept for reuse.
POOL_LIMIT = 4096


@dataclass(slots=True, eq=False)
class Mark:
    """A boundary on the device's timeline; compared and hashed by identity (a step's marks key its reads)."""

    host_ns: int
    event: Any = None  # a device event, None after the device stopped being used
    #: The stream the event was recorded on (its id, device, type), None for a host-only mark.
    stream: Any = None
    #: Step records holding this mark (a step's end is the next step's start): its event is reused at 0.
    holders: int = 1


class HostClock:
    """Times intervals with ``time.perf_counter_ns``; marks are ints, ready at once."""

    device_timed = False

    def __init__(self) -> None:
        self.mark: Callable[[], Any] = monotonic_ns

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Interval on this clock's timeline (ms)."""
        return (end - start) / 1e6

    def host_ms(self, start: Any, end: Any) -> float:
        """Interval on the host clock (ms), whatever the timeline."""
        return (end - start) / 1e6

    def all_ready(self, marks: list[Any]) -> bool:
        """Whether every one of ``marks`` (a step's, in the order taken) has completed."""
        return True

    def release_all(self, marks: list[Any]) -> None:
        """A step's distinct ``marks`` are read: what they hold goes back (host marks hold nothing)."""

    def share(self, mark: Any) -> Any:
        """``mark``, held by one more step record (a step's end as the next step's start)."""
        return mark

    def step_opening(self) -> None:
        """A step opens (the device clock checks for a graph capture here, once)."""

    def bind_reader(self) -> bool:
        """The calling thread reads the step timings from here on; whether it got a timer of its own (host marks
        need none)."""
        return False

    def quiet(self) -> bool:
        """Another thread may ask the device about marks now (no capture may be under way)."""
        return True

    def reader(self, origin: Any) -> Callable[[Any, Any], float]:
        """``interval(start, end)`` in ms for the marks of a step that began at ``origin``."""
        return self.elapsed_ms

    def wait(self, mark: Any, deadline: float) -> bool:
        """Whether ``mark`` is complete by ``deadline`` (``time.monotonic()``); host marks always are."""
        return True


class DeviceClock(HostClock):
    """Times intervals on the device timeline with events on the run's device, recycled through a pool."""

    device_timed = True

    def __init__(self, room: DeviceRoom) -> None:
        self.room = room
        #: Marks whose events no step holds any more, for reuse (a mark is made once per pooled event: a young
        #: object that lives until the reader reads it is one more for the garbage collector's next pass).
        self._pool: list[Mark] = []
        #: Per stream, the host time (ns) of the newest mark known complete: older marks there are complete too.
        self._done: dict[Any, int] = {}
        #: No capture was under way when the open step opened: its marks may be recorded on the device.
        self._clear = True
        self._record = room.current_recorder()
        self.mark = self._record_mark
        #: ``(thread id, timer)``: the thread that reads the step timings and its GIL-free interval timer, None
        #: until its first interval (:meth:`bind_reader`); every other thread asks torch.
        self._timer: tuple[int, Callable[[Any, Any], float | None] | None] | None = None
        self._timer_checked = False
        room.when_lost(self._lost)
        room.follow_captures()

    def _lost(self) -> None:
        self._pool.clear()
        self._clear = False
        self._timer = None

    def bind_reader(self) -> bool:
        """The calling thread reads the step timings from here on: on CUDA, its intervals go through a timer that
        releases the GIL and makes one runtime call (``DeviceRoom.thread_timer``), checked once against torch's.
        The timer is made at the first interval, once torch has made the events (and so the device's context):
        nothing here initializes CUDA before the user's program does. Whether the device may have one."""
        self._timer = (threading.get_ident(), None) if self.room.is_cuda else None
        return self._timer is not None

    def _timed(self, start: Any, end: Any) -> float | None:
        """The bound reader's interval, or None (not that thread, no timer, or it could not say)."""
        bound = self._timer
        if bound is None or bound[0] != threading.get_ident():
            return None
        timer = bound[1]
        if timer is None:  # the first interval: the events exist, so does the device's context
            timer = self.room.thread_timer()
            self._timer = (bound[0], timer) if timer is not None else None
            if timer is None:
                return None
        ms = timer(start, end)
        if ms is not None and not self._timer_checked:  # its first answer, against torch's (same call beneath)
            self._timer_checked = True
            if abs(ms - self.room.elapsed_ms(start, end)) > TIMER_TOLERANCE_MS:
                self._timer = None
                return None
        return ms

    def step_opening(self) -> None:
        self._clear = self.room.usable()  # the step's one capture check (not lost, the stream not capturing)

    def quiet(self) -> bool:
        """No capture may be under way: none through ``torch.cuda.graph``, and none seen on the training thread
        when its step opened (a query from another thread would invalidate a global-mode capture)."""
        return self._clear and self.room.lost is None and not capture_watch.active()

    def _record_mark(self) -> Mark:
        if self._clear and (not capture_watch.open_contexts or self.room.usable()):
            pool = self._pool
            mark = pool.pop() if pool else Mark(0, self.room.new_event())
            try:
                mark.stream = self._record(mark.event)
            except DeviceLost:
                self._clear = False  # no device call until the next step's check (which says no: the room is lost)
            else:
                mark.host_ns, mark.holders = monotonic_ns(), 1
                return mark
        return Mark(monotonic_ns())

    def ready(self, mark: Mark) -> bool:
        event = mark.event
        if event is None or self.room.lost is not None:
            return True
        if mark.host_ns <= self._done.get(mark.stream, -1):
            return True  # a newer mark on its stream has completed
        if capture_watch.active() and not self.room.usable():
            return False  # a capture is under way: asked again after it
        try:
            done = bool(event.query())
        except Exception as error:
            try:
                self.room.failed(error)  # raises: DeviceLost after a device error, else the error itself
            except DeviceLost:
                return True
            raise
        if done:
            self._done[mark.stream] = max(mark.host_ns, self._done.get(mark.stream, -1))
        return done

    def all_ready(self, marks: list[Mark]) -> bool:
        """Whether every one of a step's ``marks`` (in the order taken) has completed: the newest is asked first, and
        once it has, every older mark on its stream is known complete without a call (the reader's check of each
        step, one frame for the step)."""
        if self.room.lost is not None:
            return True
        done, ready = self._done, self.ready
        for mark in reversed(marks):
            if mark.event is not None and mark.host_ns > done.get(mark.stream, -1) and not ready(mark):
                return False
        return True

    def elapsed_ms(self, start: Mark, end: Mark) -> float:
        if start.event is not None and end.event is not None and self.room.lost is None:
            try:
                if self._timer is not None:
                    ms = self._timed(start.event, end.event)
                    if ms is not None:
                        return ms
                return self.room.elapsed_ms(start.event, end.event)
            except DeviceLost:
                pass
        return (end.host_ns - start.host_ns) / 1e6

    def reader(self, origin: Mark) -> Callable[[Mark, Mark], float]:
        """Intervals of one step, each mark read once against the step's first (``elapsed_time(origin, m)``;
        float32 milliseconds stay exact to the µs within a step). Pairs with a host-only mark are host times."""
        if origin.event is None:
            return self.elapsed_ms
        offsets: dict[Mark, float] = {origin: 0.0}
        elapsed, room = self.elapsed_ms, self.room
        bound = self._timer
        if (bound is not None and bound[1] is not None and self._timer_checked
                and bound[0] == threading.get_ident()):  # the reader's checked timer, called directly
            timer = bound[1]

            def read(first: Mark, mark: Mark) -> float:
                ms = timer(first.event, mark.event)
                return ms if ms is not None else elapsed(first, mark)
        else:
            read = elapsed

        def interval(start: Mark, end: Mark) -> float:
            if start.event is None or end.event is None or room.lost is not None:
                return (end.host_ns - start.host_ns) / 1e6
            at_start = offsets.get(start)
            if at_start is None:
                at_start = offsets[start] = read(origin, start)
            at_end = offsets.get(end)
            if at_end is None:
                at_end = offsets[end] = read(origin, end)
            return at_end - at_start

        return interval

    def host_ms(self, start: Mark, end: Mark) -> float:
        return (end.host_ns - start.host_ns) / 1e6

    def share(self, mark: Mark) -> Mark:
        mark.holders += 1
        return mark

    def release_all(self, marks: list[Mark]) -> None:
        """Each of ``marks`` is held by one step record fewer; one no record holds goes back to the pool with its
        event (a step's marks in one frame: the reader returns every step's)."""
        pool, keep = self._pool, self.room.lost is None
        for mark in marks:
            left = mark.holders - 1  # the releasing thread's own count decides: a mark is pooled at most once
            mark.holders = left
            if left > 0:
                continue
            if mark.event is not None and keep and len(pool) < POOL_LIMIT:
                pool.append(mark)
            else:
                mark.event = None

    def wait(self, mark: Mark, deadline: float) -> bool:
        """Poll until ``mark`` completes on the device or ``deadline`` passes; whether it completed (a lost
        device's marks are read on the host: complete)."""
        if mark.event is None or self.room.lost is not None:
            return True
        try:
            return self.room.wait(mark.event, deadline)
        except DeviceLost:
            return True
