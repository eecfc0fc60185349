"""Peak RSS that ``PerfCallback()`` adds to a 40-step fit of Lightning's demo Transformer (issue 41, item 12).

    python benchmarks/rss_overhead.py [--pairs 3] [--variant NAME ...]

Each fit runs in a fresh process (``VmHWM``, the peak RSS, read at its end); plain and perfhooks alternate, so
that drift in the machine touches both. The demo Transformer (vocab 33,278, Lightning's defaults) trains on random
tokens (35 per row, batch 20: WikiText2's shapes, no download), with Lightning's defaults on: the CSV logger,
checkpoints, the progress bar. Variants switch parts of perfhooks off, to show where the memory goes. Target: the
median ``perfhooks - plain`` at most 60 MB with the default settings (a capture window included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
import lightning.pytorch as pl
from lightning.pytorch.demos.transformer import LightningTransformer
from torch.utils.data import DataLoader, TensorDataset

class Model(LightningTransformer):
    def prepare_data(self):  # the demo downloads WikiText2 here: random tokens of its shapes instead
        pass

variant = sys.argv[1]
torch.manual_seed(0)
tokens = torch.randint(0, 33278, (40 * 20, 36))
data = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=20)
callbacks = []
if variant != "plain":
    from perfhooks.integrations.lightning import PerfCallback
    settings = {"wandb": False, "console": False}
    settings.update(json.loads(sys.argv[2]))
    callbacks.append(PerfCallback(**settings))
with tempfile.TemporaryDirectory() as root:
    trainer = pl.Trainer(max_steps=40, accelerator="cpu", devices=1, default_root_dir=root, callbacks=callbacks,
                         enable_model_summary=False, enable_progress_bar=True)
    trainer.fit(Model(), data)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print("PEAK", int(line.split()[1]) * 1024)
"""

VARIANTS = {
    "default": {},
    "no_window": {"schedule": None},
    "no_window_analysis": {"analyze_windows": False},
    "no_flop_count": {"count_flops": False},
    "no_record_shapes": {"record_shapes": False},
    "no_memory": {"memory": False},
}


def peak(variant: str, settings: dict) -> int:
    done = subprocess.run([sys.executable, "-c", CHILD, variant, json.dumps(settings)], capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PEAK")]
    if done.returncode or not lines:
        raise SystemExit(f"{variant}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return int(lines[-1].split()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    args = parser.parse_args()
    variants = args.variant or ["default"]
    added: dict[str, list[int]] = {name: [] for name in variants}
    plain: list[int] = []
    for _ in range(args.pairs):
        base = peak("plain", {})
        plain.append(base)
        for name in variants:
            added[name].append(peak(name, VARIANTS[name]) - base)
    print(f"plain peak RSS: median {statistics.median(plain) / 2**20:.0f} MiB over {len(plain)} fits")
    for name, values in added.items():
        print(f"{name:<22} adds median {statistics.median(values) / 2**20:6.1f} MiB "
              f"(each: {', '.join(f'{v / 2**20:.0f}' for v in values)}); target <= 60 MB for default")


if __name__ == "__main__":
    main()
