"""A simulated CUDA device for tests on machines without a GPU, held to torch 2.13's own sources.

    with simulated_cuda(devices=2, memory_bytes=8 << 30) as gpu:   # torch.cuda.is_available() is now True
        gpu.run(30.0)             # a kernel of 30 ms on the current stream of the current device; returns at once
        gpu.run(30.0, device=1)   # ... on device 1
        gpu.hang()                # a kernel that never completes
        h = gpu.alloc(256 << 20, device=1)   # through the simulated caching allocator; may raise OutOfMemoryError
        gpu.free(h)

Simulated time is the host's real clock (``time.perf_counter``). A kernel submitted at time t runs from
max(t, the end of its stream's queued work) for its duration, so a host that sleeps while kernels are queued
behaves as on a real GPU. Each behaviour comes from torch's sources (``tests/device/test_simulated_gpu.py``
checks the constants, messages and signatures against the installed wheel's files):

- events (``c10/cuda/CUDAEvent.h``): created on the device at their first ``record``, and bound to it (recording
  on another device's stream raises "Event device X does not match recording stream's device Y."); ``query()`` is
  True before any record, then False until the stream reaches the event; ``elapsed_time`` raises ``ValueError``
  when timing is off or an event was never recorded, ``RuntimeError`` when one is not complete, and CUDA's
  "invalid resource handle" when the devices differ; ``torch.cuda.Event().record()`` uses the *current device's*
  current stream;
- the caching allocator (``c10/core/AllocatorConfig.h``; ``CUDACachingAllocator.cpp``'s ``malloc``,
  ``alloc_block``, ``get_allocation_size``, ``round_size``): sizes rounded up to 512 bytes; requests of at most
  1 MiB from 2 MiB segments of the small pool, below 10 MiB from 20 MiB segments, larger ones rounded up to
  2 MiB; best fit in the pool with splitting; a failed cudaMalloc frees the cached segments and tries again, and
  that last try counts in ``num_alloc_retries``; a per-process fraction caps the reserved bytes; an OOM counts
  in ``num_ooms``, calls each observer with ``(device, alloc_size, cap if a fraction is set else device_total,
  device_free)`` and raises ``torch.OutOfMemoryError`` with torch's message;
- the history (``torch/cuda/memory.py`` ``_record_memory_history``): ``enabled=None`` off, ``"state"`` stacks on
  live blocks only, ``"all"`` trace entries too; ``_cuda_isHistoryEnabled``;
- snapshots: ``segments``, ``device_traces`` (with ``oom`` entries), ``allocator_settings``,
  ``external_annotations``: what ``torch.cuda._memory_viz`` reads;
- ``synchronize`` and ``cudaProfilerStart/Stop`` are recorded (``gpu.syncs``, ``gpu.profiler_calls``). A blocking
  wait on a hung device raises :class:`SimulatedHang` after ``hang_guard_s`` instead of hanging the test suite.

- streams (``c10/cuda/CUDAStream.h``, ``torch/cuda/streams.py``): the current device and each device's current
  stream are per thread; ``torch.cuda.Stream()`` makes a side stream with its own queue, ``torch.cuda.stream(s)``
  (torch's own ``StreamContext``) selects it, ``wait_stream``/``wait_event``/``record_event`` order them, and a
  device ``synchronize`` waits for every stream of the device;
- CUDA graphs (``torch/cuda/graphs.py``; torch's own ``torch.cuda.graph`` drives the simulated ``CUDAGraph``):
  while a stream captures, ``is_current_stream_capturing()`` is True on it, kernels and event records are
  captured rather than run, and a query or synchronize (of a stream, an event or the device) or
  ``mem_get_info`` raises CUDA's "operation not permitted when stream is capturing" and invalidates the capture:
  ``capture_end`` then raises, and the graph cannot ``replay()``;
- a sticky error (``gpu.fail()``) reaches every call that touches the device, and each is counted
  (``gpu.calls_after_error``);
- a snapshot costs time that grows with its entries (``snapshot_us_per_entry``, the history's and the blocks');
- every device call costs host time, as on a real GPU: a spin of ``call_cost_us[kind]`` µs (an event record
  2.5 µs, a query 1 µs, a capture check 0.5 µs, a Python ``Stream`` built by ``current_stream`` 4.4 µs, a full
  ``memory_stats`` read 30 µs, ``mem_get_info`` 6 µs: the figures measured on H100s and reported by PyTorch's
  own issues), and each is counted by kind in ``gpu.calls`` (a ``collections.Counter``), so a test can bound
  the calls a step makes and a benchmark can see what they cost.

What it cannot show: real timing accuracy, kernel overlap between streams, CUPTI and Nsight Systems, NCCL, and
any kernel launched by real CUDA tensors (this is a CPU build: tensors stay on the CPU).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

_current_thread = threading.current_thread
_perf_counter = time.perf_counter

# c10/core/AllocatorConfig.h
K_SMALL_BUFFER = 2097152
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1048576
K_MIN_LARGE_ALLOC = 10485760
K_ROUND_LARGE = 2097152
# c10/cuda/CUDACachingAllocator.cpp (not shipped in the wheel): large allocations below kMinLargeAlloc
K_LARGE_BUFFER = 20971520

# c10/cuda/CUDAEvent.h
MSG_TIMING = "Both events must be created with argument 'enable_timing=True'."
MSG_RECORDED = "Both events must be recorded before calculating elapsed time."
MSG_COMPLETED = "Both events must be completed before calculating elapsed time."
MSG_DEVICE = "Event device {event} does not match recording stream's device {stream}."
# c10/cuda/impl/CUDAGuardImpl.h (the backend of torch.Event): a torch.Event made for one device, recorded on
# another device's stream
MSG_GENERIC_DEVICE = "Event device index {event} does not match recording stream's device index {stream}."
# cudaEventElapsedTime on events of two devices: cudaErrorInvalidResourceHandle, raised by C10_CUDA_CHECK
MSG_OTHER_DEVICE = "CUDA error: invalid resource handle"
ILLEGAL_ADDRESS = "CUDA error: an illegal memory access was encountered"
# CUDA runtime errors of stream capture (cudaErrorStreamCaptureUnsupported, cudaErrorStreamCaptureInvalidated),
# as C10_CUDA_CHECK words them: a query, synchronize or cudaMemGetInfo during a capture fails and invalidates it
CAPTURE_UNSUPPORTED = "CUDA error: operation not permitted when stream is capturing"
CAPTURE_INVALIDATED = "CUDA error: operation failed due to a previous error during capture"


#: Host cost of one device call by kind (µs of spin). Measured on real parts: ``cudaEventRecord`` about 2.5 µs
#: with timing on, ``cudaEventQuery`` and ``cudaEventElapsedTime`` about 1 µs, ``torch.cuda.current_stream()``
#: 4.4 µs (the Python ``Stream`` it builds, pytorch PR #78066), ``mem_get_info`` 5-12 µs (pytorch#174625), a
#: flattened ``memory_stats()`` of ~150 keys tens of µs; ``stream_id`` is c10's thread-local current stream
#: (``torch._C._cuda_getCurrentStream``: a tuple, no driver call).
CALL_COST_US = {"event_record": 2.5, "event_query": 1.0, "elapsed_time": 1.0, "capture_check": 0.5,
                "current_stream": 4.4, "memory_stats": 30.0, "memory_stats_nested": 8.0, "mem_get_info": 6.0,
                "synchronize": 1.0, "stream_id": 0.2, "kernel": 0.0}
#: The kinds that reach the driver or build a Python object per call: what "device calls" counts.
DEVICE_CALLS = frozenset(CALL_COST_US) - {"stream_id", "kernel"}


class SimulatedHang(AssertionError):
    """A blocking wait on a device that will never finish: on a real GPU, the process would hang here."""


def format_size(size: int) -> str:
    """CUDACachingAllocator.cpp ``format_size``: bytes up to 1 KiB, then KiB, MiB, GiB with two decimals."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def oom_message(alloc_size: int, device: int, total: int, free: int, allowed: int | None, allocated: int,
                reserved: int) -> str:
    """The text of ``torch.OutOfMemoryError`` from ``DeviceCachingAllocator::malloc`` (torch 2.13)."""
    allowed_info = f"{format_size(allowed)} allowed; " if allowed is not None else ""
    return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU {device} has a total capacity of "
            f"{format_size(total)} of which {format_size(free)} is free. {allowed_info}Of the allocated memory "
            f"{format_size(allocated)} is allocated by PyTorch, and {format_size(reserved - allocated)} is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


# ----------------------------------------------------------------------------- streams and events
class SimStream:
    """A device's stream: the time (``perf_counter`` seconds) its queued work ends; ``inf`` once a kernel hangs."""

    def __init__(self, gpu: SimulatedGpu, device_index: int, stream_id: int = 0) -> None:
        self._gpu = gpu
        self.device_index = device_index
        self.device_type = 1  # c10::DeviceType::CUDA
        self.stream_id = stream_id
        self.busy_until = 0.0

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def query(self) -> bool:
        self._gpu._check("Stream.query")
        self._gpu._forbidden_in_capture("Stream.query")
        return time.perf_counter() >= self.busy_until

    def synchronize(self) -> None:
        self._gpu._check("Stream.synchronize")
        self._gpu._forbidden_in_capture("Stream.synchronize")
        self._gpu.syncs.append(("stream", self.device_index))
        self._gpu._block_until(self.busy_until)

    def wait_stream(self, stream: SimStream) -> None:
        """Work queued here after this call starts once ``stream``'s work queued so far is done."""
        self._gpu._check("Stream.wait_stream")
        self.busy_until = max(self.busy_until, stream.busy_until)

    def wait_event(self, event: SimEvent) -> None:
        event.wait(self)

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event if event is not None else SimEvent(self._gpu, None, False)
        event.record(self)
        return event

    @property
    def capturing(self) -> bool:
        capture = self._gpu.capture
        return capture is not None and capture.stream == self

    def is_capturing(self) -> bool:
        """``torch.Stream.is_capturing`` (cudaStreamGetCaptureInfo): what ``Optimizer.step`` asks each step."""
        self._gpu._check("cudaStreamGetCaptureInfo")
        self._gpu.charge("capture_check")
        return self.capturing

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SimStream) and (other.device_index, other.stream_id) == (self.device_index,
                                                                                          self.stream_id)

    def __hash__(self) -> int:
        return hash((self.device_index, self.stream_id))


class SimEvent:
    """``torch.Event`` / ``torch.cuda.Event`` as ``c10/cuda/CUDAEvent.h`` implements them."""

    def __init__(self, gpu: SimulatedGpu, device: Any = None, enable_timing: bool = False,
                 generic: bool = False) -> None:
        self._gpu = gpu
        self._enable_timing = enable_timing
        self._preferred = None if device is None else torch.device(device).index
        #: torch.Event (InlineEvent over CUDAGuardImpl) rather than torch.cuda.Event (CUDAEvent.h): its messages
        self._generic = generic
        self._device_index: int | None = None  # set when created on a device (first record)
        self._completes_at: float | None = None
        #: recorded inside a graph capture: a node of the graph, not work the device will run now
        self._captured = False

    @property
    def device(self) -> torch.device | None:
        return None if self._device_index is None else torch.device("cuda", self._device_index)

    def record(self, stream: SimStream | None = None) -> None:
        gpu = self._gpu
        gpu._check("Event.record")
        gpu.charge("event_record")
        if stream is None:
            index = self._preferred if self._preferred is not None else gpu.current
            stream = gpu.current_stream(index)
        if self._generic:  # CUDAGuardImpl::record: the device the event was made for, if any
            bound = self._device_index if self._device_index is not None else self._preferred
            if bound is not None and bound != stream.device_index:
                raise RuntimeError(MSG_GENERIC_DEVICE.format(event=bound, stream=stream.device_index))
        elif self._device_index is not None and self._device_index != stream.device_index:
            raise RuntimeError(MSG_DEVICE.format(event=self._device_index, stream=stream.device_index))
        if self._device_index is None:
            self._device_index = stream.device_index
        gpu.initialized = True
        self._captured = stream.capturing
        self._completes_at = max(time.perf_counter(), stream.busy_until) if not self._captured else float("inf")
        gpu.events_recorded[stream.device_index] += 1

    def query(self) -> bool:
        self._gpu._check("Event.query")
        self._gpu.charge("event_query")
        self._gpu._forbidden_in_capture("Event.query")
        return self._complete()

    def _complete(self) -> bool:
        return self._completes_at is None or time.perf_counter() >= self._completes_at

    def elapsed_time(self, end: SimEvent) -> float:
        self._gpu._check("Event.elapsed_time")
        self._gpu.charge("elapsed_time")
        self._gpu._forbidden_in_capture("Event.elapsed_time")
        if not (self._enable_timing and end._enable_timing):
            raise ValueError(MSG_TIMING)
        if self._completes_at is None or end._completes_at is None:
            raise ValueError(MSG_RECORDED)
        if not (self._complete() and end._complete()):
            raise RuntimeError(MSG_COMPLETED)
        if self._device_index != end._device_index:
            raise torch.AcceleratorError(MSG_OTHER_DEVICE)
        return (end._completes_at - self._completes_at) * 1e3 * self._gpu.event_time_scale

    def raw_elapsed_ms(self, end: SimEvent) -> float:
        """What ``cudaEventElapsedTime`` gives for two completed events, read without a device call: the
        stand-in for perfhooks' ctypes timer (``cuda_extras.event_timer``), which this simulation cannot reach."""
        return (end._completes_at - self._completes_at) * 1e3 * self._gpu.event_time_scale  # type: ignore[operator]

    def synchronize(self) -> None:
        gpu = self._gpu
        gpu._check("Event.synchronize")
        gpu._forbidden_in_capture("Event.synchronize")
        gpu.syncs.append(("event", self._device_index))
        if self._completes_at is not None:
            gpu._block_until(self._completes_at)

    def wait(self, stream: SimStream | None = None) -> None:
        gpu = self._gpu
        gpu._check("Event.wait")
        stream = stream or gpu.current_stream()
        if self._completes_at is not None and not self._captured:
            stream.busy_until = max(stream.busy_until, self._completes_at)


# ----------------------------------------------------------------------------- the caching allocator
@dataclass
class Block:
    address: int
    size: int
    requested: int = 0
    allocated: bool = False
    frames: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Segment:
    device: int
    address: int
    size: int
    small: bool
    blocks: list[Block]
    frames: list[dict[str, Any]] = field(default_factory=list)


def round_size(size: int) -> int:
    """``round_size`` with no ``roundup_power2_divisions`` (the default): a multiple of 512 bytes, at least 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc gets for a request that fits no cached block."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class DeviceAllocator:
    """One device's caching allocator and its counters (``memory_stats`` keys)."""

    def __init__(self, gpu: SimulatedGpu, index: int, total: int) -> None:
        self.gpu = gpu
        self.index = index
        self.total = total
        self.outside = 0  # bytes held outside the allocator: the CUDA context, NCCL, other processes
        self.fraction: float | None = None
        self.segments: list[Segment] = []
        self.next_address = 0x7F0000000000 + index * (1 << 40)
        self.allocated = self.allocated_peak = 0
        self.num_alloc_retries = self.num_ooms = 0
        self.trace: list[dict[str, Any]] = []

    @property
    def reserved(self) -> int:
        return sum(segment.size for segment in self.segments)

    @property
    def free(self) -> int:
        """What the driver reports free: the device less the allocator's segments and what lies outside it."""
        return max(0, self.total - self.reserved - self.outside)

    @property
    def allowed(self) -> int | None:
        return int(self.fraction * self.total) if self.fraction is not None else None

    def malloc(self, orig_size: int) -> Block:
        size = round_size(orig_size)
        small = size <= K_SMALL_SIZE
        alloc_size = allocation_size(size)
        block = self._free_block(size, small)
        if block is None:
            block = (self._alloc_block(alloc_size, small, retry=False)
                     or (self._release_cached(small) and self._alloc_block(alloc_size, small, retry=False))
                     or ((self._release_cached(None) or True) and self._alloc_block(alloc_size, small, retry=True)))
        if not block:
            self._oom(alloc_size)
        segment = self._segment_of(block)
        remaining = block.size - size
        if (small and remaining >= K_MIN_BLOCK_SIZE) or (not small and remaining > K_SMALL_SIZE):
            rest = Block(block.address + size, remaining)
            block.size = size
            segment.blocks.insert(segment.blocks.index(block) + 1, rest)
        block.allocated, block.requested = True, orig_size
        block.frames = self.gpu._frames() if self.gpu.history else []
        self.allocated += block.size
        self.allocated_peak = max(self.allocated_peak, self.allocated)
        self._record("alloc", block.address, block.size)
        return block

    def release(self, block: Block) -> None:
        segment = self._segment_of(block)
        self._record("free_requested", block.address, block.size)
        block.allocated, block.requested, block.frames = False, 0, []
        self.allocated -= block.size
        merged = []
        for candidate in segment.blocks:  # coalesce free neighbours
            if merged and not merged[-1].allocated and not candidate.allocated:
                merged[-1].size += candidate.size
            else:
                merged.append(candidate)
        segment.blocks = merged
        self._record("free_completed", block.address, block.size)

    def empty_cache(self) -> None:
        self._release_cached(None)

    # internals
    def _free_block(self, size: int, small: bool) -> Block | None:
        candidates = [b for s in self.segments if s.small == small for b in s.blocks if not b.allocated
                      and b.size >= size]
        return min(candidates, key=lambda b: (b.size, b.address)) if candidates else None

    def _alloc_block(self, alloc_size: int, small: bool, retry: bool) -> Block | None:
        if retry:
            self.num_alloc_retries += 1
        allowed = self.allowed
        if allowed is not None and self.reserved + alloc_size > allowed:
            return None
        if alloc_size > self.free:
            return None
        segment = Segment(self.index, self.next_address, alloc_size, small, [])
        self.next_address += alloc_size
        segment.blocks.append(Block(segment.address, alloc_size))
        segment.frames = self.gpu._frames() if self.gpu.history else []
        self.segments.append(segment)
        self._record("segment_alloc", segment.address, alloc_size)
        return segment.blocks[0]

    def _release_cached(self, small: bool | None) -> bool:
        """Free the segments with nothing allocated in them (of one pool, or all); whether any was freed."""
        freed = [s for s in self.segments if (small is None or s.small == small)
                 and not any(b.allocated for b in s.blocks)]
        for segment in freed:
            self.segments.remove(segment)
            self._record("segment_free", segment.address, segment.size)
        return bool(freed)

    def _segment_of(self, block: Block) -> Segment:
        return next(s for s in self.segments if any(b is block for b in s.blocks))

    def _oom(self, alloc_size: int) -> None:
        free, allowed = self.free, self.allowed
        self.num_ooms += 1
        if self.gpu.history == "all":
            self.trace.append({"action": "oom", "size": alloc_size, "stream": 0, "device_free": free,
                               "frames": self.gpu._frames(), "time_us": int(time.time() * 1e6)})
        for observer in list(self.gpu.oom_observers):
            observer(self.index, alloc_size, allowed if allowed is not None else self.total, free)
        raise torch.OutOfMemoryError(oom_message(alloc_size, self.index, self.total, free, allowed, self.allocated,
                                                 self.reserved))

    def _record(self, action: str, address: int, size: int) -> None:
        if self.gpu.history == "all":
            self.trace.append({"action": action, "addr": address, "size": size, "stream": 0,
                               "frames": self.gpu._frames(), "time_us": int(time.time() * 1e6),
                               "compile_context": "", "user_metadata": self.gpu.metadata})
            del self.trace[:-self.gpu.history_entries]

    def stats(self) -> dict[str, Any]:
        """``_cuda_memoryStats``-shaped nested dict (the keys perfhooks and torch's flat view read)."""
        def pools(value_all: int, small: int, large: int, peak: int | None = None) -> dict[str, dict[str, int]]:
            return {"all": {"current": value_all, "peak": value_all if peak is None else peak},
                    "small_pool": {"current": small, "peak": small}, "large_pool": {"current": large, "peak": large}}

        small_alloc = sum(b.size for s in self.segments if s.small for b in s.blocks if b.allocated)
        small_res = sum(s.size for s in self.segments if s.small)
        return {"allocated_bytes": pools(self.allocated, small_alloc, self.allocated - small_alloc,
                                         self.allocated_peak),
                "reserved_bytes": pools(self.reserved, small_res, self.reserved - small_res),
                "active_bytes": pools(self.allocated, small_alloc, self.allocated - small_alloc, self.allocated_peak),
                "segment": pools(len(self.segments), sum(s.small for s in self.segments),
                                 sum(not s.small for s in self.segments)),
                "num_alloc_retries": self.num_alloc_retries, "num_ooms": self.num_ooms}

    def snapshot_segments(self) -> list[dict[str, Any]]:
        out = []
        for s in sorted(self.segments, key=lambda s: s.address):
            blocks = [{"address": b.address, "size": b.size, "requested_size": b.requested,
                       "state": "active_allocated" if b.allocated else "inactive", "frames": list(b.frames)}
                      for b in s.blocks]
            allocated = sum(b.size for b in s.blocks if b.allocated)
            out.append({"device": self.index, "address": s.address, "total_size": s.size,
                        "allocated_size": allocated, "active_size": allocated,
                        "requested_size": sum(b.requested for b in s.blocks if b.allocated), "stream": 0,
                        "segment_type": "small" if s.small else "large", "segment_pool_id": (0, 0),
                        "is_expandable": False, "frames": list(s.frames), "blocks": blocks})
        return out


# ----------------------------------------------------------------------------- CUDA graphs
@dataclass
class SimCapture:
    """A capture under way on ``stream``: what it recorded, and the first call that invalidated it."""

    stream: SimStream
    mode: str
    thread: threading.Thread
    kernels_ms: list[float] = field(default_factory=list)
    invalid_by: str | None = None


class SimCUDAGraph:
    """``torch.cuda.CUDAGraph``: ``capture_begin`` on the current stream, ``capture_end``, ``replay``."""

    def __init__(self, gpu: SimulatedGpu, keep_graph: bool = False) -> None:
        self._gpu = gpu
        self._kernels_ms: list[float] | None = None
        self._failed = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        gpu = self._gpu
        gpu._check("cudaStreamBeginCapture")
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got "
                               f"{capture_error_mode}")
        stream = gpu.current_stream()
        if stream == gpu.streams[stream.device_index]:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)")
        gpu.capture = SimCapture(stream, capture_error_mode, threading.current_thread())

    def capture_end(self) -> None:
        gpu = self._gpu
        capture, gpu.capture = gpu.capture, None
        if capture is None:
            raise RuntimeError("capture_end without capture_begin")
        if capture.invalid_by is not None:
            self._failed = True
            raise torch.AcceleratorError(CAPTURE_INVALIDATED)
        self._kernels_ms = list(capture.kernels_ms)

    def replay(self) -> None:
        gpu = self._gpu
        gpu._check("cudaGraphLaunch")
        if self._kernels_ms is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        stream = gpu.current_stream()
        stream.busy_until = max(time.perf_counter(), stream.busy_until) + sum(self._kernels_ms) / 1e3

    def reset(self) -> None:
        self._kernels_ms = None

    def pool(self) -> tuple[int, int]:
        return (0, id(self))


# ----------------------------------------------------------------------------- the simulated GPU
class SimulatedGpu:
    """The devices, their streams and allocators, and a record of what was called."""

    def __init__(self, devices: int, memory_bytes: int, name: str = "Simulated GPU", hang_guard_s: float = 20.0
                 ) -> None:
        self.count = devices
        self.name = name
        self.hang_guard_s = hang_guard_s
        self._local = threading.local()  # the current device and streams: per thread, as in CUDA
        self.initialized = False
        #: Each device's default stream; side streams (``torch.cuda.Stream()``) are in ``all_streams``.
        self.streams = [SimStream(self, i) for i in range(devices)]
        self.all_streams: list[SimStream] = list(self.streams)
        #: The capture under way (one at a time in a process, as torch documents), or None.
        self.capture: SimCapture | None = None
        #: Seconds a snapshot costs per entry (history entries and blocks): a long history is slow to take.
        self.snapshot_us_per_entry = 2.0
        #: ``torch.cuda._sleep``'s clock: cycles per millisecond (1 GHz).
        self.cycles_per_ms = 1e6
        #: What ``elapsed_time`` multiplies the true interval by: 1.0, or a broken device's timer for a test.
        self.event_time_scale = 1.0
        self.snapshots_taken: list[dict[str, Any]] = []
        self.allocators = [DeviceAllocator(self, i, memory_bytes) for i in range(devices)]
        self.events_recorded = [0] * devices
        self.syncs: list[tuple[str, int | None]] = []
        self.profiler_calls: list[str] = []
        #: The allocator's OOM observers: the process's, kept across simulations as torch keeps them (it has no
        #: way to detach one).
        self.oom_observers = PROCESS_OOM_OBSERVERS
        self.history: str | None = None  # None, "state" or "all"
        self.history_entries = 1 << 62
        self.metadata = ""
        self.error: BaseException | None = None
        #: The device calls made after ``fail()`` (each raised the sticky error).
        self.calls_after_error: list[str] = []
        self._handles: dict[int, tuple[int, Block]] = {}
        #: µs of host time each kind of call costs (a spin on the calling thread); set a kind to 0 to make it free.
        self.call_cost_us: dict[str, float] = dict(CALL_COST_US)
        #: The calls made, by kind (the user's kernels under ``kernel``).
        self.calls: collections.Counter[str] = collections.Counter()
        #: The same, by (thread, kind) (:attr:`calls_by_thread` names the threads when read): counting stays
        #: cheap, so the test bed's own Python adds little to a step it charges.
        self._calls_by_thread: dict[tuple[threading.Thread, str], int] = {}

    def charge(self, kind: str) -> None:
        """Count one call of ``kind`` and spend its host cost (a spin: the calling thread is busy, as in a driver
        call)."""
        self.calls[kind] += 1
        self._count_thread(kind)
        cost = self.call_cost_us.get(kind, 0.0)
        if cost > 0.0:
            until = _perf_counter() + cost / 1e6
            while _perf_counter() < until:
                pass

    def _count_thread(self, kind: str) -> None:
        key = (_current_thread(), kind)
        counts = self._calls_by_thread
        counts[key] = counts.get(key, 0) + 1

    @property
    def calls_by_thread(self) -> collections.Counter[tuple[str, str]]:
        """The calls made, by (thread name, kind): what the training thread pays and what perfhooks' threads do
        (a new Counter at each read)."""
        out: collections.Counter[tuple[str, str]] = collections.Counter()
        for (thread, kind), count in list(self._calls_by_thread.items()):
            out[thread.name, kind] += count
        return out

    def device_calls(self) -> int:
        """Device calls so far, every kind that reaches the driver (not the user's kernels)."""
        return sum(count for kind, count in self.calls.items() if kind in DEVICE_CALLS)

    # ------------------------------------------------------------------ the calling thread's device and streams
    @property
    def current(self) -> int:
        return getattr(self._local, "device", 0)

    @current.setter
    def current(self, index: int) -> None:
        self._local.device = index

    def current_stream(self, device: int | None = None) -> SimStream:
        """The calling thread's current stream on ``device`` (its default stream until one is selected)."""
        index = self.current if device is None else device
        selected = getattr(self._local, "streams", {})
        return selected.get(index, self.streams[index])

    def set_stream(self, stream: SimStream) -> None:
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        self._local.streams[stream.device_index] = stream

    def new_stream(self, device: int | None = None) -> SimStream:
        index = self.current if device is None else device
        stream = SimStream(self, index, stream_id=len(self.all_streams))
        self.all_streams.append(stream)
        return stream

    # ------------------------------------------------------------------ what tests do
    def run(self, ms: float, device: int | None = None) -> None:
        """A kernel of ``ms`` milliseconds on the current stream of ``device`` (default: the current device);
        inside a capture, a node of the graph (it runs at each ``replay()``)."""
        self._check("kernel")
        self.calls["kernel"] += 1
        self._count_thread("kernel")
        stream = self.current_stream(device)
        if stream.capturing:
            self.capture.kernels_ms.append(ms)  # type: ignore[union-attr]
            return
        stream.busy_until = max(time.perf_counter(), stream.busy_until) + ms / 1e3
        self.initialized = True

    def hang(self, device: int | None = None) -> None:
        """A kernel that never completes: everything queued after it waits for ever."""
        self.current_stream(device).busy_until = float("inf")

    def idle(self, device: int | None = None) -> float:
        """Seconds until ``device``'s queued work ends on every stream (0 when idle)."""
        index = self.current if device is None else device
        return max(0.0, max(s.busy_until for s in self.all_streams if s.device_index == index) - time.perf_counter())

    def alloc(self, size: int, device: int | None = None) -> int:
        """``size`` bytes through the device's caching allocator; a handle for :meth:`free`."""
        self._check("alloc")
        index = self.current if device is None else device
        block = self.allocators[index].malloc(size)
        self.initialized = True
        handle = block.address
        self._handles[handle] = (index, block)
        return handle

    def free(self, handle: int) -> None:
        index, block = self._handles.pop(handle)
        self.allocators[index].release(block)

    def hold_outside(self, size: int, device: int | None = None) -> None:
        """Memory taken outside the allocator (the CUDA context, NCCL buffers, another process)."""
        self.allocators[self.current if device is None else device].outside = size

    def fail(self, message: str = ILLEGAL_ADDRESS) -> torch.AcceleratorError:
        """A sticky CUDA error (an illegal memory access): every device call from now on raises it."""
        self.error = torch.AcceleratorError(message)
        return self.error

    # ------------------------------------------------------------------ internals
    def _check(self, name: str) -> None:
        if self.error is not None:
            self.calls_after_error.append(name)
            raise self.error

    def _forbidden_in_capture(self, name: str) -> None:
        """A query, synchronize or cudaMemGetInfo while a capture is under way (``global`` mode: from any thread)
        fails, and the capture is invalidated."""
        capture = self.capture
        if capture is not None and (capture.mode == "global" or capture.thread is threading.current_thread()):
            capture.invalid_by = capture.invalid_by or name
            raise torch.AcceleratorError(CAPTURE_UNSUPPORTED)

    def _block_until(self, until: float) -> None:
        deadline = time.perf_counter() + self.hang_guard_s
        while time.perf_counter() < until:
            if time.perf_counter() >= deadline:
                raise SimulatedHang("a blocking wait on a device that never finishes (a real process hangs here)")
            time.sleep(min(0.001, max(0.0, until - time.perf_counter())))

    def _frames(self) -> list[dict[str, Any]]:
        stack = traceback.extract_stack()[:-3]
        return [{"filename": f.filename, "line": f.lineno or 0, "name": f.name} for f in reversed(stack)]

    def _index(self, device: Any) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        index = torch.device(device).index if not isinstance(device, torch.device) else device.index
        return self.current if index is None else index

    def snapshot(self) -> dict[str, Any]:
        self._check("snapshot")
        segments = [s for a in self.allocators for s in a.snapshot_segments()]
        traces = [list(a.trace) for a in self.allocators]
        entries = sum(map(len, traces)) + sum(len(s["blocks"]) for s in segments)
        self.snapshots_taken.append({"thread": threading.current_thread().name, "entries": entries})
        time.sleep(entries * self.snapshot_us_per_entry / 1e6)
        return {"segments": segments, "device_traces": traces,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                       "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                                       "pinned_use_cuda_host_register": False,
                                       "roundup_power2_divisions": {str(2**i): 0 for i in range(16)}},
                "external_annotations": []}


# ----------------------------------------------------------------------------- installing it
def _flat(nested: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        else:
            flat[prefix] = value

    walk("", nested)
    return dict(sorted(flat.items()))


def _installs(gpu: SimulatedGpu) -> dict[tuple[Any, str], Any]:
    """Every torch attribute the simulation replaces, with its replacement."""
    cuda, accelerator, C = torch.cuda, torch.accelerator, torch._C

    def checked(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            gpu._check(name)
            return fn(*args, **kwargs)

        return call

    def set_device(device: Any) -> None:
        index = gpu._index(device)
        if not 0 <= index < gpu.count:
            raise torch.AcceleratorError("CUDA error: invalid device ordinal")
        gpu.current = index

    def synchronize(device: Any = None) -> None:
        index = gpu._index(device)
        gpu.charge("synchronize")
        gpu._forbidden_in_capture("synchronize")
        gpu.syncs.append(("device", index))
        gpu._block_until(max(s.busy_until for s in gpu.all_streams if s.device_index == index))

    class cuda_event(SimEvent):
        """``torch.cuda.Event``: a class, as in torch (dynamo and users ask ``isinstance(x, torch.cuda.Event)``)."""

        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                     external: bool = False) -> None:
            super().__init__(gpu, None, enable_timing)

    class generic_event(SimEvent):
        """``torch.Event``: a class, as in torch (dynamo asks ``isinstance(value, torch.Event)``)."""

        def __init__(self, device: Any = None, *, enable_timing: bool = False, blocking: bool = False,
                     interprocess: bool = False) -> None:
            super().__init__(gpu, device, enable_timing, generic=True)

    class Stream(SimStream):
        """``torch.cuda.Stream``: a class (annotations such as ``torch.cuda.Stream | None`` are evaluated at run
        time); constructing it makes a side stream of the simulation."""

        def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> SimStream:  # type: ignore[misc]
            if "stream_id" in kwargs:  # torch/cuda/streams.py: a Python handle on an existing stream, no creation
                index, stream_id = kwargs.get("device_index", gpu.current), kwargs["stream_id"]
                for stream in gpu.all_streams:
                    if (stream.device_index, stream.stream_id) == (index, stream_id):
                        return stream
                raise RuntimeError(f"no stream {stream_id} on device {index}")
            gpu._check("cudaStreamCreate")
            return gpu.new_stream(None if device is None else gpu._index(device))

    def set_stream(stream: SimStream | None) -> None:
        if stream is not None:
            gpu.set_stream(stream)

    def capturing() -> bool:  # cudaStreamGetCaptureInfo on the current stream: a device call
        gpu._check("cudaStreamGetCaptureInfo")
        gpu.charge("capture_check")
        return gpu.current_stream().capturing

    def exchange_device(index: int) -> int:
        previous = gpu.current
        if index >= 0:
            gpu.current = index
        return previous

    def stats(device: Any = None) -> dict[str, Any]:
        gpu.charge("memory_stats")
        return _flat(gpu.allocators[gpu._index(device)].stats())

    def nested_stats(device: Any) -> dict[str, Any]:
        gpu.charge("memory_stats_nested")
        return gpu.allocators[gpu._index(device)].stats()

    def counter(name: str) -> Callable[[Any], int]:
        """``memory_allocated`` and its kin: torch reads them from a whole ``memory_stats()``."""
        def read(device: Any = None) -> int:
            gpu.charge("memory_stats")
            return getattr(gpu.allocators[gpu._index(device)], name)

        return read

    def stream_id(device: Any = None) -> tuple[int, int, int]:
        """``torch._C._cuda_getCurrentStream``: (stream_id, device_index, device_type) of the calling thread's
        current stream on ``device`` (c10's thread-local: no driver call)."""
        gpu.charge("stream_id")
        stream = gpu.current_stream(gpu._index(device))
        return stream.stream_id, stream.device_index, stream.device_type

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        gpu.charge("mem_get_info")
        gpu._forbidden_in_capture("mem_get_info")
        allocator = gpu.allocators[gpu._index(device)]
        return allocator.free, allocator.total

    def set_fraction(fraction: float, device: Any = None) -> None:
        gpu.allocators[gpu._index(device)].fraction = float(fraction)

    def get_fraction(device: Any = None) -> float:
        fraction = gpu.allocators[gpu._index(device)].fraction
        return 1.0 if fraction is None else fraction

    def record_history(enabled: Any = "all", context: Any = "all", stacks: str = "all", max_entries: int = 1 << 62,
                       device: Any = None, clear_history: bool = False, compile_context: bool = False,
                       global_record_annotations: bool = False, skip_actions: list[str] | None = None) -> None:
        if enabled not in (None, "state", "all"):
            raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
        gpu.history = enabled
        gpu.history_entries = max_entries
        if enabled is None:
            for allocator in gpu.allocators:
                allocator.trace.clear()

    def set_metadata(metadata: str) -> None:
        gpu.metadata = metadata

    def attach_observer(observer: Callable[[int, int, int, int], None]) -> None:
        gpu.oom_observers.append(observer)

    def profiler_call(name: str) -> Callable[[], None]:
        def call() -> None:
            gpu.profiler_calls.append(name)

        return call

    def empty_cache() -> None:
        for allocator in gpu.allocators:
            allocator.empty_cache()

    def current_stream(device: Any = None) -> SimStream:
        gpu.charge("current_stream")
        return gpu.current_stream(gpu._index(device))

    # torch/cuda/random.py: each device's generator state, a ByteTensor (frameworks save and restore it)
    rng = [torch.zeros(16, dtype=torch.uint8) for _ in range(gpu.count)]

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return rng[gpu._index(device)].clone()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        rng[gpu._index(device)] = new_state.clone()

    def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
        for index, state in enumerate(new_states):
            set_rng_state(state, index)

    installs = {
        (cuda, "is_available"): lambda: True,
        (cuda, "is_initialized"): lambda: gpu.initialized,
        (cuda, "device_count"): lambda: gpu.count,
        (cuda, "current_device"): lambda: gpu.current,
        (cuda, "set_device"): checked("set_device", set_device),
        (cuda, "get_device_name"): lambda device=None: f"{gpu.name} {gpu._index(device)}",
        # its peak clock in kHz is the rate of torch.cuda._sleep's cycles (a kernel never runs faster)
        (cuda, "get_device_properties"): lambda device=None: SimpleNamespace(
            name=f"{gpu.name} {gpu._index(device)}", major=9, minor=0, multi_processor_count=132,
            total_memory=gpu.allocators[gpu._index(device)].total, clock_rate=int(gpu.cycles_per_ms)),
        (cuda, "synchronize"): checked("synchronize", synchronize),
        (cuda, "current_stream"): checked("current_stream", current_stream),
        (cuda, "default_stream"): checked("default_stream", lambda device=None: gpu.streams[gpu._index(device)]),
        (cuda, "Stream"): Stream,
        (cuda, "set_stream"): set_stream,
        (cuda, "_exchange_device"): exchange_device,
        (cuda, "_maybe_exchange_device"): exchange_device,
        (cuda, "CUDAGraph"): lambda keep_graph=False: SimCUDAGraph(gpu, keep_graph),
        (cuda.graphs, "CUDAGraph"): lambda keep_graph=False: SimCUDAGraph(gpu, keep_graph),
        (cuda, "is_current_stream_capturing"): capturing,
        (cuda.graphs, "is_current_stream_capturing"): capturing,
        (cuda.graphs, "_cuda_isCurrentStreamCapturing"): capturing,
        (cuda.graphs.graph, "default_capture_stream"): None,  # a class attribute: a stream of this simulation
        (C, "_cuda_isCurrentStreamCapturing"): capturing,
        (C, "_host_emptyCache"): lambda: None,
        (cuda, "Event"): cuda_event,
        (cuda, "memory_stats"): checked("memory_stats", stats),
        (cuda, "memory_allocated"): counter("allocated"),
        (cuda, "max_memory_allocated"): counter("allocated_peak"),
        (cuda, "memory_reserved"): counter("reserved"),
        (cuda, "mem_get_info"): checked("mem_get_info", mem_get_info),
        (cuda, "empty_cache"): empty_cache,
        (cuda, "set_per_process_memory_fraction"): set_fraction,
        (cuda, "get_per_process_memory_fraction"): checked("get_per_process_memory_fraction", get_fraction),
        (cuda.memory, "_record_memory_history"): checked("_record_memory_history", record_history),
        (cuda.memory, "_snapshot"): lambda device=None, augment_with_fx_traces=False: gpu.snapshot(),
        (cuda.memory, "_set_memory_metadata"): set_metadata,
        (cuda.profiler, "start"): checked("cudaProfilerStart", profiler_call("start")),
        (cuda.profiler, "stop"): checked("cudaProfilerStop", profiler_call("stop")),
        (C, "_cuda_isHistoryEnabled"): lambda: gpu.history is not None,
        (C, "_cuda_attach_out_of_memory_observer"): attach_observer,
        (C, "_cuda_getDeviceCount"): lambda: gpu.count,
        (C, "_cuda_getDevice"): lambda: gpu.current,
        (C, "_cuda_setDevice"): set_device,
        (C, "_cuda_getMemoryFraction"): get_fraction,
        (C, "_cuda_setMemoryFraction"): lambda fraction, device: set_fraction(fraction, device),
        (C, "_cuda_memoryStats"): nested_stats,
        (C, "_cuda_getCurrentStream"): stream_id,
        (accelerator, "is_available"): lambda: True,
        (accelerator, "current_accelerator"): lambda check_available=False: torch.device("cuda"),
        (accelerator, "device_count"): lambda: gpu.count,
        (accelerator, "current_device_index"): lambda: gpu.current,
        (accelerator, "set_device_index"): set_device,
        (accelerator, "current_stream"): checked("current_stream", current_stream),
        (accelerator, "synchronize"): checked("synchronize", synchronize),
        (accelerator, "memory_stats"): checked("memory_stats", stats),
        (accelerator, "memory_allocated"): counter("allocated"),
        (accelerator, "max_memory_allocated"): counter("allocated_peak"),
        (accelerator, "get_memory_info"): checked("get_memory_info", mem_get_info),
        (torch, "Event"): generic_event,
        (cuda, "_sleep"): checked("_sleep", lambda cycles: gpu.run(cycles / gpu.cycles_per_ms)),
    }
    for module in (cuda, cuda.random):  # called as torch.cuda.get_rng_state and torch.cuda.random.get_rng_state
        installs.update({
            (module, "get_rng_state"): checked("get_rng_state", get_rng_state),
            (module, "get_rng_state_all"): checked("get_rng_state", lambda: [get_rng_state(i) for i in
                                                                               range(gpu.count)]),
            (module, "set_rng_state"): checked("set_rng_state", set_rng_state),
            (module, "set_rng_state_all"): checked("set_rng_state", set_rng_state_all)})
    # a sticky error reaches every call that touches the device: the allocator's counters and the driver's figures
    for key in ((cuda, "memory_allocated"), (cuda, "max_memory_allocated"), (cuda, "memory_reserved"),
                (cuda, "empty_cache"), (cuda, "set_per_process_memory_fraction"), (cuda.memory, "_snapshot"),
                (C, "_cuda_getMemoryFraction"), (C, "_cuda_memoryStats"), (accelerator, "memory_allocated"),
                (accelerator, "max_memory_allocated")):
        installs[key] = checked(key[1], installs[key])
    return installs


_MISSING = object()
#: Observers attached in this process (``_cuda_attach_out_of_memory_observer``): they outlive any one simulation.
PROCESS_OOM_OBSERVERS: list[Callable[[int, int, int, int], None]] = []


@contextlib.contextmanager
def simulated_cuda(devices: int = 1, memory_bytes: int = 8 << 30, name: str = "Simulated GPU",
                   hang_guard_s: float = 20.0) -> Iterator[SimulatedGpu]:
    """Install a simulated CUDA with ``devices`` devices of ``memory_bytes`` each; every patch is undone after."""
    # Modules that read torch.cuda.is_available() at import time to bind real CUDA symbols (dynamo's device
    # interface, which torch.profiler imports): imported before the simulation is installed, as on a CPU build.
    import torch._dynamo
    import torch.profiler  # noqa: F401

    gpu = SimulatedGpu(devices, memory_bytes, name, hang_guard_s)
    saved = []
    try:
        for (owner, attribute), replacement in _installs(gpu).items():
            saved.append((owner, attribute, owner.__dict__.get(attribute, _MISSING)))
            setattr(owner, attribute, replacement)
        yield gpu
    finally:
        for owner, attribute, value in reversed(saved):
            if value is _MISSING:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, value)


class RealGpu:
    """The same test interface on a real CUDA device (``run``, ``alloc``, ``free``), for the tests that run on
    both: the simulation always, the real GPU where one is present."""

    simulated = False

    def __init__(self) -> None:
        torch.cuda.synchronize()
        self._held: dict[int, torch.Tensor] = {}
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # warm up, then time one known kernel
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        self.cycles_per_ms = cycles / ((time.perf_counter() - start) * 1e3)

    def run(self, ms: float, device: int | None = None) -> None:
        with torch.cuda.device(torch.cuda.current_device() if device is None else device):
            torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def alloc(self, size: int, device: int | None = None) -> int:
        index = torch.cuda.current_device() if device is None else device
        tensor = torch.empty(size, dtype=torch.uint8, device=f"cuda:{index}")
        self._held[tensor.data_ptr()] = tensor
        return tensor.data_ptr()

    def free(self, handle: int) -> None:
        del self._held[handle]


SimulatedGpu.simulated = True
