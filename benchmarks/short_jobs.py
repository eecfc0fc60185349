"""What perfhooks' defaults cost two short CPU jobs, where the user pays: the training loop's wall clock and the
process's peak RSS, plain against profiled, each run a fresh process, in pairs whose order alternates; and what
each profiled run's report said it cost.

    python benchmarks/short_jobs.py [--pairs 3] [--job accelerate] [--job plain] [--out FILE.json]
    python benchmarks/short_jobs.py --job plain --perfhooks-from OLD_CHECKOUT      # an older perfhooks
    python benchmarks/short_jobs.py --job accelerate --torch-window              # and torch.profiler alone

- ``accelerate`` (``jobs/accelerate_gpt.py``): a small GPT under an ``Accelerator``, 8 micro-batches a step,
  anomaly detection on, 20 steps; profiled by ``perfhooks run`` with its defaults.
- ``plain`` (``jobs/plain_gpt.py``): a nanoGPT-style GPT, 40 steps; profiled by ``perfhooks.profile`` with its
  defaults.

``--torch-window`` adds a third run to each accelerate pair: the plain script with ``torch.profiler`` by hand over
the steps of perfhooks' default window (``jobs/accelerate_gpt.py --torch-window``), no perfhooks: what the window
alone costs, the floor of the defaults' cost on a job this short.

Targets (issue 75): the accelerate job's loop at most 5% slower and its peak RSS at most 150 MB more; the report's
cost at least half of what the job lost; the plain job's report within a factor of 2 of what it lost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from common import describe_machine  # noqa: E402

JOBS = REPO / "benchmarks" / "jobs"


#: The step perfhooks' default schedule records in the accelerate job (its report's window: warm-up at step 9).
DEFAULT_WINDOW_STEP = 10


def command(job: str, profiled: bool, out: Path, torch_window: bool = False) -> list[str]:
    if job == "accelerate":
        script = [str(JOBS / "accelerate_gpt.py")]
        if torch_window:
            return [sys.executable, *script, "--torch-window", str(DEFAULT_WINDOW_STEP)]
        if profiled:
            return [sys.executable, "-m", "perfhooks", "run", "--output-dir", str(out), *script]
        return [sys.executable, *script]
    return [sys.executable, str(JOBS / "plain_gpt.py"), *(["--perfhooks", str(out)] if profiled else [])]


def run_once(job: str, profiled: bool, perfhooks_from: Path = REPO, torch_window: bool = False) -> dict[str, Any]:
    """One fresh process: its JSON line, and with perfhooks its report's ``overhead``. ``perfhooks_from``: the
    checkout whose ``perfhooks`` the job imports (an older one, to compare; the plain job only); ``torch_window``:
    the plain accelerate job with torch's profiler by hand over the default window's steps."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "perf"
        env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(perfhooks_from)}
        done = subprocess.run(command(job, profiled, out, torch_window), capture_output=True, text=True, env=env,
                              cwd=folder, timeout=900, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise RuntimeError(f"{job} ({'profiled' if profiled else 'plain'}) failed: {done.stderr[-2000:]}")
        result = json.loads(lines[-1])
        if profiled:
            report = json.loads((out / "report.json").read_text())
            result["overhead"] = report.get("overhead")
            result["steps"] = report.get("steps")
            result["console"] = [line for line in done.stdout.splitlines() + done.stderr.splitlines()
                                 if "perfhooks cost" in line or "own time" in line]
        return result


def said_cost_s(result: dict[str, Any]) -> float:
    """What the report says perfhooks cost the loop (s): its measured share (or its in-place one, a lower bound),
    the captures' share, and the windows' time beyond steady steps."""
    overhead = result["overhead"] or {}
    measured = (overhead.get("measured") or {}).get("share", overhead.get("share_of_run", 0.0))
    windows = (overhead.get("windows") or {}).get("added_s", 0.0)
    return (measured + (overhead.get("captures_share") or 0.0)) * result["loop_s"] + windows


def run(job: str, pairs: int, perfhooks_from: Path = REPO, torch_window: bool = False) -> dict[str, Any]:
    plain, profiled, by_hand = [], [], []
    for pair in range(pairs):
        for kind in ((False, True) if pair % 2 == 0 else (True, False)):
            (profiled if kind else plain).append(run_once(job, kind, perfhooks_from))
        if torch_window and job == "accelerate":
            by_hand.append(run_once(job, False, perfhooks_from, torch_window=True))
    lost = [p["loop_s"] - b["loop_s"] for p, b in zip(profiled, plain, strict=True)]
    ratio = [p["loop_s"] / b["loop_s"] for p, b in zip(profiled, plain, strict=True)]
    rss = [(p["peak_rss"] - b["peak_rss"]) / 2**20 for p, b in zip(profiled, plain, strict=True)]
    said = [said_cost_s(p) for p in profiled]
    out = {"job": job, "pairs": pairs, "plain_loop_s": [round(b["loop_s"], 3) for b in plain],
           "profiled_loop_s": [round(p["loop_s"], 3) for p in profiled], "ratio": [round(r, 4) for r in ratio],
           "lost_s": [round(x, 3) for x in lost], "said_s": [round(x, 3) for x in said],
           "peak_rss_added_mib": [round(x, 1) for x in rss],
           "plain_step_s_median": round(statistics.median(s for b in plain for s in b["steps_s"]), 4),
           "profiled_steps_s": [[round(s, 3) for s in p["steps_s"]] for p in profiled],
           "overhead": [p["overhead"] for p in profiled], "console": profiled[-1].get("console")}
    if by_hand:
        out["torch_window"] = window_floor(plain, by_hand)
    print(f"{job}: plain loop {statistics.median(out['plain_loop_s']):.2f} s (step "
          f"{out['plain_step_s_median'] * 1e3:.0f} ms); profiled x{statistics.median(ratio):.3f} "
          f"(pairs {min(ratio):.3f} to {max(ratio):.3f}); lost {statistics.median(lost):.2f} s, the report said "
          f"{statistics.median(said):.2f} s; peak RSS +{statistics.median(rss):.0f} MiB (pairs {min(rss):.0f} to "
          f"{max(rss):.0f})", flush=True)
    if by_hand:
        floor = out["torch_window"]
        print(f"{job}: torch.profiler alone over the default window's steps x{floor['ratio_median']:.3f} (pairs "
              f"{min(floor['ratio']):.3f} to {max(floor['ratio']):.3f}); peak RSS +{floor['rss_median']:.0f} MiB",
              flush=True)
    return out


def window_floor(plain: list[dict[str, Any]], by_hand: list[dict[str, Any]]) -> dict[str, Any]:
    """The by-hand window's runs against the plain run of the same pair: loop ratio and peak RSS added (MiB)."""
    ratio = [w["loop_s"] / b["loop_s"] for w, b in zip(by_hand, plain, strict=True)]
    rss = [(w["peak_rss"] - b["peak_rss"]) / 2**20 for w, b in zip(by_hand, plain, strict=True)]
    return {"loop_s": [round(w["loop_s"], 3) for w in by_hand], "ratio": [round(r, 4) for r in ratio],
            "ratio_median": round(statistics.median(ratio), 4), "peak_rss_added_mib": [round(x, 1) for x in rss],
            "rss_median": round(statistics.median(rss), 1),
            "steps_s": [[round(s, 3) for s in w["steps_s"]] for w in by_hand]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--job", action="append", choices=("accelerate", "plain"))
    parser.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    parser.add_argument("--perfhooks-from", type=Path, default=REPO,
                        help="a checkout whose perfhooks the jobs import (git worktree add DIR REV), to compare")
    parser.add_argument("--torch-window", action="store_true",
                        help="accelerate: a third run a pair, torch.profiler alone over the default window's steps")
    args = parser.parse_args(argv)
    print(describe_machine(), flush=True)
    jobs = args.job or ("accelerate", "plain")
    results = [run(job, args.pairs, args.perfhooks_from, args.torch_window) for job in jobs]
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": describe_machine(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
