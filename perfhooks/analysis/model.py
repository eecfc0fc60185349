"""One trace model for every Kineto trace: old (2021) and new category names, NVIDIA and AMD.

Parsing is one pass over the events that sorts complete events (``ph == "X"``) into lists by
kind. Events stay the dicts the JSON parser made (no per-event objects: this is the hot loop
of ``perfhooks analyze``). Times are microseconds, as in the trace.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

try:  # orjson parses 2-4x faster than the standard library and rejects integers beyond 64 bits
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the fallback keeps analysis working
    _orjson = None
import json

_INT64_MAX = 2**63 - 1

KERNEL, MEMCPY, MEMSET, RUNTIME, CPU_OP, ANNOTATION, GPU_ANNOTATION, PYTHON, SYNC = (
    "kernel", "memcpy", "memset", "runtime", "cpu_op", "annotation", "gpu_annotation", "python", "sync")

#: Category (old and new spellings) -> kind.
CATEGORIES: dict[str, str] = {
    "kernel": KERNEL, "Kernel": KERNEL,
    "gpu_memcpy": MEMCPY, "Memcpy": MEMCPY,
    "gpu_memset": MEMSET, "Memset": MEMSET,
    "cuda_runtime": RUNTIME, "Runtime": RUNTIME, "cuda_driver": RUNTIME,
    "cpu_op": CPU_OP, "Operator": CPU_OP, "operator": CPU_OP, "DataLoader": CPU_OP, "python": CPU_OP,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": GPU_ANNOTATION,
    "python_function": PYTHON,
    "cuda_sync": SYNC,
}
_STEP_PREFIX = "ProfilerStep#"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class TraceError(Exception):
    """A trace that cannot be used; ``str()`` is one line naming the file and the problem."""


@dataclass
class Trace:
    """A parsed trace. Event lists hold the trace's own dicts; times are µs."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    device_properties: dict[int, dict[str, Any]] = field(default_factory=dict)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    memcpys: list[dict[str, Any]] = field(default_factory=list)
    memsets: list[dict[str, Any]] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    cpu_ops: list[dict[str, Any]] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    gpu_annotations: list[dict[str, Any]] = field(default_factory=list)
    python: list[dict[str, Any]] = field(default_factory=list)
    syncs: list[dict[str, Any]] = field(default_factory=list)
    #: Host-side ``ProfilerStep#N`` spans: (N, start µs, end µs), in time order.
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    events: int = 0
    warnings: list[str] = field(default_factory=list)

    @cached_property
    def device_events(self) -> list[dict[str, Any]]:
        """Kernels, memcpys and memsets, in time order."""
        return sorted(self.kernels + self.memcpys + self.memsets, key=lambda e: e["ts"])

    @cached_property
    def launch_ts(self) -> dict[Any, float]:
        """Correlation id -> host time (µs) of the runtime call that launched it."""
        out = {}
        for runtime in self.runtimes:
            correlation = (runtime.get("args") or {}).get("correlation")
            if correlation is not None:
                out[correlation] = runtime["ts"]
        return out

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels or self.memcpys or self.memsets)

    def device_name(self, device: int) -> str | None:
        return self.device_properties.get(device, {}).get("name")


def read_trace_json(path: str | Path) -> Any:
    """The trace's JSON document; a :class:`TraceError` with a one-line reason when it is unusable."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TraceError(f"{name}: cannot read ({error.strerror or error})") from None
    if name.endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as error:
            raise TraceError(f"{name}: truncated or corrupt gzip ({error})") from None
    if not data.strip():
        raise TraceError(f"{name}: empty file")
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError as error:
            message = str(error)
            if "UTF-8" in message or "utf-8" in message:
                raise TraceError(f"{name}: invalid UTF-8 ({message})") from None
            if "64-bit" in message or "Integer" in message:
                raise TraceError(f"{name}: integer beyond int64 ({message})") from None
            raise TraceError(f"{name}: not JSON ({message})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TraceError(f"{name}: invalid UTF-8 (byte {error.start})") from None
    try:
        return json.loads(text, parse_int=_checked_int)
    except json.JSONDecodeError as error:
        raise TraceError(f"{name}: not JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except OverflowError as error:
        raise TraceError(f"{name}: integer beyond int64 ({error})") from None


def _checked_int(text: str) -> int:
    value = int(text)
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise OverflowError(f"{text[:30]} does not fit in 64 bits")
    return value


def load_trace(path: str | Path) -> Trace:
    """Read and parse one trace file (``.json`` or ``.json.gz``)."""
    return parse_trace(read_trace_json(path), str(path))


def parse_trace(document: Any, path: str = "<trace>") -> Trace:
    """Sort a trace document's events by kind, in one pass."""
    if isinstance(document, list):
        document = {"traceEvents": document}
    if not isinstance(document, dict):
        raise TraceError(f"{path}: not a trace (top level is {type(document).__name__}, expected an object)")
    events = document.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    if events and not any(type(event) is dict for event in events[:1000]):
        raise TraceError(f"{path}: not a trace (traceEvents holds no event objects)")
    trace = Trace(path=path, events=len(events))
    if not events:
        trace.warnings.append("the trace has no events")
    _read_metadata(trace, document)
    buckets = {KERNEL: trace.kernels, MEMCPY: trace.memcpys, MEMSET: trace.memsets, RUNTIME: trace.runtimes,
               CPU_OP: trace.cpu_ops, ANNOTATION: trace.annotations, GPU_ANNOTATION: trace.gpu_annotations,
               PYTHON: trace.python, SYNC: trace.syncs}
    categories = CATEGORIES
    skipped = 0
    steps = trace.steps
    for event in events:
        if type(event) is not dict or event.get("ph") != "X":
            continue
        kind = categories.get(event.get("cat"))  # type: ignore[arg-type]
        if kind is None:
            continue
        ts, dur = event.get("ts"), event.get("dur")
        if type(ts) not in (int, float) or type(dur) not in (int, float) or dur < 0:
            skipped += 1
            continue
        if ts > _INT64_MAX or dur > _INT64_MAX or ts < -_INT64_MAX:
            # orjson reads integers past 64 bits as floats instead of failing; times that large are corrupt
            raise TraceError(f"{path}: integer beyond int64 (ts/dur of {event.get('name')!r})")
        name = event.get("name")
        if kind in (CPU_OP, ANNOTATION) and type(name) is str and name.startswith(_STEP_PREFIX):
            number = name[len(_STEP_PREFIX):]
            if number.isdigit():
                steps.append((int(number), ts, ts + dur))
                continue
        buckets[kind].append(event)
    if skipped:
        trace.warnings.append(f"{skipped} events without a numeric ts/dur were skipped")
    steps.sort(key=lambda step: step[1])
    return trace


def _read_metadata(trace: Trace, document: dict[str, Any]) -> None:
    info = document.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        trace.rank = rank if isinstance(rank, int) else None
        trace.world_size = world if isinstance(world, int) else None
    if trace.rank is None:
        match = _RANK_IN_NAME.search(Path(trace.path).name)
        if match:
            trace.rank = int(match.group(1))
    for props in document.get("deviceProperties") or []:
        if isinstance(props, dict) and isinstance(props.get("id"), int):
            trace.device_properties[props["id"]] = props
