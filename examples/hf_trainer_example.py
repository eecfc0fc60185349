"""A Hugging Face Trainer run with PerfTrainerCallback: a tiny GPT-2 built from a config
(random weights, nothing downloaded) on synthetic tokens.

    python examples/hf_trainer_example.py [--steps 30] [--accumulate 1] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import perfhooks
from perfhooks.integrations.transformers import PerfTrainerCallback


class SyntheticTokens(Dataset):
    """Random token sequences; labels are the inputs (causal LM)."""

    def __init__(self, samples: int, seq_len: int = 64, vocab: int = 512, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (samples, seq_len), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def tiny_gpt2(vocab: int = 512, seq_len: int = 64) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=seq_len, n_embd=128, n_layer=2, n_head=4)
    return GPT2LMHeadModel(config)


def build_trainer(output_dir: str, steps: int, accumulate: int = 1, batch_size: int = 8,
                  callback: PerfTrainerCallback | None = None, eval_dataset: Dataset | None = None,
                  **args: object) -> Trainer:
    settings: dict = dict(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
                          gradient_accumulation_steps=accumulate, learning_rate=1e-3, logging_steps=10,
                          save_strategy="no", report_to="none", disable_tqdm=True,
                          use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0)
    settings.update(args)
    callback = callback or PerfTrainerCallback(schedule=perfhooks.Schedule(skip_first=8, warmup=2, active=3))
    return Trainer(model=tiny_gpt2(), args=TrainingArguments(**settings),
                   train_dataset=SyntheticTokens(steps * accumulate * batch_size), eval_dataset=eval_dataset,
                   callbacks=[callback])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
    parser.add_argument("--output-dir", default="perfhooks_out/hf")
    args = parser.parse_args(argv)
    build_trainer(args.output_dir, args.steps, args.accumulate).train()
    report = Path(args.output_dir) / "_perfhooks" / "report.json"
    print(f"report: {report} (coverage {json.loads(report.read_text())['coverage']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
