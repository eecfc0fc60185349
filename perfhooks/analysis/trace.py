"""One trace model for every Kineto trace: old (2021) and new category names, NVIDIA and AMD.

The JSON is decoded straight into slotted :class:`Event` structs that keep only the fields the
analyzers read (msgspec skips the rest in C), which is both faster than ``json.loads`` and a
fraction of its memory. Numbers written as strings (ROCm's ``args.bytes``) are read as numbers on
that path (msgspec's non-strict mode), and the January 2021 format (a top-level array of events)
decodes there too. A document that still does not fit falls back to a generic parse that converts
event by event; a field of an unexpected type costs that field, never the event (with a warning).
Complete events (``ph == "X"``) are then sorted into lists by kind, over arrays of the whole list (category,
name, start, duration), which seed each kind's :class:`~perfhooks.analysis.columns.Columns`: the analyzers read the
events as those columns. Times are microseconds.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import json
import re
import zlib
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from perfhooks.analysis.columns import ABSENT, Columns, distinct_codes
from perfhooks.files.json_chunks import INFLATE, INFLATE_ERROR, InvalidText, MoreMembers, split_array, text_blocks

try:  # the fallback parse: faster than the standard library
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None


_INT64_MAX = 2**63 - 1
#: An event longer than this (µs, 24 h) cannot be real profiler data: the trace is warned about.
IMPLAUSIBLE_US = 24 * 3600 * 1e6

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
STEP_PREFIX = "ProfilerStep#"
#: Complete-event categories that hold no activity of their own: the whole-trace span, the profiler's own
#: overhead, CUPTI's range-profiler markers.
IGNORED_CATEGORIES = frozenset({None, "Trace", "overhead", "cuda_profiler_range"})
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


_ABSENT = msgspec.Raw()


class Args(msgspec.Struct, frozen=True, gc=False):
    """The event arguments the analyzers read (old and new spellings)."""

    # ABSENT where the event has none (None where it is written as null): the columns read these in C
    correlation: int | None = ABSENT
    external_id_new: int | None = msgspec.field(default=ABSENT, name="External id")
    external_id_old: int | None = msgspec.field(default=ABSENT, name="external id")
    device: int | None = ABSENT
    blocks_per_sm: float | None = msgspec.field(default=None, name="blocks per SM")
    occupancy: float | None = msgspec.field(default=None, name="est. achieved occupancy %")
    # Large and rarely read: kept as zero-copy slices of the input, decoded on use.
    input_dims_new: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input Dims")
    input_dims_old: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input dims")
    input_type_raw: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input type")
    concrete_inputs_raw: msgspec.Raw = msgspec.field(default=_ABSENT, name="Concrete Inputs")
    bytes: int | float | None = None
    #: The rank of a merged file of several ranks' events (TraceLens's TraceFusion writes it into every event).
    rank: int | None = None
    call_stack_raw: msgspec.Raw = msgspec.field(default=_ABSENT, name="Call stack")

    @property
    def input_type(self) -> list[Any] | None:
        return _decode_raw(self.input_type_raw)

    @property
    def concrete_inputs(self) -> list[Any] | None:
        """Scalar arguments as the profiler wrote them (strings; ``""`` for a tensor), with ``record_shapes``."""
        return _decode_raw(self.concrete_inputs_raw)

    @property
    def call_stack(self) -> str | None:
        value = _decode_raw(self.call_stack_raw)
        return value if isinstance(value, str) else None


def _decode_raw(raw: msgspec.Raw) -> Any:
    if not raw:  # absent (or JSON null, kept as the 4 bytes "null", decodes to None below)
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


_NO_ARGS = Args()


class SharedStr(str):
    """A category or event name, one object per distinct text in a trace: names repeat (a Python frame, a kernel,
    the category ``python_function``) hundreds of thousands of times, and one copy each would be a third of the
    decoded trace's memory. Behaves as the ``str`` it is."""

    __slots__ = ()


_SHARED: dict[str, SharedStr] = {}


_SHARED_GET = _SHARED.get


def _shared(kind: type, value: Any) -> Any:
    """msgspec's decode hook (for :class:`SharedStr`, its one custom type): each distinct string once (a
    non-string is the field's type error, as before). Called twice an event: a name seen before is one lookup."""
    try:
        shared = _SHARED_GET(value)
    except TypeError:  # unhashable: not a string
        shared = None
    if shared is not None:
        return shared
    if kind is SharedStr and type(value) is str:
        shared = _SHARED.get(value)
        if shared is None:
            shared = _SHARED[value] = SharedStr(value)
        return shared
    raise TypeError(f"expected a string, got {type(value).__name__}")


class Event(msgspec.Struct, frozen=True, gc=False, tag_field="ph", tag="X"):
    """One complete event (``ph == "X"``): the fields perfhooks reads, the rest skipped at decode time. µs."""

    cat: SharedStr | None = None
    name: SharedStr | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    #: An event written without arguments has the empty ones (``None``: written as null).
    args: Args | None = _NO_ARGS

    @property
    def a(self) -> Args:
        return self.args or _NO_ARGS

    @property
    def correlation(self) -> int | None:
        correlation = self.args.correlation if self.args is not None else None
        return None if correlation == ABSENT else correlation

    @property
    def external_id(self) -> int | None:
        args = self.args
        if args is None:
            return None
        new = args.external_id_new
        found = new if new is not None and new != ABSENT else args.external_id_old
        return None if found == ABSENT else found

    @property
    def device(self) -> Any:
        device = self.args.device if self.args is not None else None
        return self.pid if device is None or device == ABSENT else device

    @property
    def input_dims(self) -> list[Any] | None:
        args = self.a
        return _decode_raw(args.input_dims_new if args.input_dims_new else args.input_dims_old)

    def input_dims_as(self, memo: dict[bytes, Any], convert: Any = None) -> Any:
        """:attr:`input_dims` (passed through ``convert``), decoded once per distinct text in ``memo``: ops with
        the same shapes share the decoded (read-only) value."""
        args = self.a
        raw = args.input_dims_new if args.input_dims_new else args.input_dims_old
        key = bytes(raw)
        if key not in memo:
            value = _decode_raw(raw)
            memo[key] = convert(value) if convert is not None else value
        return memo[key]

    def input_type_as(self, memo: dict[bytes, Any]) -> list[Any] | None:
        """``args.input_type``, decoded once per distinct text in ``memo`` (read-only)."""
        raw = self.a.input_type_raw
        key = bytes(raw)
        if key not in memo:
            memo[key] = _decode_raw(raw)
        return memo[key]


    @property
    def ph(self) -> str:
        return "X"


#: Every other Chrome trace phase decodes to an empty struct: flows, instants, counters and metadata
#: (often half of a trace's events) then cost a few bytes each. An unknown phase takes the fallback path.
_OTHER_PHASES = tuple(msgspec.defstruct(f"_Phase_{ord(tag)}", [], tag_field="ph", tag=tag, frozen=True, gc=False,
                                        namespace={"cat": None, "name": None, "ts": None, "dur": None})
                      for tag in "BEiICbnestfPNODMVvRc")
_AnyEvent = Union[(Event, *_OTHER_PHASES)]


class _Document(msgspec.Struct):
    traceEvents: list[_AnyEvent]  # type: ignore[valid-type]
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[Any] | None = None
    perfhooksMerge: dict[str, Any] | None = None


_DECODER = msgspec.json.Decoder(_Document, strict=False, dec_hook=_shared)
#: The January 2021 format: the whole file is the array of events.
_ARRAY_DECODER = msgspec.json.Decoder(list[_AnyEvent], strict=False, dec_hook=_shared)


class TraceError(Exception):
    """A trace that cannot be used; ``str()`` is one line naming the file and the problem."""


class NotATrace(TraceError):
    """Valid JSON that is not a trace (a report, a config): a folder's other files are skipped with a note."""


@dataclass
class Trace:
    """A parsed trace: its events by kind (lists of :class:`Event`, each also readable as columns with
    :meth:`columns`); times are µs."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    device_properties: dict[int, dict[str, Any]] = field(default_factory=dict)
    kernels: list[Event] = field(default_factory=list)
    memcpys: list[Event] = field(default_factory=list)
    memsets: list[Event] = field(default_factory=list)
    runtimes: list[Event] = field(default_factory=list)
    cpu_ops: list[Event] = field(default_factory=list)
    annotations: list[Event] = field(default_factory=list)
    gpu_annotations: list[Event] = field(default_factory=list)
    python: list[Event] = field(default_factory=list)
    syncs: list[Event] = field(default_factory=list)
    #: Host-side ``ProfilerStep#N`` spans: (N, start µs, end µs), in time order.
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    events: int = 0
    warnings: list[str] = field(default_factory=list)
    #: Complete events of categories no analyzer reads (an accelerator perfhooks does not model), by category.
    unmodeled: dict[str, int] = field(default_factory=dict)

    @property
    def device_events(self) -> list[Event]:
        """Kernels, memcpys and memsets, in time order."""
        return self.columns("device_events").events

    def columns(self, kind: str) -> Columns:
        """``kind``'s events (``"kernels"``, ``"runtimes"``, ..., or ``"device_events"``: kernels, memcpys and
        memsets in time order, equal starts in that order) as :class:`~perfhooks.analysis.columns.Columns`, built
        once per trace."""
        cache = self.__dict__.setdefault("_columns", {})
        found = cache.get(kind)
        if found is None:
            if kind == "device_events":
                found = Columns.concat([self.columns(k) for k in ("kernels", "memcpys", "memsets")]).sorted_by_start()
            else:
                found = Columns(getattr(self, kind))
            cache[kind] = found
        return found

    def names(self, kind: str, prefixes: str | tuple[str, ...]) -> frozenset[str]:
        """The distinct names of the ``kind`` events (``"cpu_ops"``, ``"runtimes"``, ...) that start with
        ``prefixes``: a trace has hundreds of names over hundreds of thousands of events, so an analyzer tests
        each name once (cached) and each event by set membership, not by ``startswith``."""
        cache = self.__dict__.setdefault("_names", {})
        key = (kind, prefixes)
        found = cache.get(key)
        if found is None:
            distinct = cache.get(kind)
            if distinct is None:
                seeded = kind in _COLUMN_KINDS or kind in self.__dict__.get("_columns", {})
                if seeded:  # the names present in the kind (its code table may be shared with other kinds)
                    columns = self.columns(kind)
                    distinct = frozenset(columns.names[code] for code in np.unique(columns.name).tolist())
                else:
                    distinct = frozenset({event.name for event in getattr(self, kind)})
                cache[kind] = distinct
            found = cache[key] = frozenset(name for name in distinct if name and name.startswith(prefixes))
        return found

    @property
    def has_gpu(self) -> bool:
        return bool(self.kernels or self.memcpys or self.memsets)

    def within(self, window: list[tuple[float, float]]) -> Trace:
        """The same trace with only the events that start inside ``window`` (merged, sorted spans, µs): what
        ran in the steps, not evaluation or checkpoints between them. Step spans and metadata are kept. The lists
        with columns keep their columns' rows (:meth:`columns`)."""
        from dataclasses import replace

        lows = np.fromiter((low for low, _ in window), dtype=np.float64, count=len(window))
        highs = np.fromiter((high for _, high in window), dtype=np.float64, count=len(window))
        cache = self.__dict__.get("_columns", {})
        kept: dict[str, list[Event]] = {}
        columns: dict[str, Columns] = {}
        for kind in _KINDS:
            found = cache.get(kind)
            if found is None and kind in _COLUMN_KINDS:
                found = self.columns(kind)
            if found is not None:
                rows = np.flatnonzero(_starts_inside(found.ts, lows, highs))
                columns[kind] = found.subset(rows)
                kept[kind] = columns[kind].events
            else:
                events = getattr(self, kind)
                ts = np.fromiter((event.ts for event in events), dtype=np.float64, count=len(events))
                kept[kind] = [events[i] for i in np.flatnonzero(_starts_inside(ts, lows, highs)).tolist()]
        inside = replace(self, **kept, warnings=[])
        inside.__dict__["_columns"] = columns
        return inside

    def device_name(self, device: int) -> str | None:
        return self.device_properties.get(device, {}).get("name")


#: The event lists of a :class:`Trace`; those in ``_COLUMN_KINDS`` are the ones most analyzers read as columns.
_KINDS = ("kernels", "memcpys", "memsets", "runtimes", "cpu_ops", "annotations", "gpu_annotations", "python", "syncs")
_COLUMN_KINDS = frozenset({"kernels", "memcpys", "memsets", "runtimes", "cpu_ops"})


def _starts_inside(ts: np.ndarray, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Which of the starts ``ts`` lie in one of the sorted, disjoint spans ``[lows[i], highs[i])``."""
    if lows.size == 1:
        return (ts >= lows[0]) & (ts < highs[0])
    index = np.searchsorted(lows, ts, side="right") - 1
    return (index >= 0) & (ts < highs[np.maximum(index, 0)])


def read_trace_bytes(path: str | Path) -> bytes:
    """The trace's uncompressed JSON text; a :class:`TraceError` with a one-line reason when unreadable."""
    name = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TraceError(f"{name}: cannot read ({error.strerror or error})") from None
    if name.endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = _gunzip(data)
        except (EOFError, OSError, zlib.error) as error:
            raise TraceError(f"{name}: truncated or corrupt gzip ({error})") from None
        if data[:2] == b"\x1f\x8b":
            raise TraceError(f"{name}: compressed twice (a gzip file inside the gzip); decompress it once: "
                             f"gunzip -c {name} > {Path(name).stem}") from None
    if not data or data.isspace():
        raise TraceError(f"{name}: empty file")
    return data


def _gunzip(data: bytes) -> bytes:
    """A gzip file's content. One member (what every profiler writes) is inflated in one call, which checks the
    CRC as it goes: by ISA-L (``isal``, 5x zlib's speed: 5 ms for a 15 MB trace where zlib takes 28) where it is
    installed, else by zlib (``gzip.decompress`` computes the CRC again, 10% more). Several members go to
    ``gzip``. A corrupt stream raises ``zlib.error``."""
    inflater = INFLATE.decompressobj(31)
    try:
        out = inflater.decompress(data)
    except INFLATE_ERROR as error:
        raise zlib.error(str(error)) from None
    if not inflater.eof:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
    if inflater.unused_data.strip(b"\x00"):
        return gzip.decompress(data)  # more members after the first
    return out


def read_trace_json(path: str | Path, data: bytes | None = None) -> Any:
    """The trace as a generic JSON document (the fallback path); one-line :class:`TraceError` when unusable."""
    name = str(path)
    data = read_trace_bytes(path) if data is None else data
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
    """Read and parse one trace file (``.json`` or ``.json.gz``) of one rank."""
    traces = load_traces(path)
    if len(traces) != 1:
        raise TraceError(f"{path}: a merged trace of {len(traces)} ranks; analyse it with perfhooks analyze, which "
                         "splits it into its ranks")
    return traces[0]


def load_traces(path: str | Path) -> list[Trace]:
    """One trace file's ranks: one :class:`Trace`, or a merged trace's (``perfhooks merge-traces``) ranks, each
    with its own events on its own clock, as its own file held them."""
    decoded = _decode_in_pieces(path)
    if decoded is None:  # the whole file at once: any problem gets its message there
        data = read_trace_bytes(path)
        _check_utf8(path, data)
        try:
            decoded = _decode_whole(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return split_document(read_trace_json(path, data), str(path))
        finally:
            _SHARED.clear()  # the strings stay shared in this trace's events; the next trace starts its own table
        del data
    events, document = decoded
    metadata: dict[str, Any] = {}
    merge = None
    if document is not None:
        metadata = {"distributedInfo": document.distributedInfo, "deviceProperties": document.deviceProperties}
        merge = document.perfhooksMerge
    if isinstance(merge, dict):
        return [_sort_events(_rank_trace(str(path), entry, len(rank_events)), rank_events)
                for entry, rank_events in _split_events(merge, events, _restore_struct)]
    foreign = _split_foreign(
        events, lambda e: (e.pid, e.args.rank if e.args is not None else None) if type(e) is Event else (None, None),
        lambda e, pid: msgspec.structs.replace(e, pid=pid)) if _may_hold_ranks(events) else {}
    if foreign:
        return [_sort_events(_foreign_rank_trace(str(path), metadata, rank, sorted(foreign), len(rank_events)),
                             rank_events) for rank, rank_events in sorted(foreign.items())]
    trace = Trace(path=str(path), events=len(events))
    _read_metadata(trace, metadata)
    return [_sort_events(trace, events)]


def _decode_whole(data: bytes) -> tuple[list[Any], _Document | None]:
    if data[:64].lstrip()[:1] == b"[":
        return _ARRAY_DECODER.decode(data), None
    document = _DECODER.decode(data)
    return document.traceEvents, document


#: Files from this size on disk (gzipped; eight times it uncompressed) are decoded in pieces. A smaller one (a CPU
#: window's trace, which the training process analyses itself) is read whole: its text is a few MB at most, and
#: one buffer leaves the process's heap as it found it where many pieces would not.
PIECES_FROM_BYTES = 1 << 18


def _decode_in_pieces(path: str | Path) -> tuple[list[Any], _Document | None] | None:
    """The events and the document's other fields, decoded half a MB of text at a time, so that the text is
    never held whole (peak memory: the decoded events and a piece); ``None`` where the file needs the whole-file
    path: small, unreadable, compressed twice or in several members, not UTF-8, empty, or not cut cleanly."""
    events: list[Any] = []
    try:
        compressed = str(path).endswith(".gz")
        if Path(path).stat().st_size < PIECES_FROM_BYTES * (1 if compressed else 8):
            return None
        blocks = text_blocks(path)
        first = next(blocks, b"")
        start = first.lstrip()[:1]
        if first[:2] == b"\x1f\x8b" or start not in (b"[", b"{"):
            return None
        array = start == b"["
        for last, piece in split_array(itertools.chain((first,), blocks), None if array else b"traceEvents"):
            if not last:
                events += _ARRAY_DECODER.decode(piece)
            elif array:
                events += _ARRAY_DECODER.decode(piece)
                return events, None
            else:
                document = _DECODER.decode(piece)
                events += document.traceEvents
                document.traceEvents = []
                return events, document
    except (OSError, EOFError, zlib.error, MoreMembers, InvalidText, msgspec.DecodeError, msgspec.ValidationError):
        return None
    finally:
        _SHARED.clear()  # the strings stay shared in this trace's events; the next trace starts its own table
    return None


def split_document(document: Any, path: str) -> list[Trace]:
    """:func:`parse_trace` for a document that may be a merged trace (then one Trace per rank)."""
    merge = document.get(MERGE_KEY) if isinstance(document, dict) else None
    if not isinstance(merge, dict):
        raw = document.get("traceEvents") if isinstance(document, dict) else None
        foreign = _split_foreign(
            [e for e in raw if type(e) is dict and e.get("ph") == "X"] if isinstance(raw, list) else [],
            lambda e: (e.get("pid"), (e.get("args") or {}).get("rank") if type(e.get("args")) is dict else None),
            lambda e, pid: {**e, "pid": pid})
        if not foreign:
            return [parse_trace(document, path)]
        ranks = sorted(foreign)
        return [parse_trace({"traceEvents": events, "deviceProperties": document.get("deviceProperties"),
                             "distributedInfo": {"rank": rank, "world_size": _world(ranks)}}, path)
                for rank, events in sorted(foreign.items())]
    raw = [e for e in document.get("traceEvents") or [] if type(e) is dict]
    return [parse_trace({"traceEvents": rank_events, "distributedInfo": _rank_info(entry),
                         "deviceProperties": entry.get("deviceProperties")}, path)
            for entry, rank_events in _split_events(merge, raw, _restore_dict)]


#: The metadata key of a merged trace (``perfhooks.analysis.merge_traces``).
MERGE_KEY = "perfhooksMerge"


def _rank_info(entry: dict[str, Any]) -> dict[str, Any]:
    info = entry.get("distributedInfo")
    info = dict(info) if isinstance(info, dict) else {}
    info["rank"] = entry.get("rank")
    if entry.get("world_size") is not None:
        info["world_size"] = entry["world_size"]
    return info


#: TraceLens's merged traces (TraceFusion) offset each rank's pids, host and device alike, by this much; no real
#: pid is this large (Linux's limit is 2**22).
RANK_PID_OFFSET = 100_000_000


def _split_foreign(events: list[Any], pid_and_rank: Any, with_pid: Any) -> dict[int, list[Any]]:
    """The ranks of a merged file that perfhooks did not write: events that carry ``args.rank``, or pids offset by
    :data:`RANK_PID_OFFSET` per rank. ``{rank: events}`` with each event back on its own pid; empty when the file
    holds one rank."""
    by_pid: dict[Any, int] = {}
    offset = False
    for event in events:
        pid, rank = pid_and_rank(event)
        if type(rank) is int and pid not in by_pid:
            by_pid[pid] = rank
        offset = offset or (type(pid) is int and pid >= RANK_PID_OFFSET)
    if len(set(by_pid.values())) < 2 and not offset:
        return {}
    out: dict[int, list[Any]] = {}
    for event in events:
        pid, rank = pid_and_rank(event)
        if type(rank) is not int:
            rank = by_pid.get(pid)
        if rank is None:
            rank = pid // RANK_PID_OFFSET if type(pid) is int else 0
        own = pid % RANK_PID_OFFSET if type(pid) is int and offset else pid
        out.setdefault(rank, []).append(with_pid(event, own) if own != pid else event)
    return out if len(out) >= 2 else {}


def _may_hold_ranks(events: list[Any], sample: int = 4096) -> bool:
    """Whether events carry ``args.rank`` or an offset pid, from an even sample of them: a merged file marks every
    event with its rank (TraceLens) or offsets most of them, so a sample finds it, and a plain file costs a few
    thousand checks, not a pass."""
    for event in events[::max(1, len(events) // sample)]:
        if type(event) is Event:
            args, pid = event.args, event.pid
            if (args is not None and args.rank is not None) or (type(pid) is int and pid >= RANK_PID_OFFSET):
                return True
    return False


def _world(ranks: list[int]) -> int:
    return max(len(ranks), max(ranks) + 1)


def _foreign_rank_trace(path: str, metadata: dict[str, Any], rank: int, ranks: list[int], events: int) -> Trace:
    trace = Trace(path=path, events=events)
    _read_metadata(trace, {"distributedInfo": {"rank": rank, "world_size": _world(ranks)},
                           "deviceProperties": metadata.get("deviceProperties")})
    return trace


def _rank_trace(path: str, entry: dict[str, Any], events: int) -> Trace:
    trace = Trace(path=path, events=events)
    _read_metadata(trace, {"distributedInfo": _rank_info(entry), "deviceProperties": entry.get("deviceProperties")})
    return trace


def _split_events(merge: dict[str, Any], events: list[Any], restore: Any) -> list[tuple[dict[str, Any], list[Any]]]:
    """Each rank entry of a merged trace, with its events back on their own pid, tid and clock."""
    entries = [e for e in merge.get("ranks") or [] if isinstance(e, dict) and isinstance(e.get("pid"), int)]
    if not entries:
        raise NotATrace("a merged trace without its ranks' metadata (perfhooksMerge.ranks)")
    by_pid = {entry["pid"]: (entry, {t[0]: (t[1], t[2]) for t in entry.get("threads") or []}, [])
              for entry in entries}
    for event in events:
        pid = event.get("pid") if type(event) is dict else getattr(event, "pid", None)
        slot = by_pid.get(pid)  # type: ignore[arg-type]
        if slot is not None:
            entry, threads, kept = slot
            kept.append(restore(event, threads, float(entry.get("shift_us") or 0.0)))
    return [(entry, kept) for entry, _, kept in by_pid.values()]


def _restore_struct(event: Any, threads: dict[int, tuple[Any, Any]], shift_us: float) -> Any:
    if type(event) is not Event:
        return event
    pid, tid = threads.get(event.tid, (event.pid, event.tid))  # type: ignore[arg-type]
    ts = round(event.ts - shift_us, 3) if shift_us and event.ts is not None else event.ts
    return msgspec.structs.replace(event, pid=pid, tid=tid, ts=ts)


def _restore_dict(event: dict[str, Any], threads: dict[int, tuple[Any, Any]], shift_us: float) -> dict[str, Any]:
    pid, tid = threads.get(event.get("tid"), (event.get("pid"), event.get("tid")))  # type: ignore[arg-type]
    restored = {**event, "pid": pid, "tid": tid}
    if shift_us and isinstance(event.get("ts"), (int, float)):
        restored["ts"] = round(event["ts"] - shift_us, 3)
    return restored


def _check_utf8(path: str | Path, data: bytes, chunk: int = 1 << 20) -> None:
    """Validate the whole text as UTF-8 (the fast decoder skips unused fields unchecked), 1 MiB at a time."""
    if data.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    try:
        for start in range(0, len(view), chunk):
            decoder.decode(view[start:start + chunk])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: invalid UTF-8 ({error.reason})") from None


def parse_trace(document: Any, path: str = "<trace>") -> Trace:
    """A generic JSON trace document (dicts): convert event by event, skipping those that do not fit."""
    if isinstance(document, list):
        document = {"traceEvents": document}
    if not isinstance(document, dict):
        raise NotATrace(f"{path}: not a trace (top level is {type(document).__name__}, expected an object)")
    raw_events = document.get("traceEvents")
    if not isinstance(raw_events, list):
        raise NotATrace(f"{path}: not a trace (no traceEvents list)")
    if raw_events and not any(type(event) is dict for event in raw_events[:1000]):
        raise NotATrace(f"{path}: not a trace (traceEvents holds no event objects)")
    events: list[Event] = []
    dropped = 0
    for raw in raw_events:
        if type(raw) is not dict or raw.get("ph") != "X":
            continue
        try:
            events.append(_to_event(raw))
        except (msgspec.ValidationError, msgspec.DecodeError, TypeError):
            event, lost = _convert_fields(raw)
            events.append(event)
            dropped += lost
    _SHARED.clear()
    trace = Trace(path=path, events=len(raw_events))
    if dropped:
        trace.warnings.append(f"{dropped} event fields of unexpected types were left out (their events were kept)")
    _read_metadata(trace, document)
    return _sort_events(trace, events)


_ENCODER = msgspec.json.Encoder()
_BAD_FIELD = (msgspec.ValidationError, msgspec.DecodeError, msgspec.EncodeError, TypeError, ValueError)


def _to_event(raw: dict[str, Any]) -> Event:
    """One event dict as an Event, through JSON so that the raw fields (shapes, types, stacks) are kept."""
    return msgspec.json.decode(_ENCODER.encode(raw), type=Event, strict=False, dec_hook=_shared)


def _convert_fields(raw: dict[str, Any]) -> tuple[Event, int]:
    """``raw`` as an Event, field by field: each field (and each argument) that does not fit is left out."""
    kept: dict[str, Any] = {"ph": "X"}
    lost = 0
    for key, value in raw.items():
        if key in ("ph", "args"):
            continue
        try:
            _to_event({"ph": "X", key: value})
            kept[key] = value
        except _BAD_FIELD:
            lost += 1
    args = raw.get("args")
    if isinstance(args, dict):
        good = {}
        for key, value in args.items():
            try:
                msgspec.json.decode(_ENCODER.encode({key: value}), type=Args, strict=False)
                good[key] = value
            except _BAD_FIELD:
                lost += 1
        kept["args"] = good
    elif args is not None:
        lost += 1
    return _to_event(kept), lost


_CAT, _NAME, _TS, _DUR = (attrgetter(field) for field in ("cat", "name", "ts", "dur"))
#: The kinds' lists on a :class:`Trace`, by kind.
_LISTS = {KERNEL: "kernels", MEMCPY: "memcpys", MEMSET: "memsets", RUNTIME: "runtimes", CPU_OP: "cpu_ops",
          ANNOTATION: "annotations", GPU_ANNOTATION: "gpu_annotations", PYTHON: "python", SYNC: "syncs"}


def _times(events: list[Any], field: Any) -> np.ndarray:
    """A time field of every event as floats, NaN where it has none."""
    values = list(map(field, events))
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.fromiter((np.nan if type(v) not in (int, float) else v for v in values), dtype=np.float64,
                           count=len(values))


def _sort_events(trace: Trace, events: list[Event]) -> Trace:
    """Complete events by kind, over columns of the whole list (their category, name, start and duration, which
    the kinds' :class:`Columns` then start from); ``ProfilerStep#N`` spans go to ``trace.steps``."""
    path = trace.path
    if not trace.events:
        trace.warnings.append("the trace has no events")
    category, categories = distinct_codes(list(map(_CAT, events)))
    kind_of = [CATEGORIES.get(cat) if cat is not None else None for cat in categories]
    kinds = list(_LISTS)
    kind = np.asarray([kinds.index(k) if k is not None else -1 for k in kind_of] or [-1], dtype=np.int64)[category]
    modeled = kind >= 0
    # from here on, the events of the categories perfhooks models (flows, metadata and counters are left)
    source = events
    events = [source[i] for i in np.flatnonzero(modeled).tolist()]
    kind = kind[modeled]
    name, names = distinct_codes(list(map(_NAME, events)))
    ts, dur = _times(events, _TS), _times(events, _DUR)
    usable = ~np.isnan(ts) & ~np.isnan(dur) & (dur >= 0)
    skipped = int(np.count_nonzero(~usable))
    with np.errstate(invalid="ignore"):
        corrupt = usable & ((ts >= 2.0**63) | (dur >= 2.0**63) | (ts <= -(2.0**63)))
    if corrupt.any():
        # JSON parsers read integers past 64 bits as floats instead of failing; times that large are corrupt
        raise TraceError(f"{path}: integer beyond int64 (ts/dur of {events[int(np.argmax(corrupt))].name!r})")
    step_names = np.asarray([isinstance(n, str) and n.startswith(STEP_PREFIX) and n[len(STEP_PREFIX):].isdigit()
                             for n in names] or [False], dtype=bool)[name]
    step_kinds = (kind == kinds.index(CPU_OP)) | (kind == kinds.index(ANNOTATION))
    is_step = usable & step_names & step_kinds
    steps = trace.steps
    for row in np.flatnonzero(is_step).tolist():
        event = events[row]
        steps.append((int(event.name[len(STEP_PREFIX):]), event.ts, event.ts + event.dur))
    sorted_rows = usable & ~is_step
    columns = trace.__dict__.setdefault("_columns", {})
    for index, kind_name in enumerate(kinds):
        rows = np.flatnonzero(sorted_rows & (kind == index))
        if not rows.size:
            continue
        listed = [events[i] for i in rows.tolist()]
        attribute = _LISTS[kind_name]
        getattr(trace, attribute).extend(listed)
        columns[attribute] = Columns(getattr(trace, attribute), ts=ts[rows], dur=dur[rows],
                                     name=(name[rows], names))
    unknown = [cat for cat, k in zip(categories, kind_of, strict=True) if k is None]
    if unknown:
        counts = np.bincount(category[~modeled], minlength=len(categories))
        unmodeled = {str(cat): int(counts[code]) for code, cat in enumerate(categories)
                     if kind_of[code] is None and cat not in IGNORED_CATEGORIES and counts[code]}
    else:
        unmodeled = {}
    if skipped:
        trace.warnings.append(f"{skipped} events without a numeric ts/dur were skipped")
    if unmodeled:
        trace.unmodeled = dict(sorted(unmodeled.items(), key=lambda item: -item[1]))
        listed_cats = ", ".join(f"{cat} ({count})" for cat, count in trace.unmodeled.items())
        trace.warnings.append(f"{sum(unmodeled.values())} events of categories perfhooks does not model were left "
                              f"out of every figure: {listed_cats}")
    implausible = usable & (dur > IMPLAUSIBLE_US)
    if implausible.any():
        rows = np.flatnonzero(implausible)
        longest = events[int(rows[np.argmax(dur[rows])])]
        trace.warnings.append(
            f"{rows.size} events last longer than {IMPLAUSIBLE_US / 3.6e9:.0f} h (the longest, "
            f"{longest.name!r}, {longest.dur / 1e6:.3g} s): their timestamps are corrupt, and every figure "
            f"over the time they cover is wrong")
    steps.sort(key=lambda step: step[1])
    return trace


def _read_metadata(trace: Trace, document: dict[str, Any]) -> None:
    """Rank and world size (``distributedInfo``, else ``rank<N>`` in the file name), device properties."""
    info = document.get("distributedInfo")
    if isinstance(info, dict):
        rank, world = info.get("rank"), info.get("world_size")
        trace.rank = rank if isinstance(rank, int) else None
        trace.world_size = world if isinstance(world, int) else None
    if trace.rank is None:
        match = RANK_IN_NAME.search(Path(trace.path).name)
        if match:
            trace.rank = int(match.group(1))
    for props in document.get("deviceProperties") or []:
        if isinstance(props, dict) and isinstance(props.get("id"), int):
            trace.device_properties[props["id"]] = props
