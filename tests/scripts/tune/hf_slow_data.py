"""An unmodified HF Trainer script, transformers' defaults on (logging, tqdm, a save each epoch and at the end;
``report_to`` from ``REPORT_TO``),
on a tiny GPT-2 built from a config, whose dataset takes 4 ms a sample with batch 8 and no loader workers.
``USE_CPU=0`` leaves ``use_cpu`` out, as a user's script on a machine without a GPU may.

    python hf_slow_data.py OUTPUT_DIR
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class SlowTokens(torch.utils.data.Dataset):
    def __init__(self, samples: int = 1024, seq_len: int = 32, vocab: int = 256) -> None:
        self.tokens = torch.randint(0, vocab, (samples, seq_len), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(0.004)
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


if __name__ == "__main__":
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, num_train_epochs=1,
                             use_cpu=os.environ.get("USE_CPU", "1") == "1", logging_steps=10, save_strategy="epoch",
                             report_to=os.environ.get("REPORT_TO", "none"))
    trainer = Trainer(model=model, args=args, train_dataset=SlowTokens())
    trainer.train()
    trainer.save_model(sys.argv[1] + "/final")
