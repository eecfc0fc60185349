"""The simulated GPU, held to torch's own sources: the installed wheel's headers, stubs and Python files.

A torch upgrade that changes a constant, a message or a signature the simulation copies fails here, so the
simulation can't drift from what the user's real device does.
"""

from __future__ import annotations

import inspect
import re
import time
from pathlib import Path

import pytest
import simulated_gpu as sim
import torch
from simulated_gpu import SimulatedHang, simulated_cuda

from perfhooks.device import cuda_extras

TORCH = Path(torch.__file__).parent
MIB = 2**20


def source(relative: str) -> str:
    path = TORCH / relative
    if not path.exists():
        pytest.fail(f"{relative} is not in the installed torch wheel: the simulation's contract cannot be checked")
    return path.read_text()


# ----------------------------------------------------------------------------- contract with the wheel
def test_allocator_constants_match_allocator_config_h() -> None:
    header = source("include/c10/core/AllocatorConfig.h")
    constants = {name: int(value) for name, value in re.findall(r"constexpr size_t (k\w+) = (\d+);", header)}
    assert constants["kSmallBuffer"] == sim.K_SMALL_BUFFER
    assert constants["kMinBlockSize"] == sim.K_MIN_BLOCK_SIZE
    assert constants["kSmallSize"] == sim.K_SMALL_SIZE
    assert constants["kMinLargeAlloc"] == sim.K_MIN_LARGE_ALLOC
    assert constants["kRoundLarge"] == sim.K_ROUND_LARGE


def test_event_messages_and_semantics_match_cuda_event_h() -> None:
    header = source("include/c10/cuda/CUDAEvent.h")
    for message in (sim.MSG_TIMING, sim.MSG_RECORDED, sim.MSG_COMPLETED):
        assert f'"{message}"' in header, message
    assert '"Event device ",' in header and "\" does not match recording stream's device \"," in header
    # query() is true for an event never recorded; the event is created on the stream's device at its first record
    assert re.search(r"bool query\(\) const \{\s*if \(!is_created_\) \{\s*return true;", header)
    assert re.search(r"if \(!is_created_\) \{\s*createEvent\(stream\.device_index\(\)\);", header)
    # record() with no stream uses the current device's current stream
    assert re.search(r"void record\(\) \{\s*record\(getCurrentCUDAStream\(\)\);", header)


def test_torch_event_messages_match_inline_event_h_and_the_cuda_guard() -> None:
    """perfhooks makes ``torch.Event`` (InlineEvent over CUDAGuardImpl), whose checks and messages differ from
    ``torch.cuda.Event``'s (CUDAEvent.h)."""
    inline = source("include/c10/core/impl/InlineEvent.h")
    for message in (sim.MSG_TIMING, sim.MSG_RECORDED, sim.MSG_COMPLETED):
        assert f'"{message}"' in inline, message
    # query() is true for an event never recorded
    assert re.search(r"bool query\(\) const \{\s*if \(!was_marked_for_recording_\)\s*return true;", inline)
    guard = source("include/c10/cuda/impl/CUDAGuardImpl.h")
    assert re.search(r'device_index == -1 \|\| device_index == stream\.device_index\(\),\s*"Event device index ",'
                     r'\s*device_index,\s*" does not match recording stream\'s device index ",\s*'
                     r'stream\.device_index\(\),\s*"\."', guard)
    assert sim.MSG_GENERIC_DEVICE.format(event=1, stream=0) == (
        "Event device index 1 does not match recording stream's device index 0.")


def test_stream_and_graph_apis_match_torchs_python_files() -> None:
    """The names the simulation replaces and torch's own ``torch.cuda.graph`` and ``StreamContext`` call."""
    graphs = source("cuda/graphs.py")
    assert "self.__class__.default_capture_stream = torch.cuda.Stream()" in graphs
    assert "self.stream_ctx = torch.cuda.stream(self.capture_stream)" in graphs
    assert re.search(r"def __enter__\(self\) -> None:\n.*?torch\.cuda\.synchronize\(\)"
                     r".*?self\.stream_ctx\.__enter__\(\).*?self\.cuda_graph\.capture_begin\(", graphs, re.S)
    assert re.search(r"def __exit__\(self, \*args: object\) -> None:.*?self\.cuda_graph\.capture_end\(\)\s*"
                     r"self\.stream_ctx\.__exit__\(\*args\)", graphs, re.S)
    assert "return _cuda_isCurrentStreamCapturing()" in graphs
    signature = inspect.signature(torch.cuda.graphs.CUDAGraph.capture_begin)
    assert list(signature.parameters) == ["self", "pool", "capture_error_mode", "check_input_liveness"]
    init = source("cuda/__init__.py")
    assert re.search(r"self\.src_prev_stream = torch\.cuda\.current_stream\(None\)", init)
    assert "torch.cuda.set_stream(cur_stream)" in init


def test_oom_observer_signature_matches_the_caching_allocator_header() -> None:
    header = source("include/c10/cuda/CUDACachingAllocator.h")
    match = re.search(r"using OutOfMemoryObserver = std::function<void\(([^)]*)\)>;", header)
    assert match, "OutOfMemoryObserver is no longer declared as it was"
    params = [part.split()[-1] for part in match.group(1).split(",")]
    assert params == ["device", "allocated", "device_total", "device_free"]
    # perfhooks names them for what the call site passes: the failed request's size, the total or the cap, free
    assert cuda_extras.OOM_OBSERVER_FIELDS == ("device", "requested_bytes", "device_limit_bytes", "device_free_bytes")


def test_the_c_functions_perfhooks_reaches_have_the_stub_signatures() -> None:
    stub = source("_C/__init__.pyi")
    assert "def _cuda_isHistoryEnabled() -> _bool: ..." in stub
    assert "def _cuda_getMemoryFraction(device: _int) -> _float: ..." in stub
    assert "def _cuda_memoryStats(device: _int) -> dict[str, Any]: ..." in stub
    history = re.search(r"def _cuda_record_memory_history\(\n(.*?)\) -> None: \.\.\.", stub, re.S)
    assert history is not None
    names = [line.strip().split(":")[0] for line in history.group(1).strip().splitlines()]
    assert names == ["enabled", "context", "stacks", "max_entries", "clear_history", "compile_context",
                     "global_record_annotations", "skip_actions"]
    event = re.search(r"class Event:\n(.*?)\nclass ", stub, re.S)
    assert event is not None
    for method in ("def record(self, stream: Stream | None = None) -> None", "def query(self) -> _bool",
                   "def elapsed_time(self, other: Event) -> _float", "def synchronize(self) -> None"):
        assert method in event.group(1), method


def test_the_python_functions_the_simulation_replaces_keep_their_parameters() -> None:
    """Each replaced Python function takes the parameters the real one takes (names, in order)."""
    real = {
        "_record_memory_history": torch.cuda.memory._record_memory_history_impl,
        "_snapshot": torch.cuda.memory._snapshot,
        "mem_get_info": torch.cuda.mem_get_info,
        "get_per_process_memory_fraction": torch.cuda.get_per_process_memory_fraction,
        "memory_stats": torch.cuda.memory_stats,
    }
    with simulated_cuda() as _:
        fakes = {"_record_memory_history": torch.cuda.memory._record_memory_history,
                 "_snapshot": torch.cuda.memory._snapshot}
        for name, fake in fakes.items():
            expected = list(inspect.signature(real[name]).parameters)
            got = list(inspect.signature(fake).parameters)
            assert got == expected, (name, got, expected)
    source_memory = source("cuda/memory.py")
    assert "Return the global free and total GPU memory" in source_memory  # mem_get_info: (free, total)
    assert 'enabled: Literal["state", "all"] | None = "all"' in source_memory
    assert inspect.signature(torch.cuda.Event.__new__).parameters.keys() >= {"enable_timing", "blocking",
                                                                             "interprocess"}


def test_the_oom_message_is_the_one_perfhooks_parses() -> None:
    from perfhooks.memory.oom import find_oom, requested_bytes

    with simulated_cuda(memory_bytes=1 << 30) as gpu, pytest.raises(torch.OutOfMemoryError) as caught:
        gpu.alloc(3 << 30)
    assert str(caught.value).startswith("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity "
                                        "of 1024.00 MiB of which 1024.00 MiB is free. Of the allocated memory 0 "
                                        "bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
                                        "unallocated.")
    assert find_oom(caught.value) is caught.value and requested_bytes(caught.value) == 3 << 30
    assert (sim.format_size(1024), sim.format_size(1536), sim.format_size(3 * MIB)) == (
        "1024 bytes", "1.50 KiB", "3.00 MiB")


def test_the_simulation_is_undone_on_exit() -> None:
    before = (torch.cuda.is_available, torch.cuda.Event, torch.Event, torch.accelerator.memory_stats,
              getattr(torch._C, "_cuda_isHistoryEnabled", None))
    with simulated_cuda(devices=2):
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2
    after = (torch.cuda.is_available, torch.cuda.Event, torch.Event, torch.accelerator.memory_stats,
             getattr(torch._C, "_cuda_isHistoryEnabled", None))
    assert after == before and not torch.cuda.is_available()


# ----------------------------------------------------------------------------- the simulation behaves as CUDA
def test_kernels_queue_on_their_stream_and_events_time_them() -> None:
    with simulated_cuda(devices=2) as gpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        assert start.query(), "an event never recorded is complete"
        start.record()
        gpu.run(50.0)
        gpu.run(50.0)
        end.record()
        assert not end.query(), "100 ms of kernels are queued ahead of it"
        with pytest.raises(RuntimeError, match="must be completed"):
            start.elapsed_time(end)
        time.sleep(0.12)
        assert end.query() and start.elapsed_time(end) >= 100.0
        gpu.run(500.0, device=1)
        assert torch.cuda.Event().query() and gpu.idle(0) == 0.0 and gpu.idle(1) > 0.4


def test_event_errors_are_torchs() -> None:
    with simulated_cuda(devices=2) as gpu:
        untimed, timed = torch.cuda.Event(), torch.cuda.Event(enable_timing=True)
        untimed.record()
        timed.record()
        with pytest.raises(ValueError, match="enable_timing=True"):
            untimed.elapsed_time(timed)
        with pytest.raises(ValueError, match="must be recorded"):
            torch.cuda.Event(enable_timing=True).elapsed_time(timed)
        other = torch.Event(device="cuda:1", enable_timing=True)
        other.record(torch.cuda.current_stream(1))
        with pytest.raises(torch.AcceleratorError, match="invalid resource handle"):
            timed.elapsed_time(other)
        # torch.Event's backend (CUDAGuardImpl) and torch.cuda.Event (CUDAEvent.h) word it differently
        with pytest.raises(RuntimeError, match=r"Event device index 1 does not match recording stream's device "
                                               r"index 0\."):
            other.record(torch.cuda.current_stream(0))
        torch.cuda.set_device(1)
        bound = torch.cuda.Event(enable_timing=True)
        bound.record()  # the current device's stream: device 1
        assert bound.device == torch.device("cuda", 1) and gpu.events_recorded[1] == 2
        with pytest.raises(RuntimeError, match=r"Event device 1 does not match recording stream's device 0\.$"):
            bound.record(torch.cuda.current_stream(0))


def test_caching_allocator_rounds_and_sizes_segments_as_torch() -> None:
    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        small = gpu.alloc(1)
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == 512 and stats["reserved_bytes.all.current"] == 2 * MIB
        large = gpu.alloc(11 * MIB + 1)  # >= 10 MiB: its own segment, rounded up to 2 MiB (12 MiB)
        medium = gpu.alloc(5 * MIB)  # 1 MiB < size < 10 MiB: a 20 MiB segment (the 12 MiB one is full)
        stats = torch.cuda.memory_stats()
        assert stats["reserved_bytes.all.current"] == (2 + 20 + 12) * MIB
        gpu.free(medium)
        again = gpu.alloc(4 * MIB)  # best fit in the cached 20 MiB segment: no new segment
        assert torch.cuda.memory_stats()["reserved_bytes.all.current"] == (2 + 20 + 12) * MIB
        for handle in (small, large, again):
            gpu.free(handle)
        assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] == 512 + 5 * MIB + 12 * MIB


def test_a_retry_is_counted_on_the_last_try_and_an_oom_calls_the_observers() -> None:
    seen = []
    with simulated_cuda(memory_bytes=100 * MIB) as gpu:
        torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
        assert len(gpu.oom_observers) >= 1
        cached = gpu.alloc(60 * MIB)
        gpu.free(cached)  # 60 MiB cached in the large pool
        kept = gpu.alloc(80 * MIB)  # the large pool's cache is released first: no retry
        assert torch.cuda.memory_stats()["num_alloc_retries"] == 0
        gpu.free(kept)
        torch.cuda.empty_cache()
        small = [gpu.alloc(MIB) for _ in range(40)]  # 20 small-pool segments of 2 MiB
        for handle in small:
            gpu.free(handle)  # 40 MiB cached in the small pool
        kept = gpu.alloc(80 * MIB)  # only freeing every cached segment makes room: the last try, counted
        assert torch.cuda.memory_stats()["num_alloc_retries"] == 1 and seen == []
        with pytest.raises(torch.OutOfMemoryError):
            gpu.alloc(40 * MIB)
        stats = torch.cuda.memory_stats()
        assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 2
        assert seen == [(0, 40 * MIB, 100 * MIB, 20 * MIB)]
        gpu.free(kept)
        torch.cuda.empty_cache()  # the cap limits new segments; a cached one would be reused
        torch.cuda.set_per_process_memory_fraction(0.5)
        with pytest.raises(torch.OutOfMemoryError, match=r"50\.00 MiB allowed; "):
            gpu.alloc(60 * MIB)
        assert seen[-1] == (0, 60 * MIB, 50 * MIB, 100 * MIB), "the cap, not the device's total, is passed"


def test_history_modes_and_snapshots_read_by_torchs_memory_viz() -> None:
    from torch.cuda import _memory_viz

    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        assert not torch._C._cuda_isHistoryEnabled()
        torch.cuda.memory._record_memory_history(enabled="state")
        held = gpu.alloc(3 * MIB)
        assert torch._C._cuda_isHistoryEnabled() and torch.cuda.memory._snapshot()["device_traces"] == [[]]
        torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=100)
        more = gpu.alloc(30 * MIB)
        with pytest.raises(torch.OutOfMemoryError):
            gpu.alloc(2 << 30)
        snapshot = torch.cuda.memory._snapshot()
        actions = [entry["action"] for entry in snapshot["device_traces"][0]]
        assert actions[:2] == ["segment_alloc", "alloc"] and actions[-1] == "oom"
        assert any("test_simulated_gpu.py" in f["filename"] for f in snapshot["device_traces"][0][1]["frames"])
        assert "<html" in _memory_viz.trace_plot(snapshot).lower()
        assert "<html" in _memory_viz.segment_plot(snapshot).lower()
        torch.cuda.memory._record_memory_history(enabled=None)
        assert not torch._C._cuda_isHistoryEnabled()
        gpu.free(held)
        gpu.free(more)


def test_a_blocking_wait_on_a_hung_device_fails_instead_of_hanging() -> None:
    with simulated_cuda(hang_guard_s=0.5) as gpu:
        event = torch.cuda.Event()
        gpu.hang()
        event.record()
        assert not event.query()
        with pytest.raises(SimulatedHang):
            event.synchronize()
        assert gpu.syncs == [("event", 0)]


def test_a_cuda_error_is_sticky() -> None:
    with simulated_cuda() as gpu:
        error = gpu.fail()
        with pytest.raises(torch.AcceleratorError) as caught:
            torch.cuda.Event().record()
        assert caught.value is error and gpu.calls_after_error == ["Event.record"]


# ----------------------------------------------------------------------------- streams, graphs, sticky errors
def test_the_current_device_and_stream_are_per_thread() -> None:
    import threading

    with simulated_cuda(devices=2) as gpu:
        side = torch.cuda.Stream()
        seen = {}

        def other_thread() -> None:
            seen["device"], seen["stream"] = torch.cuda.current_device(), torch.cuda.current_stream()

        with torch.cuda.stream(side):  # torch's own StreamContext
            torch.cuda.set_device(1)
            assert torch.cuda.current_stream(0) == side
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        assert seen == {"device": 0, "stream": gpu.streams[0]}
        assert torch.cuda.current_stream(0) == gpu.streams[0], "the context put the default stream back"


def test_side_streams_queue_apart_and_are_ordered_by_waits() -> None:
    with simulated_cuda() as gpu:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            gpu.run(80.0)
        on_default, on_side = torch.cuda.Event(), torch.cuda.Event()
        on_default.record()
        on_side.record(side)
        assert on_default.query() and not on_side.query(), "the default stream has nothing queued"
        torch.cuda.current_stream().wait_stream(side)
        after = torch.cuda.Event()
        after.record()
        assert not after.query(), "queued behind the side stream's kernel"
        torch.cuda.synchronize()  # waits for every stream of the device
        assert on_side.query() and after.query() and gpu.idle() == 0.0


def test_a_query_inside_a_graph_capture_invalidates_it() -> None:
    with simulated_cuda() as gpu:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # torch's own context manager
            assert torch.cuda.is_current_stream_capturing()
            gpu.run(5.0)  # captured, not run
        assert not torch.cuda.is_current_stream_capturing() and gpu.idle() == 0.0
        graph.replay()
        assert gpu.idle() > 0.0
        broken = torch.cuda.CUDAGraph()
        invalidated = pytest.raises(torch.AcceleratorError, match="operation failed due to a previous error during "
                                                                  "capture")
        with invalidated, torch.cuda.graph(broken):
            gpu.run(5.0)
            with pytest.raises(torch.AcceleratorError, match="operation not permitted when stream is capturing"):
                torch.cuda.mem_get_info()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            broken.replay()


def test_a_sticky_error_reaches_every_device_call() -> None:
    with simulated_cuda() as gpu:
        gpu.fail()
        for call in (torch.cuda.memory_stats, torch.cuda.memory_allocated, torch.cuda.mem_get_info,
                     torch.cuda.current_stream, lambda: torch.Event(enable_timing=True).record()):
            with pytest.raises(torch.AcceleratorError, match="illegal memory access"):
                call()
        assert len(gpu.calls_after_error) == 5


def test_a_snapshot_costs_time_with_its_entries() -> None:
    with simulated_cuda() as gpu:
        torch.cuda.memory._record_memory_history("all")
        handles = [gpu.alloc(4096) for _ in range(2000)]
        for handle in handles:
            gpu.free(handle)
        started = time.perf_counter()
        torch.cuda.memory._snapshot()
        taken = time.perf_counter() - started
        (entry,) = gpu.snapshots_taken
        assert entry["entries"] >= 6000  # alloc, free_requested, free_completed each, and the segment's
        assert taken >= entry["entries"] * gpu.snapshot_us_per_entry / 1e6
