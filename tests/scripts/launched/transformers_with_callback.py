"""A transformers script that already adds PerfTrainerCallback itself:

    python transformers_with_callback.py OUT
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from perfhooks.integrations.transformers import PerfTrainerCallback


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2))
args = TrainingArguments(output_dir=sys.argv[1], max_steps=4, per_device_train_batch_size=4, report_to="none",
                         save_strategy="no", use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(),
                  callbacks=[PerfTrainerCallback(console=False, wandb=False)])
print(f"done {trainer.train().global_step}")
