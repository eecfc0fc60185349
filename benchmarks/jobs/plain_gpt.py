"""A short plain loop on the CPU: a nanoGPT-style GPT, 40 steps of about 60 ms, ``perfhooks.profile`` with its
defaults when ``--perfhooks`` is given. Run by ``benchmarks/short_jobs.py``; prints one JSON line: the training
loop's wall time (s), each step's (s) and the process's peak RSS (bytes).

    python benchmarks/jobs/plain_gpt.py [--steps 40] [--perfhooks OUTPUT_DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from accelerate_gpt import peak_rss_bytes

from nanogpt_example import GPT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--perfhooks", metavar="OUTPUT_DIR", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = GPT(vocab_size=1024, block_size=128, n_layer=4, n_head=4, n_embd=192)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, 1024, (args.steps, 8, 129))
    perf = None
    if args.perfhooks:
        import perfhooks

        perf = perfhooks.profile(model, optimizer, output_dir=args.perfhooks)
    fetch = perf.data_wait if perf is not None else None
    ends = [time.perf_counter()]
    for step in range(args.steps):
        if fetch is not None:
            with fetch():
                batch = data[step]
        else:
            batch = data[step]
        loss = model(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    loop_s = ends[-1] - ends[0]
    if perf is not None:
        perf.close()
    steps = [b - a for a, b in itertools.pairwise(ends)]
    print(json.dumps({"loop_s": loop_s, "steps_s": steps, "peak_rss": peak_rss_bytes(),
                      "close_s": time.perf_counter() - ends[-1]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
