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

A step's marks may sit on several streams (a forward under ``torch.cuda.stream(s)``): :meth:`DeviceClock.ready`
is asked of each before a step is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfhooks.device.room import DeviceRoom
from perfhooks.faults import DeviceLost

#: Most device events kept for reuse.
POOL_LIMIT = 4096


@dataclass(slots=True)
class Mark:
    host_ns: int
    event: Any = None  # a device event, None after the device stopped being used


class HostClock:
    """Times intervals with ``time.perf_counter_ns``; marks are ints, ready at once."""

    device_timed = False

    def __init__(self) -> None:
        self.mark: Callable[[], Any] = time.perf_counter_ns

    def ready(self, mark: Any) -> bool:
        return True

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Interval on this clock's timeline (ms)."""
        return (end - start) / 1e6

    def host_ms(self, start: Any, end: Any) -> float:
        """Interval on the host clock (ms), whatever the timeline."""
        return (end - start) / 1e6

    def release(self, mark: Any) -> None:
        pass

    def wait(self, mark: Any, deadline: float) -> bool:
        """Whether ``mark`` is complete by ``deadline`` (``time.monotonic()``); host marks always are."""
        return True


class DeviceClock(HostClock):
    """Times intervals on the device timeline with events on the run's device, recycled through a pool."""

    device_timed = True

    def __init__(self, room: DeviceRoom) -> None:
        self.room = room
        self._pool: list[Any] = []
        self.mark = self._record_mark
        room.when_lost(self._pool.clear)

    def _record_mark(self) -> Mark:
        room = self.room
        if room.usable():
            event = self._pool.pop() if self._pool else room.new_event()
            try:
                room.record(event)
                return Mark(time.perf_counter_ns(), event)
            except DeviceLost:
                pass
        return Mark(time.perf_counter_ns())

    def ready(self, mark: Mark) -> bool:
        if mark.event is None or self.room.lost is not None:
            return True
        if not self.room.usable():
            return False  # a capture is under way: asked again after it
        try:
            return self.room.query(mark.event)
        except DeviceLost:
            return True

    def elapsed_ms(self, start: Mark, end: Mark) -> float:
        if start.event is not None and end.event is not None and self.room.lost is None:
            try:
                return self.room.elapsed_ms(start.event, end.event)
            except DeviceLost:
                pass
        return (end.host_ns - start.host_ns) / 1e6

    def host_ms(self, start: Mark, end: Mark) -> float:
        return (end.host_ns - start.host_ns) / 1e6

    def release(self, mark: Mark) -> None:
        if mark.event is not None and self.room.lost is None and len(self._pool) < POOL_LIMIT:
            self._pool.append(mark.event)
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
