"""Every benchmark, side by side with the peers, in one command; results saved as JSON.

    python benchmarks/suite.py                 # about 25 min on 2 cores
    python benchmarks/suite.py --quick         # about 8 min: smaller model, fewer steps, smaller synthetic traces

1. Overhead on the training loop (benchmarks/overhead.py): Lightning, accelerate and HF Trainer,
   each variant against no profiling, interleaved rounds; and the telemetry's cost inside one
   process, the engine's events sent on every other step ("alternating").
2. Annotation cost (benchmarks/annotation_cost.py), ns per call.
3. Analysis speed and memory (benchmarks/analysis_speed.py) on the repo's real traces and on
   synthetic traces of 1M and 3M events (benchmarks/synthetic.py), against ``json.loads``, HTA
   and the TensorBoard plugin. The peers come from ``--peers-python`` (an interpreter with
   benchmarks/requirements.txt installed) or this interpreter if it has them.
4. On CUDA: CUDA-event timing accuracy against ``torch.cuda._sleep`` and the memory-history overhead.

Results go to ``benchmarks/results/<hostname>-<date>.json`` with the machine and versions; each
target is printed as met or missed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import analysis_speed  # noqa: E402
import annotation_cost  # noqa: E402
import overhead  # noqa: E402
import synthetic  # noqa: E402
from common import describe_machine, machine_info  # noqa: E402

TARGETS = {
    "telemetry_overhead": ("perfhooks (outside windows) / none", 1.01, "max"),
    "host_cost_us": ("engine host cost per step, µs", 20.0, "max"),
    "window_vs_bare": ("perfhooks window / bare torch.profiler", 1.05, "max"),
    "analyze_vs_json_loads": ("analyze / json.loads", 1.5, "max"),
    "rss_over_json": ("peak RSS / JSON bytes", 3.0, "max"),
    "speedup_vs_peers": ("speed-up vs HTA and the TB plugin", 5.0, "min"),
    "scaling_3m_over_1m": ("time at 3M events / time at 1M", 3.3, "max"),
}


SECTIONS = ("overhead", "alternating", "host_cost", "annotation", "analysis", "cuda")


def check(name: str, value: float | None, verdicts: dict[str, Any], detail: str = "") -> None:
    label, limit, kind = TARGETS[name]
    met = None if value is None else (value <= limit if kind == "max" else value >= limit)
    verdicts.setdefault(name, []).append({"value": value, "limit": limit, "met": met, "detail": detail})
    sign = "<=" if kind == "max" else ">="
    state = "n/a" if met is None else ("met" if met else "MISSED")
    shown = "n/a" if value is None else f"{value:.4g}"
    print(f"  target {label} {sign} {limit}: {shown} {state} {detail}")


def peers_available(python: str | None) -> bool:
    if python:
        return True
    try:
        import hta  # noqa: F401
        import torch_tb_profiler  # noqa: F401
    except ImportError:
        return False
    return True


def analysis_section(quick: bool, peers_python: str | None, verdicts: dict[str, Any]) -> dict[str, Any]:
    peers = peers_available(peers_python)
    if not peers:
        print("  peers: not installed (pip install -r benchmarks/requirements.txt, or --peers-python); skipped")
    traces = sorted((HERE.parent / "tests" / "data" / "traces").rglob("*.json.gz"))
    base = analysis_speed.baseline_rss_bytes()
    rows = []
    print(analysis_speed.HEADER)
    for path in traces:
        row = analysis_speed.measure_trace(path, peers, peers_python, baseline_rss=base)
        rows.append(row)
        print(analysis_speed.format_row(row), flush=True)
    sizes = (200_000, 600_000) if quick else (1_000_000, 3_000_000)
    synthetic_rows = []
    with tempfile.TemporaryDirectory() as folder:
        for size in sizes:
            path = Path(folder) / f"synthetic_{size // 1000}k.json"
            synthetic.write_synthetic(size, path)
            row = analysis_speed.measure_trace(path, peers and size == sizes[0], peers_python, repeats=1,
                                               baseline_rss=base)
            synthetic_rows.append(row)
            print(analysis_speed.format_row(row), flush=True)
            path.unlink()
    for row in rows + synthetic_rows:
        large = row["events"] >= 50_000  # small traces are dominated by fixed costs (imports, process start)
        if large:
            check("analyze_vs_json_loads", row["ratio_to_json_loads"], verdicts, row["trace"])
            check("rss_over_json", row["rss_over_json"], verdicts, row["trace"])
            for peer in ("hta", "tb_plugin"):
                if f"speedup_vs_{peer}" in row:
                    check("speedup_vs_peers", row[f"speedup_vs_{peer}"], verdicts, f"{peer} on {row['trace']}")
    scaling = synthetic_rows[1]["analyze_s"] / synthetic_rows[0]["analyze_s"]
    check("scaling_3m_over_1m", scaling, verdicts, f"{sizes[1]} / {sizes[0]} events")
    return {"real": rows, "synthetic": synthetic_rows, "scaling": scaling}


def cuda_section(quick: bool) -> dict[str, Any]:
    """CUDA-event timing against a known device delay, and the memory-history overhead (CUDA only)."""
    import torch

    from perfhooks import Engine, PerfConfig

    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    truth = []
    for _ in range(10):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        truth.append(start.elapsed_time(end))
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(PerfConfig(schedule=None, console=False, memory=False), out, "benchmark", device="cuda")
        for _ in range(20):
            engine.phase_start("forward")
            torch.cuda._sleep(cycles)
            engine.phase_start("optimizer")
            engine.step_end()
        report = engine.close()
    measured = report["phases"]["forward"]["p50_ms"]
    expected = statistics.median(truth)
    print(f"  CUDA timing: forward p50 {measured:.3f} ms vs _sleep {expected:.3f} ms "
          f"(error {abs(measured - expected) / expected:.2%})")
    steps = 10 if quick else 20
    history: dict[str, Any] = {}
    # memory_history from the start / armed on approach (a healthy run never arms) / off, interleaved rounds,
    # on the tutorial layer and a model 4x as wide
    for d_model in ((256,) if quick else (512, 2048)):
        ratios: dict[str, list[float]] = {"from_start": [], "on_approach": []}
        for round_ in range(5):
            modes = ["off", "from_start", "on_approach"]
            times = {}
            for mode in modes[round_ % 3:] + modes[:round_ % 3]:
                with tempfile.TemporaryDirectory() as out:
                    times[mode] = overhead.lightning_step_ms(f"perfhooks_history_{mode}", steps, d_model, out)
            for mode in ratios:
                ratios[mode].append(times[mode] / times["off"])
        history[str(d_model)] = {mode: {"median": statistics.median(r), "min": min(r), "max": max(r)}
                                 for mode, r in ratios.items()}
        print(f"  memory history, d_model {d_model}, step time / off: from the start "
              f"{statistics.median(ratios['from_start']):.4f}, armed on approach "
              f"{statistics.median(ratios['on_approach']):.4f}")
    return {"timing_measured_ms": measured, "timing_expected_ms": expected,
            "timing_error": abs(measured - expected) / expected, "memory_history": history}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller model, fewer steps, smaller synthetic traces")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per comparison (at least 5)")
    parser.add_argument("--peers-python", default=os.environ.get("PERFHOOKS_PEERS_PYTHON"),
                        help="interpreter with HTA and torch-tb-profiler ($PERFHOOKS_PEERS_PYTHON, else this one)")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only these sections (repeatable)")
    parser.add_argument("--update", action="store_true", help="add the sections run to the existing results file")
    parser.add_argument("--output", type=Path, help="results file (default benchmarks/results/<host>-<date>.json)")
    args = parser.parse_args(argv)
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    sections = set(args.only or SECTIONS)
    info = machine_info()
    print(f"machine: {describe_machine()}")
    results: dict[str, Any] = {"machine": info, "date": datetime.date.today().isoformat(), "quick": args.quick,
                               "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}
    verdicts: dict[str, Any] = {}
    if "overhead" in sections:
        print("1. overhead on the training loop")
        results["overhead"] = overhead.run(args.quick, args.rounds)
        for framework in ("lightning", "accelerate", "transformers"):
            for name, r in results["overhead"][framework]["ratios"].items():
                print(f"  {framework:>12} {name:<40} median {r['median']:.4f} (min {r['min']:.4f}, max {r['max']:.4f})")
            check("telemetry_overhead", results["overhead"][framework]["ratios"]["perfhooks"]["median"], verdicts,
                  framework)
        check("window_vs_bare", results["overhead"]["lightning"]["ratios"]["perfhooks_window/bare_torch_profiler"]
              ["median"], verdicts, "lightning")
        check("window_vs_bare", results["overhead"]["accelerate"]["ratios"]["perfhooks_window/ProfileKwargs"]
              ["median"], verdicts, "accelerate (vs ProfileKwargs)")
        check("host_cost_us", results["overhead"]["host_cost_us"], verdicts)
    if "alternating" in sections:
        a = results["alternating"] = overhead.run_alternating(args.quick)
        print(f"  telemetry on/off, alternating steps in one process: median {a['median']:.4f} "
              f"(min {a['min']:.4f}, max {a['max']:.4f}) over {a['n']} pairs; pooled {a['pooled']:.4f}")
        check("telemetry_overhead", a["median"], verdicts, "alternating steps in one process")
    if "host_cost" in sections and "overhead" not in sections:  # the overhead section measures it too
        results["host_cost_us"] = overhead.host_cost_us(steps=5_000 if args.quick else 20_000)
        print(f"  engine host cost per step: {results['host_cost_us']:.2f} µs")
        check("host_cost_us", results["host_cost_us"], verdicts)
    if "annotation" in sections:
        print("2. annotation cost (ns per call, no NVTX tool attached, no profiler recording)")
        results["annotation_ns"] = annotation_cost.measure()
        for name, ns in results["annotation_ns"].items():
            published = annotation_cost.PUBLISHED.get(name)
            print(f"  {name:<26} {ns:8.0f} ns" + (f"   published: {published}" if published else ""))
    if "analysis" in sections:
        print("3. analysis speed and memory")
        results["analysis"] = analysis_section(args.quick, args.peers_python, verdicts)
    if "cuda" in sections:
        import torch

        if torch.cuda.is_available():
            print("4. CUDA")
            results["cuda"] = cuda_section(args.quick)
        else:
            print("4. CUDA: no GPU here; skipped")
    name = f"{info['hostname']}-{results['date']}{'-quick' if args.quick else ''}.json"
    target = args.output or HERE / "results" / name
    if args.update and target.exists():  # add these sections to an earlier run's results
        earlier = json.loads(target.read_text())
        verdicts = {**earlier.get("targets", {}), **verdicts}
        results = {**earlier, **{k: v for k, v in results.items() if k not in ("command", "date")},
                   "command": f"{earlier.get('command')}; {results['command']}"}
    results["targets"] = verdicts
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"results: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
