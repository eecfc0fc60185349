"""The test suite on a busy machine: the whole suite while other processes keep every core busy.

    .venv/bin/python .ci/busy_suite.py [--busy 2] [--runs 1] [-- PYTEST ARGS...]

Starts ``--busy`` processes that spin (``while True: pass``), runs ``pytest`` ``--runs`` times in a row, stops
the spinners (also on Ctrl-C), and prints one line per run: passed/failed/skipped counts and the wall time.
``--busy 0 --runs 3`` is the idle check; ``--log FILE`` keeps each run's whole output. Exit status: 0 when every
run passed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([0-9.]+)s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes (default 2: both cores here)")
    parser.add_argument("--runs", type=int, default=1, help="suite runs in a row (default 1)")
    parser.add_argument("--log", help="write each run's whole pytest output here (RUN is replaced by the run number)")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --")
    args = parser.parse_args(argv)
    if args.busy < 0 or args.runs < 1:
        parser.error("--busy must be >= 0 and --runs >= 1")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                  cwd=REPO, capture_output=True, text=True)
            wall_s = time.monotonic() - start
            if args.log:
                Path(args.log.replace("RUN", str(run))).write_text(done.stdout + done.stderr)
            lines = [line for line in done.stdout.splitlines() if SUMMARY.match(line)]
            summary = SUMMARY.match(lines[-1]).group(1) if lines else "no summary"
            print(f"run {run}: busy={args.busy} exit={done.returncode} {summary} wall={wall_s:.0f}s", flush=True)
            if done.returncode != 0:
                failed += 1
                print("\n".join(line for line in done.stdout.splitlines() if line.startswith("FAILED")), flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
