"""A trace decoded a few hundred KB at a time reads exactly as the whole file does, and a cut that is not
between two events (inside a string, inside an event's nested objects) sends the file to the whole-file path."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fixtures import path
from perfhooks.analysis import trace as trace_module
from perfhooks.analysis.trace import load_traces, read_trace_bytes
from perfhooks.files import json_chunks

KINDS = ("kernels", "memcpys", "memsets", "runtimes", "cpu_ops", "annotations", "gpu_annotations", "python", "syncs")


def _whole(file: Path | str) -> list[trace_module.Trace]:
    """What the whole-file path reads (the pieces path disabled)."""
    original = trace_module._decode_in_pieces
    trace_module._decode_in_pieces = lambda _path: None
    try:
        return load_traces(file)
    finally:
        trace_module._decode_in_pieces = original


def _same(left: list[trace_module.Trace], right: list[trace_module.Trace]) -> None:
    assert len(left) == len(right)
    for one, other in zip(left, right, strict=True):
        assert (one.events, one.rank, one.world_size, one.steps, one.device_properties, one.warnings) == (
            other.events, other.rank, other.world_size, other.steps, other.device_properties, other.warnings)
        for kind in KINDS:
            assert getattr(one, kind) == getattr(other, kind), kind
        assert [op.input_dims for op in one.cpu_ops] == [op.input_dims for op in other.cpu_ops]


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pieces of 16 KB, so that even a small trace is cut many times; the list gathers each piece's size."""
    monkeypatch.setattr(json_chunks, "PIECE_BYTES", 16 << 10)
    monkeypatch.setattr(trace_module, "PIECES_FROM_BYTES", 0)
    sizes: list[int] = []
    split = json_chunks.split_array

    def counting(blocks, key):
        for last, piece in split(blocks, key):
            sizes.append(len(piece))
            yield last, piece

    monkeypatch.setattr(trace_module, "split_array", counting)
    return sizes


@pytest.mark.parametrize("name", [
    "a100_nccl_rank0_of2.json.gz",  # a dict document, distributedInfo before the events
    "kineto_resnet50_nw0_jan2021.pt.trace.json.gz",  # the January 2021 format: the file is the array
    "mi250_minitoy_train.json.gz",  # ROCm, numbers written as strings
])
def test_pieces_read_as_the_whole_file(name: str, small_pieces: list[int]) -> None:
    pieces = load_traces(path(name))
    assert len(small_pieces) > 1 or name.startswith("mi250")  # cut many times (the ROCm toy is 70 KB)
    _same(pieces, _whole(path(name)))


def test_a_plain_json_file_reads_in_pieces(tmp_path: Path, small_pieces: list[int]) -> None:
    plain = tmp_path / "trace.json"
    plain.write_bytes(read_trace_bytes(path("a100_nccl_rank0_of2.json.gz")))
    traces = load_traces(plain)
    assert len(small_pieces) > 10 and max(small_pieces[:-1]) < 64 << 10
    _same(traces, _whole(plain))


def _awkward_trace(events: int) -> dict:
    """Events whose names and args hold ``}, {`` inside strings and nested arrays of objects, and metadata on
    both sides of the events."""
    rows = []
    for index in range(events):
        rows.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm" if index % 2 else 'odd}, {"name"',
                     "pid": 1, "tid": 1, "ts": 10.0 * index, "dur": 5.0,
                     "args": {"External id": index, "Input Dims": [[4, 4], [4, 4]],
                              "nested": [{"a": 1}, {"b": "}, {"}]}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "a GPU"}], "traceEvents": rows,
            "traceName": "after the events", "distributedInfo": {"rank": 3, "world_size": 4}}


@pytest.mark.parametrize("indent", [None, 1, 2])
def test_a_cut_that_is_not_between_events_reads_right(tmp_path: Path, small_pieces: list[int],
                                                       indent: int | None) -> None:
    file = tmp_path / "awkward.json.gz"
    file.write_bytes(gzip.compress(json.dumps(_awkward_trace(3000), indent=indent).encode()))
    traces = load_traces(file)
    _same(traces, _whole(file))
    (only,) = traces
    assert (only.rank, only.world_size, len(only.cpu_ops)) == (3, 4, 3000)
    assert only.device_name(0) == "a GPU"


def test_a_trace_whose_events_come_last_after_a_long_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The events' key past the first bytes read: the document is read whole, as before."""
    monkeypatch.setattr(json_chunks, "HEAD_LIMIT", 1 << 10)
    document = _awkward_trace(50)
    document = {"padding": "x" * 4096, **document}
    file = tmp_path / "late.json"
    file.write_text(json.dumps(document))
    (only,) = load_traces(file)
    assert len(only.cpu_ops) == 50


def test_a_small_trace_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU window's trace (under 256 KB gzipped), which the training process analyses itself, is read in one
    buffer: many pieces would leave its heap larger than it found it."""
    calls: list[str] = []
    monkeypatch.setattr(trace_module, "split_array", lambda *args: calls.append("pieces") or iter(()))
    (small,) = load_traces(path("mi250_minitoy_train.json.gz"))
    assert small.kernels and calls == []
