"""The analyzers read a trace's events as columns (numpy arrays per field). The columns say what the events say,
whichever way they were built: seeded when a file is sorted into kinds, or read from events a caller made."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from fixtures import TRACES as TRACES_FOLDER
from fixtures import path
from perfhooks.analysis.columns import ABSENT, Columns
from perfhooks.analysis.trace import Args, Event, Trace, load_trace, parse_trace
from perfhooks.offline.analyze import analyze_trace

H100_WINDOW = TRACES_FOLDER / "h100" / "lightning_gpt135m_bf16_window.pt.trace.json.gz"
TRACES = ["v100_ns_resolution.pt.trace.json.gz", "a100_nccl_rank0_of2.json.gz", "tl_mi300_resnet_act_ckpt.json.gz",
          "kineto_resnet50_nw0_jan2021.pt.trace.json.gz", "cpu_only_gloo_rank34.pt.trace.json.gz",
          "tl_sglang_qwen3_prefilldecode.json.gz"]


def _events() -> list[Event]:
    return [
        Event(cat="kernel", name="k", ts=1.5, dur=2.0, pid=0, tid=7, args=Args(correlation=11, device=3)),
        Event(cat="kernel", name="k", ts=5.0, dur=1.0, pid=2, tid=7, args=Args(external_id_old=4)),
        Event(cat="kernel", name="m", ts=9.0, dur=0.5, pid="host", tid=8),
    ]


def test_each_field_is_what_the_events_say() -> None:
    columns = Columns(_events())
    assert columns.ts.tolist() == [1.5, 5.0, 9.0] and columns.end.tolist() == [3.5, 6.0, 9.5]
    assert columns.correlation.tolist() == [11, ABSENT, ABSENT]
    assert columns.external_id.tolist() == [ABSENT, 4, ABSENT]
    # the device: args.device, else the pid where it is a number
    assert columns.device.tolist() == [3, 2, ABSENT]
    assert [columns.names[c] for c in columns.name] == ["k", "k", "m"]
    assert [columns.threads[c] for c in columns.thread] == [(0, 7), (2, 7), ("host", 8)]
    assert [(e.correlation, e.external_id, e.device) for e in columns.events] == [(11, None, 3), (None, 4, 2),
                                                                                (None, None, "host")]


def test_arguments_written_as_null_are_read_event_by_event() -> None:
    """The fast path reads the arguments in C; an event whose args (or a field of them) is null takes the slow
    one, with the same result."""
    events = parse_trace({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 1, "args": None},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 2, "dur": 1, "pid": 0, "tid": 1,
         "args": {"correlation": None, "External id": 9, "device": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 3, "dur": 1, "pid": 0, "tid": 1,
         "args": {"correlation": 5, "External id": 2**70}}]}).kernels
    columns = Columns(events)
    assert columns.correlation.tolist() == [ABSENT, ABSENT, 5]
    assert columns.external_id.tolist() == [ABSENT, 9, ABSENT]  # past 64 bits is no id
    assert columns.device.tolist() == [0, 1, 0]


def test_rows_and_joins_keep_their_events() -> None:
    columns = Columns(_events())
    rows = columns.subset(np.array([2, 0]))
    assert [e.ts for e in rows.events] == rows.ts.tolist() == [9.0, 1.5]
    assert [rows.names[c] for c in rows.name] == ["m", "k"]
    joined = Columns.concat([rows, Columns(_events()[1:2])])
    assert joined.ts.tolist() == [9.0, 1.5, 5.0]
    assert [joined.names[c] for c in joined.name] == ["m", "k", "k"]
    assert joined.sorted_by_start().ts.tolist() == [1.5, 5.0, 9.0]


def _unseeded(trace: Trace) -> Trace:
    """The same trace as a caller builds it: its lists, no columns read yet."""
    return dataclasses.replace(trace, **{kind: list(getattr(trace, kind)) for kind in (
        "kernels", "memcpys", "memsets", "runtimes", "cpu_ops", "annotations", "gpu_annotations", "python", "syncs")},
        warnings=list(trace.warnings))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.mark.parametrize("name", [*TRACES, H100_WINDOW.name])
def test_seeded_columns_give_the_report_that_events_give(name: str) -> None:
    """Columns seeded at load time (the sort into kinds) and columns read from the events give the same report,
    to the bit."""
    loaded = load_trace(H100_WINDOW if name == H100_WINDOW.name else path(name))
    plain = _unseeded(loaded)
    assert "_columns" not in plain.__dict__
    first, second = analyze_trace(loaded), analyze_trace(plain)
    for report in (first, second):
        report.pop("created_at", None), report.pop("updated_at", None)
    assert _same(first, second)


def test_a_document_parsed_event_by_event_sorts_as_the_fast_path() -> None:
    """The generic parse (a document of dicts) and the fast decode sort the same events into the same kinds."""
    source = path("a100_nccl_rank0_of2.json.gz")
    fast = load_trace(source)
    import gzip
    slow = parse_trace(json.loads(gzip.decompress(source.read_bytes())), str(source))
    for kind in ("kernels", "runtimes", "cpu_ops", "annotations", "python", "memcpys"):
        assert [(e.name, e.ts) for e in getattr(fast, kind)] == [(e.name, e.ts) for e in getattr(slow, kind)]
        assert fast.columns(kind).ts.tolist() == slow.columns(kind).ts.tolist()
    assert fast.steps == slow.steps


def test_the_names_of_a_kind_are_its_own() -> None:
    """The kinds share one table of names; a kind's names are only those its events carry."""
    trace = load_trace(path("a100_nccl_rank0_of2.json.gz"))
    assert trace.names("runtimes", "") == frozenset(e.name for e in trace.runtimes if e.name)
    assert trace.names("cpu_ops", "aten::") == frozenset(e.name for e in trace.cpu_ops
                                                          if e.name and e.name.startswith("aten::"))
