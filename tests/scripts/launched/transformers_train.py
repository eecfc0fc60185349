"""A transformers script driven by HfArgumentParser (imports nothing from perfhooks), like run_clm.py:

    python transformers_train.py --output_dir OUT --max_steps 8 --report_to none [--fail]
"""

from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ScriptArguments:
    fail: bool = field(default=False, metadata={"help": "raise inside the script after training"})


class RandomTokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    script_args, training_args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(), eval_dataset=RandomTokens())
    result = trainer.train()
    print(f"done {result.global_step} {sorted(result.metrics)}")
    if script_args.fail:
        raise ValueError("the script failed after training")


if __name__ == "__main__":
    main()
