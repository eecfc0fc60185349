"""A TRL fine-tune written from a large model's recipe, scaled down: micro-batches of 1 with 8 accumulation steps,
activation checkpointing (SFTConfig's default), every sample padded to 128 tokens, an evaluation batch of 1, and
SFTConfig's bf16 default. A tiny Llama built from a config, a character-level tokenizer made here, Python-like
lines of text. ``RECIPE_FIXED=1`` writes the same job with each knob fixed (micro-batch 8 x 1, no checkpointing, no
fixed padding, an evaluation batch of 8, bf16 off).

    python trl_recipe.py OUTPUT_DIR [STEPS]
"""

from __future__ import annotations

import os
import string
import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer


def tokenizer() -> PreTrainedTokenizerFast:
    """Characters as tokens (no download)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for char in string.printable:
        vocab.setdefault(char, len(vocab))
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def lines(count: int) -> Dataset:
    """Short Python-like lines of 20 to 90 characters (seeded)."""
    generator = torch.Generator().manual_seed(0)
    words = ["def", "return", "self", "value", "items", "for", "in", "if", "else", "x", "y", "total", "+=", "=="]
    texts = []
    for _ in range(count):
        length = int(torch.randint(4, 16, (1,), generator=generator))
        picks = torch.randint(0, len(words), (length,), generator=generator).tolist()
        texts.append(" ".join(words[i] for i in picks))
    return Dataset.from_dict({"text": texts})


if __name__ == "__main__":
    torch.manual_seed(0)
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    fixed = os.environ.get("RECIPE_FIXED") == "1"
    tok = tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    recipe = dict(per_device_train_batch_size=1, gradient_accumulation_steps=8, per_device_eval_batch_size=1,
                  max_length=128, pad_to_multiple_of=128)
    if fixed:
        recipe = dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, per_device_eval_batch_size=8,
                      max_length=128, gradient_checkpointing=False, bf16=False)
    args = SFTConfig(output_dir=sys.argv[1], max_steps=steps, use_cpu=True, logging_steps=5, save_strategy="no",
                     eval_strategy="steps", eval_steps=steps, report_to=os.environ.get("REPORT_TO", "none"),
                     dataset_num_proc=None, **recipe)
    trainer = SFTTrainer(model=model, args=args, train_dataset=lines(400), eval_dataset=lines(48),
                         processing_class=tok)
    trainer.train()
