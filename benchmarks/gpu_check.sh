#!/usr/bin/env bash
# The checks to run whenever a GPU is lent (issue 49), as one call: at most 8 minutes on one GPU, no network.
#
#   bash benchmarks/gpu_check.sh [OUT]        # OUT defaults to gpu_check_out; PYTHON picks the interpreter
#
# 1. the CUDA tests (pytest -m cuda), 2. `perfhooks doctor --format json`, 3. benchmarks/gpu_check.py --isolate (55% of
# the time left: on the H200 one round in fresh processes read +24 µs a launch-bound step where 18 rounds in one
# process read +252, so the fresh-process rounds get the most): bare, perfhooks without windows, the floor (no
# perfhooks: the least any design does at the six boundaries; the launch-bound loop) and perfhooks' defaults,
# each run in a fresh process, for a launch-bound loop and a host-bound Lightning GPT, 4. benchmarks/gpu_check.py:
# first perfhooks' own time a step in place (the launch-bound loop beside the floor's, then the GPT), then the same
# two loops bare, under perfhooks without windows and with each of its parts switched off in turn from there, and
# on the launch-bound loop three ways of reading the timings and the floor, alternating in one process, with each
# thread's CPU and the garbage collector's time; then where the loop's training thread spends its time
# (cProfile), and the device API calls a step. Everything lands in OUT/ and is packed into OUT.tar.gz. Without a
# GPU it is a dry run: the CUDA tests are skipped (said in OUT/pytest.txt), doctor reports the CPU, and the
# benchmarks run tiny on the CPU to show the script works. Keep a real run's figures in benchmarks/results/ with
# the card's name.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu_check_out}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
mkdir -p "$OUT"
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>/dev/null)
echo "card: ${GPU:-none (dry run)}" | tee "$OUT/card.txt"
if [ -n "$GPU" ]; then
    timeout 200 "$PY" -m pytest -m cuda -q -p no:randomly -n 0 tests/test_cuda.py tests/test_cuda_examples.py \
        tests/device/test_reader_timer.py \
        tests/test_memory.py > "$OUT/pytest.txt" 2>&1
    echo "cuda tests: exit $? ($(tail -1 "$OUT/pytest.txt"))"
else
    echo "skipped: no CUDA device on this machine (the CUDA tests need one)" > "$OUT/pytest.txt"
    echo "cuda tests: skipped, no GPU"
fi
timeout 60 "$PY" -m perfhooks doctor --format json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
echo "doctor: exit $?"
if [ -n "$GPU" ]; then DRY=(); else DRY=(--dry-run); fi
LEFT=$(( 450 - SECONDS ))  # the 8 minutes less what the tests and doctor took, and 30 s to pack
ISOLATE=$(( LEFT * 55 / 100 ))
[ "$ISOLATE" -lt 60 ] && ISOLATE=60
timeout $(( ISOLATE + 40 )) "$PY" benchmarks/gpu_check.py --isolate --out "$OUT" --budget-s "$ISOLATE" "${DRY[@]}" 2>&1 \
    | grep -v Warning | tail -12
BUDGET=$(( 450 - SECONDS ))
[ "$BUDGET" -lt 90 ] && BUDGET=90
timeout $(( BUDGET + 20 )) "$PY" benchmarks/gpu_check.py --out "$OUT" --budget-s "$BUDGET" "${DRY[@]}" 2>&1 \
    | grep -v Warning | tail -24
tar czf "$OUT.tar.gz" "$OUT"
echo "packed: $OUT.tar.gz"
