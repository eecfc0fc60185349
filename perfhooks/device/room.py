"""The one room through which perfhooks reaches the accelerator, bound to the engine's device index.

Every call names the device: events are recorded on *that* device's current stream, memory figures and
capacity are read for *that* index, never for ``current_device()`` (a run on ``cuda:1`` with the current
device left at 0 is timed on device 1). The device-generic API is used where torch has one
(``torch.Event``, ``torch.accelerator.*``), so XPU and other accelerators get timing and memory figures too;
the CUDA-only extras (allocation history, snapshots, the OOM observer, the Nsight range, allocation tags) are in
:mod:`perfhooks.device.cuda_extras`.

Nothing here synchronizes the host with the device. The only wait, :meth:`DeviceRoom.wait`, polls
``Event.query()`` until a deadline and gives up when the device does not get there (a hung kernel, a dead peer
in a collective): it never blocks past the deadline.

**A device error ends the room's use of the device.** CUDA errors are sticky: after the user's kernel hits an
illegal address, whichever call comes next raises it, often one of perfhooks'. The room then marks the device
lost (:attr:`DeviceRoom.lost`) and every later method raises :class:`~perfhooks.faults.DeviceLost` without
touching the device; callers fall back to host times, and the fault log prints nothing (the user's next call
raises the error, with the user's traceback). :meth:`DeviceRoom.usable` also says no while the calling thread's
current stream is capturing a CUDA graph: a query or ``cudaMemGetInfo`` then would invalidate the user's graph.

**Few calls a step.** Every call here costs microseconds of the training thread's time on a real GPU (an event
record about 2.5 µs, building a Python ``Stream`` 4.4 µs, a flattened ``memory_stats()`` tens of µs), and a
host-bound step pays each one. So the step's path asks the stream whether it captures once, when the step opens
(:meth:`DeviceClock.step_opening <perfhooks.device.clock.DeviceClock.step_opening>`), and otherwise only while
:mod:`~perfhooks.device.capture_watch` knows a ``torch.cuda.graph`` capture is open; events are recorded on the
current stream found by its id (:meth:`DeviceRoom.record_current`, a cached ``Stream``); memory is read from the
allocator's nested counters without torch's flattening (:meth:`DeviceRoom.memory`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from perfhooks.device import capture_watch
from perfhooks.faults import DeviceLost, is_device_error
from perfhooks.timebase import monotonic

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds between two ``query()`` polls while waiting on the device.
POLL_S = 0.001


def _device_call(method: F) -> F:
    """A room method that reaches the device: refused once the device is lost; a device error marks it lost."""

    @functools.wraps(method)
    def call(self: DeviceRoom, *args: Any, **kwargs: Any) -> Any:
        if self.lost is not None:
            raise DeviceLost(self.lost)
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            if is_device_error(error):
                self.lose(f"{type(error).__name__}: {error}")
                raise DeviceLost(self.lost) from error
            raise

    return call  # type: ignore[return-value]


@dataclass(frozen=True)
class MemoryFigures:
    """The allocator's counters for one device (bytes, counts). ``peak_allocated_bytes`` is the allocator's own
    peak since the process started (or the user last reset it); perfhooks never resets it."""

    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int
    peak_allocated_bytes: int
    num_alloc_retries: int
    num_ooms: int


class DeviceRoom:
    """All device access for one run, bound to one device (``torch.device``, string or None for the CPU)."""

    def __init__(self, device: Any = None) -> None:
        import torch

        self._torch = torch
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.type: str = device.type
        #: True when this run's device is an accelerator torch can reach (CUDA, XPU, ...).
        self.accelerated = self.type not in ("cpu", "meta") and _backend_available(torch, self.type)
        self.index: int | None = None
        if self.accelerated:
            self.index = device.index if device.index is not None else _current_index(torch, self.type)
        self.device = torch.device(self.type, self.index) if self.index is not None else device
        #: Phases can be timed with device events on this device.
        self.timed = self.accelerated and (hasattr(torch, "Event") or self.type == "cuda")
        self.is_cuda = self.accelerated and self.type == "cuda"
        #: The device error that ended perfhooks' use of the device ("Type: message"), or None.
        self.lost: str | None = None
        self._on_lost: list[Callable[[], None]] = []
        cuda = getattr(torch, "cuda", None)
        self._capturing: Callable[[], bool] | None = (getattr(cuda, "is_current_stream_capturing", None)
                                                      if self.is_cuda else None)
        C = getattr(torch, "_C", None)
        #: ``torch._C._cuda_getCurrentStream(index)``: the current stream's (id, device, type) from c10's
        #: thread-local, without building a Python ``Stream`` (what ``torch.cuda.current_stream`` costs).
        self._stream_id: Callable[[int], tuple[int, int, int]] | None = (
            getattr(C, "_cuda_getCurrentStream", None) if self.is_cuda else None)
        #: ``torch._C._cuda_memoryStats(index)``: the allocator's counters, nested, before torch flattens them.
        self._nested_stats: Callable[[int], dict[str, Any]] | None = (
            getattr(C, "_cuda_memoryStats", None) if self.is_cuda else None)
        #: Each stream's key and its ``Stream``, by key: a mark keeps the key kept here, so that the fresh tuple
        #: each lookup returns dies at once (a mark lives until the timing reader reads it, and a young object
        #: that outlives a garbage collector's pass is one the next pass must look at).
        self._streams: dict[tuple[int, int, int], tuple[tuple[int, int, int], Any]] = {}
        self._following = False

    # ------------------------------------------------------------------ errors and graph captures
    def lose(self, reason: str) -> None:
        """Stop using the device (a CUDA error): no call reaches it from now on; the callbacks run once."""
        if self.lost is not None:
            return
        self.lost = reason
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            callback()

    def when_lost(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (no argument) when the device is lost."""
        self._on_lost.append(callback)

    def usable(self) -> bool:
        """Whether perfhooks may call the device now: not lost, and the calling thread's current stream is not
        capturing a CUDA graph (``torch.cuda.is_current_stream_capturing``; a host-side query of the stream)."""
        if self.lost is not None:
            return False
        if self._capturing is None:
            return True
        try:
            return not self._capturing()
        except Exception as error:
            if is_device_error(error):
                self.lose(f"{type(error).__name__}: {error}")
                return False
            raise

    def follow_captures(self) -> None:
        """Follow ``torch.cuda.graph`` (:mod:`capture_watch`) for this room's life (:meth:`release`)."""
        if self.is_cuda and not self._following:
            self._following = capture_watch.follow(self._torch)

    def release(self) -> None:
        """The run is over: stop following captures (idempotent)."""
        if self._following:
            self._following = False
            capture_watch.let_go()
        self._streams.clear()

    def free(self) -> bool:
        """Whether a call may reach the device now, asking the stream only while a ``torch.cuda.graph`` capture
        is open somewhere in the process (:func:`capture_watch.active`); else no call at all."""
        if self.lost is not None:
            return False
        return not capture_watch.active() or self.usable()

    def failed(self, error: Exception) -> None:
        """A call perfhooks made directly raised ``error``: a device error marks the device lost and raises
        :class:`DeviceLost`; anything else is re-raised."""
        if is_device_error(error):
            self.lose(f"{type(error).__name__}: {error}")
            raise DeviceLost(self.lost) from error
        raise error

    # ------------------------------------------------------------------ description
    def describe(self) -> dict[str, Any]:
        """``{"type", "name"}`` plus ``index`` on an accelerator, for the report."""
        if not self.accelerated:
            from perfhooks.device.describe import cpu_model

            return {"type": "cpu", "name": cpu_model()} if self.type == "cpu" else {"type": self.type,
                                                                                     "name": str(self.device)}
        return {"type": self.type, "name": _device_name(self._torch, self.type, self.index), "index": self.index}

    # ------------------------------------------------------------------ timing
    def new_event(self) -> Any:
        """A timing event for this device (created on the device at its first record, as torch does)."""
        torch = self._torch
        if hasattr(torch, "Event"):
            return torch.Event(device=self.device, enable_timing=True)
        return torch.cuda.Event(enable_timing=True)

    @_device_call
    def stream(self) -> Any:
        """This device's current stream (the one the training loop's kernels go to)."""
        torch = self._torch
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "current_stream"):
            return accelerator.current_stream(self.index)
        return torch.cuda.current_stream(self.index)

    @_device_call
    def record(self, event: Any) -> None:
        """Record ``event`` on this device's current stream: it completes when the stream gets there."""
        event.record(self.stream())

    def _stream_of(self, key: tuple[int, int, int]) -> tuple[tuple[int, int, int], Any]:
        """The kept key and ``Stream`` of the stream ``key`` names (made at its first mark)."""
        known = self._streams.get(key)
        if known is None:
            stream = self._torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
            known = self._streams[key] = (key, stream)
        return known

    def record_current(self, event: Any) -> Any:
        """Record ``event`` on this device's current stream; the stream's key (marks on one stream complete in
        order). The stream is found by its id and its ``Stream`` object kept, so a record is one device call.
        Raises :class:`DeviceLost` after a device error."""
        if self.lost is not None:
            raise DeviceLost(self.lost)
        try:
            if self._stream_id is not None:
                key, stream = self._stream_of(self._stream_id(self.index))  # type: ignore[arg-type]
                event.record(stream)
                return key
            stream = self.stream()
            event.record(stream)
            return (getattr(stream, "stream_id", id(stream)), self.index, 0)
        except DeviceLost:
            raise
        except Exception as error:
            self.failed(error)
            raise  # not reached: failed() raises

    def current_recorder(self) -> Callable[[Any], Any]:
        """``record(event)``: :meth:`record_current` made for a step's marks (the stream's lookup and the record,
        its names bound once: the training thread calls it six times a step). The caller stops calling it once the
        device is lost (:meth:`when_lost`); a device error raises :class:`DeviceLost`."""
        lookup = self._stream_id
        if lookup is None:
            return self.record_current
        index, streams, known, failed = self.index, self._streams, self._stream_of, self.failed

        def record(event: Any) -> tuple[int, int, int]:
            try:
                key = lookup(index)
                key, stream = streams.get(key) or known(key)
                event.record(stream)
                return key
            except Exception as error:
                failed(error)  # raises: DeviceLost after a device error, else the error itself
                raise

        return record

    @_device_call
    def query(self, event: Any) -> bool:
        """Whether ``event`` has completed (never blocks)."""
        return bool(event.query())

    def peak_clock_khz(self) -> int | None:
        """The device's peak SM clock (kHz: clock cycles a millisecond at most, ``clock_rate`` of its properties), or
        None where torch does not say it (a CUDA build that leaves it 0, another accelerator)."""
        if not self.is_cuda:
            return None
        try:
            rate = int(getattr(self._torch.cuda.get_device_properties(self.index), "clock_rate", 0) or 0)
        except Exception:
            return None
        return rate if rate > 0 else None

    def cuda_settings(self) -> dict[str, Any]:
        """The CUDA settings the settings audit reads (host-side queries, no device work): the compute
        capability (``[major, minor]``), ``torch.cuda.get_sync_debug_mode()``, cuDNN's determinism and benchmark
        switches and the float32 matmul precision; each where this torch has it. Empty off CUDA."""
        if not self.is_cuda:
            return {}
        torch, found = self._torch, {}
        try:
            major, minor = torch.cuda.get_device_capability(self.index)
            found["capability"] = [int(major), int(minor)]
        except Exception:
            pass
        get_mode = getattr(torch.cuda, "get_sync_debug_mode", None)
        if get_mode is not None:
            with contextlib.suppress(Exception):
                found["sync_debug_mode"] = int(get_mode())
        cudnn = getattr(getattr(torch, "backends", None), "cudnn", None)
        if cudnn is not None:
            found["cudnn_deterministic"] = bool(getattr(cudnn, "deterministic", False))
        found["float32_matmul_precision"] = str(torch.get_float32_matmul_precision())
        return found

    @_device_call
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Device time between two completed events (ms)."""
        return float(start.elapsed_time(end))

    def thread_timer(self, release_gil: bool = True) -> Any:
        """An interval timer for completed events for the calling thread, which releases the GIL unless told not
        to (:func:`~perfhooks.device.cuda_extras.event_timer`; CUDA only, once torch has initialized it: the timer
        sets the thread's device, which would otherwise make a context), or None."""
        if not self.is_cuda or self.lost is not None:
            return None
        from perfhooks.device import cuda_extras

        if not cuda_extras.is_initialized():
            return None

        try:
            return cuda_extras.event_timer(self.index, release_gil)  # type: ignore[arg-type]
        except Exception:  # an unexpected ctypes failure: torch's timer serves
            return None

    @_device_call
    def wait(self, event: Any, deadline: float) -> bool:
        """Poll until ``event`` completes or ``time.monotonic()`` passes ``deadline``; whether it completed.
        Never blocks past the deadline (``Event.synchronize`` could wait for ever on a hung device)."""
        while not event.query():
            if monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def drained(self, deadline: float) -> bool:
        """Whether the work queued so far on this device's stream finishes before ``deadline`` (polled)."""
        if not self.timed:
            return True
        event = self.new_event()
        self.record(event)
        return self.wait(event, deadline)

    def queue_state(self, wait_s: float = 0.1) -> str:
        """The device's queue now: ``drained``, ``busy`` (work still queued after ``wait_s`` seconds), or ``none``
        (no device timing: a CPU). One recorded event, polled; never a synchronize."""
        if not self.timed:
            return "none"
        return "drained" if self.drained(monotonic() + wait_s) else "busy"

    # ------------------------------------------------------------------ memory
    @_device_call
    def memory(self) -> MemoryFigures:
        """The allocator's figures for this device (no sync: counters kept by the caching allocator). On CUDA
        they are read nested, as the allocator gives them (torch's ``memory_stats()`` flattens and sorts ~150
        keys in Python first: tens of µs)."""
        if self._nested_stats is not None:
            nested = self._nested_stats(self.index)  # type: ignore[arg-type]

            def get(key: str) -> int:
                value: Any = nested
                for part in key.split("."):
                    value = value.get(part) if isinstance(value, dict) else None
                return int(value or 0)
        else:
            torch = self._torch
            accelerator = getattr(torch, "accelerator", None)
            if accelerator is not None and hasattr(accelerator, "memory_stats"):
                stats = accelerator.memory_stats(self.index)
            else:
                stats = torch.cuda.memory_stats(self.index)

            def get(key: str) -> int:
                return int(stats.get(key, 0) or 0)

        return MemoryFigures(
            allocated_bytes=get("allocated_bytes.all.current"), reserved_bytes=get("reserved_bytes.all.current"),
            active_bytes=get("active_bytes.all.current"), peak_allocated_bytes=get("allocated_bytes.all.peak"),
            num_alloc_retries=get("num_alloc_retries"), num_ooms=get("num_ooms"))

    @_device_call
    def memory_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of this device, from the driver: what every process and the context hold."""
        torch = self._torch
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "get_memory_info"):
            free, total = accelerator.get_memory_info(self.index)
        else:
            free, total = torch.cuda.mem_get_info(self.index)
        return int(free), int(total)

    @_device_call
    def allowed_bytes(self, total: int) -> int | None:
        """The per-process cap (``set_per_process_memory_fraction``) in bytes when one is below the device's
        total, else None. CUDA only; None elsewhere."""
        if not self.is_cuda:
            return None
        getter = getattr(self._torch.cuda, "get_per_process_memory_fraction", None)
        if getter is None:
            return None
        fraction = float(getter(self.index))
        return int(fraction * total) if 0.0 < fraction < 1.0 else None


def _backend_available(torch: Any, kind: str) -> bool:
    module = getattr(torch, kind, None)
    available = getattr(module, "is_available", None)
    try:
        return bool(available()) if callable(available) else False
    except Exception:
        return False


def _current_index(torch: Any, kind: str) -> int:
    """The current device of backend ``kind``, read once when the run starts (the index the run is bound to)."""
    module = getattr(torch, kind)
    return int(module.current_device())


def _device_name(torch: Any, kind: str, index: int | None) -> str:
    getter = getattr(getattr(torch, kind, None), "get_device_name", None)
    try:
        return str(getter(index)) if callable(getter) else f"{kind}:{index}"
    except Exception:
        return f"{kind}:{index}"
