"""A short accelerate job on the CPU, as a new user writes one: a small GPT, 8 micro-batches a step (gradient
accumulation), autograd's anomaly detection left on, 20 steps. Run plain (``python``) or under ``perfhooks run``
by ``benchmarks/short_jobs.py``; prints one JSON line: the training loop's wall time (s), each step's (s) and the
process's peak RSS (bytes).

    python benchmarks/jobs/accelerate_gpt.py [--steps 20] [--accumulate 8] [--torch-window STEP]

``--torch-window STEP``: no perfhooks, but ``torch.profiler`` by hand over the steps that perfhooks' default window
takes: started (warm-up) at step STEP - 1, recording step STEP with ``record_shapes``, stopped at the next step's
start, its trace exported on a thread of its own. What one window costs with nothing of perfhooks around it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from nanogpt_example import GPT, RandomText


def peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM``), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class TorchWindow:
    """torch.profiler over one step, as perfhooks' default window takes it, with nothing of perfhooks."""

    def __init__(self, step: int, accumulate: int) -> None:
        self.step, self.accumulate = step, accumulate
        self.profiler: torch.profiler.profile | None = None
        self.export: threading.Thread | None = None
        self.folder = tempfile.TemporaryDirectory()

    def at_micro_batch(self, index: int) -> None:
        if index % self.accumulate:
            return
        step = index // self.accumulate
        if step == self.step - 1:
            self.profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1))
            self.profiler.start()
        elif step == self.step and self.profiler is not None:
            self.profiler.step()
        elif step == self.step + 1 and self.profiler is not None:
            profiler, self.profiler = self.profiler, None
            profiler.stop()
            path = str(Path(self.folder.name) / "window.json")
            self.export = threading.Thread(target=profiler.export_chrome_trace, args=(path,))
            self.export.start()

    def join(self) -> None:
        if self.export is not None:
            self.export.join()
        self.folder.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accumulate", type=int, default=8)
    parser.add_argument("--torch-window", type=int, default=None, metavar="STEP")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.autograd.set_detect_anomaly(True)  # left on from debugging, as in the job this stands for
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=True)
    model = GPT(vocab_size=2048, block_size=128, n_layer=4, n_head=4, n_embd=256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = DataLoader(RandomText(args.steps * args.accumulate * 4, 128, 2048), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    window = TorchWindow(args.torch_window, args.accumulate) if args.torch_window is not None else None
    ends = [time.perf_counter()]
    for index, (idx, targets) in enumerate(loader):
        if window is not None:
            window.at_micro_batch(index)
        with accelerator.accumulate(model):
            loss = model(idx, targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if (index + 1) % args.accumulate == 0:
            ends.append(time.perf_counter())
    if window is not None:
        window.join()
    steps = [b - a for a, b in itertools.pairwise(ends)]
    print(json.dumps({"loop_s": ends[-1] - ends[0], "steps_s": steps, "peak_rss": peak_rss_bytes()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
