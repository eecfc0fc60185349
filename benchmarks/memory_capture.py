"""The pause a memory capture costs the training thread, against the whole capture.

    python benchmarks/memory_capture.py [--repeats 5]

A capture near the limit takes the live-tensor census (a walk of ``gc.get_objects()``) and, on CUDA
with a history, the allocator snapshot on the training thread; the census JSON, the snapshot pickle
and its HTML plot are written by the background writer. Here: the tutorial transformer layer with
AdamW state (CPU; on CUDA with ``--cuda`` and a history recording), median of ``--repeats`` captures:
training-thread ms, and the ms of the same capture written inline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import describe_machine


def capture_pause(repeats: int = 5, cuda: bool = False) -> dict[str, float]:
    """The median over ``repeats`` captures of the training thread's pause and of the same capture written inline
    (ms)."""
    from perfhooks.device.room import DeviceRoom
    from perfhooks.faults import FaultLog, Once
    from perfhooks.memory.monitor import MemoryMonitor
    from tutorial_transformer import TransformerLayer

    device = "cuda" if cuda else "cpu"
    model = TransformerLayer().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 128, 512, device=device)
    model(x).square().mean().backward()
    optimizer.step()
    pending: list = []
    with tempfile.TemporaryDirectory() as folder:
        def monitor(submit):
            m = MemoryMonitor(Path(folder), DeviceRoom(device), FaultLog(), Once(), threshold=0.9,
                              capacity_bytes=2**40, poll_s=0, history=True if cuda else None,
                              history_entries=100_000, max_captures=10 ** 6, submit=submit)
            m.models.append(model)
            m.sample()
            return m

        off_thread, inline = monitor(lambda kind, job: pending.append(job)), monitor(None)
        paused, whole = [], []
        for step in range(repeats):
            started = time.perf_counter()
            off_thread.capture(step, "forward", "near_limit")
            paused.append((time.perf_counter() - started) * 1e3)
            pending.pop()()
            started = time.perf_counter()
            inline.capture(step, "forward", "inline")
            whole.append((time.perf_counter() - started) * 1e3)
        off_thread.stop()
    p, w = statistics.median(paused), statistics.median(whole)
    print(f"  capture pause on the training thread: {p:.1f} ms (median of {repeats}); the whole capture inline: "
          f"{w:.1f} ms; ratio {p / w:.2f}")
    return {"pause_ms": p, "inline_ms": w, "device": device}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cuda", action="store_true", help="on the GPU, with an allocation history recording")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    print(f"machine: {describe_machine()}")
    capture_pause(args.repeats, args.cuda)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
