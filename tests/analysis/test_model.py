"""One trace model for old and new formats, NVIDIA and AMD, one rank or many; bad input in one line."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import TRACES, path
from perfhooks.analysis.trace import Trace, TraceError, load_trace


@pytest.mark.parametrize(("name", "rank", "steps", "kernels"), [
    ("resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz", None, 6, 8772),
    ("a100_nccl_rank0_of2.json.gz", 0, 3, 2700),
    ("a100_alexnet_sync.json.gz", 0, 0, 79),
    ("cpu_only_gloo_rank34.pt.trace.json.gz", 34, 1, 0),
    ("mi250_minitoy_train.json.gz", None, 2, 14),
])
def test_old_and_new_formats_parse(name: str, rank: int | None, steps: int, kernels: int) -> None:
    trace = load_trace(path(name))
    assert isinstance(trace, Trace)
    assert trace.rank == rank
    assert len(trace.steps) == steps
    assert len(trace.kernels) == kernels
    assert trace.warnings == []


def test_old_categories_are_the_new_ones() -> None:
    old = load_trace(path("resnet50_num_workers_0.worker0.1623143089861.pt.trace.json.gz"))
    assert old.cpu_ops and old.runtimes and old.memcpys and old.memsets
    assert old.device_name(0) == "Tesla V100-DGXS-32GB"
    new = load_trace(path("a100_nccl_rank0_of2.json.gz"))
    assert new.world_size == 2 and new.gpu_annotations and new.annotations


def test_rank_from_the_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    copy = tmp_path / "run.rank7.trace.json.gz"
    shutil.copy(path("mi250_minitoy_train.json.gz"), copy)
    assert load_trace(copy).rank == 7


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    target = tmp_path / name
    target.write_bytes(data)
    return target


def bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = path("cpu_only_gloo_rank34.pt.trace.json.gz").read_bytes()
    events = json.dumps({"traceEvents": []}).encode()
    (tmp_path / "empty_folder").mkdir()
    return {
        "truncated gzip": (write(tmp_path, "truncated.json.gz", good[: len(good) // 2]), "truncated or corrupt gzip"),
        "gzip with a wrong CRC": (write(tmp_path, "crc.json.gz", good[:-8] + bytes(4) + good[-4:]),
                                  "truncated or corrupt gzip"),
        "invalid UTF-8": (write(tmp_path, "latin1.json", b'{"traceEvents": [], "x": "\xff\xfe"}'), "invalid UTF-8"),
        "not JSON": (write(tmp_path, "notjson.json", b"this is not json"), "not JSON"),
        "no traceEvents": (write(tmp_path, "noevents.json", b'{"schemaVersion": 1}'), "no traceEvents"),
        "huge integer": (write(tmp_path, "huge.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", '
                               b'"name": "k", "ts": 99999999999999999999999, "dur": 1}]}'), "integer beyond int64"),
        "empty file": (write(tmp_path, "empty.json", b""), "empty file"),
        "gzip of garbage": (write(tmp_path, "garbage.json.gz", gzip.compress(b"\x00\x01garbage")), "not JSON"),
        "folder without traces": (tmp_path / "empty_folder", "no trace files"),
        "missing path": (tmp_path / "absent.json", "no such file or folder"),
        "top level array of numbers": (write(tmp_path, "array.json", events.replace(b"{", b"[").replace(
            b'"traceEvents": []}', b"1, 2]")), "not a trace"),
    }


def test_a_gzip_of_several_members_reads_whole_as_gzip_does(tmp_path: Path) -> None:
    """One member is inflated in one call (ISA-L where installed); a file of several (``cat a.gz b.gz``) is still
    read whole."""
    from perfhooks.analysis.trace import read_trace_bytes

    text = json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}).encode()
    one = write(tmp_path, "one.json.gz", gzip.compress(text))
    two = write(tmp_path, "two.json.gz", gzip.compress(text[:20]) + gzip.compress(text[20:]))
    assert read_trace_bytes(one) == read_trace_bytes(two) == text


def test_bad_input_corpus_exits_2_with_one_line_each(tmp_path: Path) -> None:
    for case, (target, reason) in bad_inputs(tmp_path).items():
        done = subprocess.run([sys.executable, "-m", "perfhooks", "analyze", str(target)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, case
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (case, done.stderr)
        assert str(target) in lines[0] and reason in lines[0], (case, lines[0])
        assert "Traceback" not in done.stderr


def test_usable_data_goes_on_with_a_warning(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 2.0},
              {"ph": "X", "cat": "cpu_op", "name": "broken", "ts": "soon", "dur": 1.0},
              {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0.0, "dur": 10.0}]
    trace_path = write(tmp_path, "partial.json", json.dumps({"traceEvents": events}).encode())
    trace = load_trace(trace_path)
    assert len(trace.cpu_ops) == 1 and trace.steps == [(3, 0.0, 10.0)]
    # the unusable field goes, the event stays; an event with no time at all cannot be placed and is skipped
    assert trace.warnings == ["1 event fields of unexpected types were left out (their events were kept)",
                              "1 events without a numeric ts/dur were skipped"]


def test_a_field_of_an_unexpected_type_costs_the_field_not_the_event(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 2.0,
               "args": {"Input Dims": [[8, 8], [8, 8]], "correlation": {"not": "a number"}}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 2.0, "dur": "3.5",
               "args": {"bytes": "4096", "device": "0"}}]
    trace = load_trace(write(tmp_path, "odd.json", json.dumps({"traceEvents": events}).encode()))
    [op] = trace.cpu_ops
    assert op.input_dims == [[8, 8], [8, 8]] and op.correlation is None
    [copy] = trace.memcpys
    assert copy.dur == 3.5 and copy.a.bytes == 4096 and copy.device == 0


def test_error_is_one_line_for_a_missing_file() -> None:
    with pytest.raises(TraceError) as caught:
        load_trace(TRACES / "absent.json")
    assert "\n" not in str(caught.value)


def synthetic(tmp_path: Path, events: list[dict], name: str = "synthetic.json") -> Path:
    return write(tmp_path, name, json.dumps({"traceEvents": events}).encode())


def kernel(name: str, ts: float, dur: float, correlation: int) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"device": 0, "correlation": correlation, "External id": correlation}}


def test_tensor_cores_tf32_and_attention_from_kernel_names(tmp_path: Path) -> None:
    from perfhooks.offline.analyze import analyze_paths

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1,
               "tid": 1},
              kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32", 10, 300, 1),
              kernel("ampere_sgemm_128x64_nn", 320, 100, 2),
              kernel("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize", 430, 100, 3),
              kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", 540, 200, 4)]
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5 + i, "dur": 1, "pid": 1,
                "tid": 1, "args": {"correlation": i}} for i in range(1, 5)]
    metrics = analyze_paths([synthetic(tmp_path, events)])["metrics"]
    tensor = metrics["tensor_cores"]
    assert tensor["tensor_core_share"] == pytest.approx(600 / 700)
    assert tensor["tf32_share"] == pytest.approx(100 / 700)
    assert tensor["fp32_simt_gemm_share"] == pytest.approx(100 / 700)
    assert metrics["attention"] == {"flash": 200.0}


def test_compilation_inside_the_window_is_seen(tmp_path: Path) -> None:
    from perfhooks.offline.analyze import analyze_paths

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 100, "pid": 1,
               "tid": 1},
              {"ph": "X", "cat": "python_function", "name": "torch/_dynamo/convert_frame.py(560): _compile",
               "ts": 1, "dur": 50, "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "ts": 60, "dur": 30, "pid": 1,
               "tid": 1}]
    result = analyze_paths([synthetic(tmp_path, events)])
    assert result["metrics"]["compile"] == {"compiled_region": True, "compiling_in_window": True}
    assert "compile_warmup" in [d["id"] for d in result["diagnoses"]]


def test_streams_and_python_call_sites_of_syncs(tmp_path: Path) -> None:
    from perfhooks.offline.analyze import analyze_paths

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "ts": 0, "dur": 1000, "pid": 1,
               "tid": 1},
              kernel("void gemm_kernel", 10, 300, 1), kernel("void relu_kernel", 320, 50, 2),
              {"ph": "X", "cat": "kernel", "name": "void copy_kernel", "ts": 20, "dur": 40, "pid": 0, "tid": 13,
               "args": {"device": 0, "correlation": 3}},
              {"ph": "X", "cat": "python_function", "name": "train.py(42): train_step", "ts": 400, "dur": 300,
               "pid": 1, "tid": 1},
              {"ph": "X", "cat": "python_function", "name": "torch/_tensor.py(10): item", "ts": 500, "dur": 20,
               "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 505, "dur": 10, "pid": 1, "tid": 1},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 507, "dur": 6, "pid": 1,
               "tid": 1, "args": {"correlation": 9}}]
    metrics = analyze_paths([synthetic(tmp_path, events)])["metrics"]
    assert metrics["host_sync"]["by_kind_per_step"] == {"aten::item": 1.0}, "one .item(), one sync"
    assert metrics["streams"] == [{"device": 0, "stream": 7, "events": 2, "busy_us": 350.0},
                                  {"device": 0, "stream": 13, "events": 1, "busy_us": 40.0}]
    assert metrics["host_sync"]["call_sites"] == [{"site": "train.py(42): train_step", "count": 1}]


def _all_traces() -> list[Path]:
    from fixtures import TRACES

    return sorted(TRACES.rglob("*.json.gz"))


@pytest.mark.parametrize("trace_path", _all_traces(), ids=lambda p: p.name[:40])
def test_the_parser_keeps_every_event(trace_path: Path) -> None:
    """Every complete event of a known category, counted from the raw JSON, is in the model: a field of an
    unexpected type (ROCm's string ``args.bytes``) or the 2021 array format never costs an event."""
    import gzip

    import orjson

    from perfhooks.analysis.trace import CATEGORIES, load_trace

    document = orjson.loads(gzip.decompress(trace_path.read_bytes()))
    events = document if isinstance(document, list) else document["traceEvents"]
    expected = sum(1 for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in CATEGORIES
                   and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0
                   and isinstance(e.get("ts"), (int, float)))
    trace = load_trace(trace_path)
    kept = sum(len(bucket) for bucket in (trace.kernels, trace.memcpys, trace.memsets, trace.runtimes, trace.cpu_ops,
                                          trace.annotations, trace.gpu_annotations, trace.python, trace.syncs))
    assert kept + len(trace.steps) == expected
    assert not [w for w in trace.warnings if "skipped" in w]


def test_rocm_string_bytes_keep_the_shaped_operators() -> None:
    from fixtures import report

    result = report("tl_mi300_resnet_act_ckpt.json.gz")
    assert result["warnings"] == []
    assert result["metrics"]["top_operators"]
    trace = load_trace(path("tl_mi300_resnet_act_ckpt.json.gz"))
    assert sum(1 for op in trace.cpu_ops if op.input_dims) > 1000, "the operators that recorded shapes are there"


def test_the_january_2021_array_format_has_its_steps_and_device() -> None:
    from fixtures import report

    result = report("kineto_resnet50_nw0_jan2021.pt.trace.json.gz")
    assert result["steps"] == 6 and result["device"]["type"] == "cuda"
    assert "dataloader_bound" in [d["id"] for d in result["diagnoses"]]


def test_within_keeps_only_what_started_in_the_steps(tmp_path) -> None:
    """Op and kernel analyzers read ``trace.within(steps)``: evaluation or checkpoint work that a perfhooks
    window records between its steps is not the steps' work. A real trace, with one op added after its steps."""
    import gzip
    import json

    from fixtures import path
    from perfhooks.analysis.overview import device_steps
    from perfhooks.analysis.trace import load_trace

    document = json.loads(gzip.decompress(path("mi250_minitoy_train.json.gz").read_bytes()))
    events = document["traceEvents"]
    last = max(e["ts"] + e["dur"] for e in events if e.get("ph") == "X" and "dur" in e)
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::evaluation_only", "pid": 1, "tid": 1,
                   "ts": last + 1000, "dur": 10})
    (tmp_path / "t.json").write_text(json.dumps(document))
    trace = load_trace(tmp_path / "t.json")
    window = [(start, end) for _, start, end in device_steps(trace)]
    inside = trace.within(window)
    assert "aten::evaluation_only" in {op.name for op in trace.cpu_ops}
    assert "aten::evaluation_only" not in {op.name for op in inside.cpu_ops}
    assert all(any(start <= op.ts < end for start, end in window) for op in inside.cpu_ops + inside.kernels)
    assert inside.steps == trace.steps and inside.path == trace.path
