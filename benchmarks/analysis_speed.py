"""Speed and memory of ``perfhooks analyze`` on real traces, next to the standard library and the peers.

    python benchmarks/analysis_speed.py [TRACE ...]     # default: the traces in tests/data/traces
    python benchmarks/analysis_speed.py --ranks 8 [TRACE]   # a folder of 8 ranks: the cores against one process

Per trace it prints:
- the time of ``perfhooks analyze`` (read, gunzip, parse, every analyzer, diagnoses) ÷ the time of
  ``json.loads`` on the same uncompressed text (best of 3 each; target at most 1.5);
- peak RSS of a fresh process analysing it, ÷ the uncompressed JSON size (target at most 2.0 from 50,000 events);
- where installed (benchmarks/requirements.txt), HTA's ``TraceAnalysis`` load plus
  ``get_temporal_breakdown`` and the TensorBoard plugin's ``RunProfileData.parse``, as speed-ups (target 8x);
- ``load``: the time of reading and decoding the trace alone (``load_traces``), and ``floor``: the slower peer's
  time over it, the most any analysis after this decoder could reach.

Each peer runs ``--peer-repeats`` times (best kept), between two best-of-3 timings of perfhooks, so that a slow
spell of a shared machine weighs on both sides.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The trace ``--ranks`` copies by default: one rank of a two-rank NCCL job (40k events).
RANK_TRACE = REPO / "tests" / "data" / "traces" / "hta" / "a100_nccl_rank0_of2.json.gz"

# VmHWM (the peak RSS of this address space) is reset by exec; ru_maxrss is not: it would carry the
# parent's peak into the child.
PEAK_RSS = """
import sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
from perfhooks.offline.analyze import analyze_paths
if len(sys.argv) > 1:
    analyze_paths([sys.argv[1]])
print(peak())
"""


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak_rss_bytes(path: Path) -> int:
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def baseline_rss_bytes() -> int:
    """Peak RSS of an interpreter that imported perfhooks' analysis and analysed nothing."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS], capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def hta_seconds(path: Path) -> float | None:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as folder:
        os.symlink(path.resolve(), Path(folder) / ("rank0.json.gz" if path.name.endswith(".gz") else "rank0.json"))
        start = time.perf_counter()
        TraceAnalysis(trace_dir=folder).get_temporal_breakdown(visualize=False)
        return time.perf_counter() - start


def tb_plugin_seconds(path: Path) -> float | None:
    try:
        from torch_tb_profiler.profiler.data import RunProfileData
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        RunProfileData.parse("worker", "span", str(path), cache)
        return time.perf_counter() - start


def peer_seconds(peer: str, path: Path, python: str | None, repeats: int = 1) -> float | None:
    """Seconds the peer takes on ``path`` (the best of ``repeats`` fresh processes); run by ``python`` (the
    benchmark environment with the peers)."""
    best = None
    for _ in range(repeats):
        if python is None:
            seconds = (hta_seconds if peer == "hta" else tb_plugin_seconds)(path)
        else:
            done = subprocess.run([python, __file__, "--peer", peer, str(path)], capture_output=True, text=True,
                                  timeout=3600, check=False)
            lines = done.stdout.strip().splitlines()
            seconds = float(lines[-1]) if done.returncode == 0 and lines and lines[-1] != "None" else None
        if seconds is None:
            return None
        best = seconds if best is None else min(best, seconds)
    return best


def _json_loads_figures(path: Path, repeats: int) -> tuple[int, int, float]:
    """Events, uncompressed bytes, and the best ``json.loads`` time (s) of the uncompressed text."""
    text = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    document = json.loads(text)
    events = len(document if isinstance(document, list) else document.get("traceEvents", []))  # 2021: an array
    del document
    return events, len(text), best_of(lambda: json.loads(text), repeats)


def measure_trace(path: Path, peers: bool = False, peers_python: str | None = None, repeats: int = 3,
                  baseline_rss: int | None = None, peer_repeats: int = 2) -> dict[str, Any]:
    """One trace's figures: events, bytes, json.loads, load and analyze seconds (best of ``repeats``), RSS/JSON,
    and with ``peers`` HTA's and the TensorBoard plugin's seconds (best of ``peer_repeats``)."""
    from perfhooks.analysis.trace import load_traces
    from perfhooks.offline.analyze import analyze_paths

    events, json_bytes, loads = _json_loads_figures(path, repeats)  # the text is freed before analyze runs
    analyze = best_of(lambda: analyze_paths([path]), repeats)
    load = best_of(lambda: load_traces(path), repeats)
    base = baseline_rss if baseline_rss is not None else baseline_rss_bytes()
    result: dict[str, Any] = {"trace": path.name, "events": events, "json_bytes": json_bytes,
                              "json_loads_s": loads, "load_s": load,
                              "rss_over_json": (peak_rss_bytes(path) - base) / json_bytes}
    if peers:
        for peer in ("hta", "tb_plugin"):
            result[f"{peer}_s"] = peer_seconds(peer, path, peers_python, peer_repeats)
        analyze = min(analyze, best_of(lambda: analyze_paths([path]), repeats))
        for peer in ("hta", "tb_plugin"):
            seconds = result[f"{peer}_s"]
            result[f"speedup_vs_{peer}"] = seconds / analyze if seconds else None
        slower = max((result[f"{peer}_s"] or 0.0) for peer in ("hta", "tb_plugin"))
        result["floor"] = slower / load if slower else None
    result["analyze_s"], result["ratio_to_json_loads"] = analyze, analyze / loads
    return result


def write_ranks(trace: Path, folder: Path, ranks: int) -> None:
    document = json.loads(gzip.decompress(trace.read_bytes()) if trace.name.endswith(".gz") else trace.read_bytes())
    for rank in range(ranks):
        document["distributedInfo"] = {**(document.get("distributedInfo") or {}), "rank": rank, "world_size": ranks}
        (folder / f"rank{rank}.trace.json.gz").write_bytes(gzip.compress(json.dumps(document).encode(), 1))


def verdicts(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(d.get("rule"), d.get("severity"), d.get("title"), d.get("ranks")) for d in report.get("diagnoses", [])]


def measure_ranks(trace: Path, ranks: int, repeats: int) -> dict[str, Any]:
    """``perfhooks analyze`` over a folder of ``ranks`` copies of ``trace`` (each saying its own rank), one process
    against the machine's cores, interleaved ``repeats`` times (best kept): seconds, ratio, same verdicts."""
    from perfhooks.offline.analyze import analyze_paths

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_ranks(trace, folder, ranks)
        times: dict[str, float] = {}
        reports: dict[str, dict[str, Any]] = {}
        for _ in range(repeats):  # interleaved, so that a slow spell of the machine weighs on both
            for way, workers in (("serial", 1), ("parallel", None)):
                start = time.perf_counter()
                reports[way] = analyze_paths([folder], workers=workers)
                elapsed = time.perf_counter() - start
                times[way] = min(times.get(way, elapsed), elapsed)
    return {"trace": trace.name, "ranks": ranks, "cores": os.cpu_count(), "serial_s": times["serial"],
            "parallel_s": times["parallel"], "ratio": times["parallel"] / times["serial"],
            "same_verdicts": verdicts(reports["serial"]) == verdicts(reports["parallel"]),
            "verdicts": len(verdicts(reports["serial"]))}


def format_row(r: dict[str, Any]) -> str:
    line = (f"{r['trace'][:46]:<46} {r['events']:>7} {r['json_bytes'] / 1e6:>5.1f} {r['json_loads_s']:>9.3f}s "
            f"{r['load_s']:>6.3f}s {r['analyze_s']:>6.3f}s {r['ratio_to_json_loads']:>6.2f} {r['rss_over_json']:>8.2f}")
    for peer in ("hta", "tb_plugin"):
        if f"speedup_vs_{peer}" in r:
            speedup = r[f"speedup_vs_{peer}"]
            line += f"  {speedup:5.1f}" if speedup else "    n/a"
    if r.get("floor"):
        line += f"  {r['floor']:5.1f}"
    return line


HEADER = (f"{'trace':<46} {'events':>7} {'MB':>5} {'json.loads':>10} {'load':>7} {'analyze':>7} {'ratio':>6} "
          f"{'RSS/JSON':>8}  HTA x  TB x  floor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--peers", action="store_true", help="also time HTA and the TensorBoard plugin")
    parser.add_argument("--peers-python", help="an interpreter with the peers installed (default: this one)")
    parser.add_argument("--peer-repeats", type=int, default=2, help="runs of each peer, the best kept (default 2)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--ranks", type=int, help="instead: a folder of this many copies of the (first) trace, "
                        "one process against the cores (target: at most 0.6 of the serial time, same verdicts)")
    parser.add_argument("--peer", choices=("hta", "tb_plugin"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer:
        print((hta_seconds if args.peer == "hta" else tb_plugin_seconds)(args.traces[0]))
        return 0
    from perfhooks.device.describe import cpu_model

    if args.ranks:
        trace = args.traces[0] if args.traces else RANK_TRACE
        r = measure_ranks(trace, args.ranks, 3)
        print(f"machine: {cpu_model()}, {r['cores']} cores; {r['ranks']} ranks of {r['trace']}: serial "
              f"{r['serial_s']:.3f}s parallel {r['parallel_s']:.3f}s ratio {r['ratio']:.2f}, same verdicts: "
              f"{r['same_verdicts']} ({r['verdicts']} verdicts)")
        return 0 if r["same_verdicts"] else 1
    traces = args.traces or sorted((REPO / "tests" / "data" / "traces").rglob("*.json.gz"))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(HEADER)
    base = baseline_rss_bytes()
    rows = []
    for path in traces:
        rows.append(measure_trace(path, args.peers, args.peers_python, baseline_rss=base,
                                  peer_repeats=args.peer_repeats))
        print(format_row(rows[-1]), flush=True)
    print("targets: ratio <= 1.5 (analyze time / json.loads time), RSS/JSON <= 1.5 (peak RSS above an idle "
          "interpreter with perfhooks imported, / uncompressed JSON bytes); peers: >= 8x; floor: the slower peer / "
          "load")
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_model(), "cores": os.cpu_count(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
