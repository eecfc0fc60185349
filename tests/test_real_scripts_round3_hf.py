"""Issue 41, items 3 and 13-15 on real HF Trainer runs (apart from tests/test_real_scripts_round3.py, so that the two
files run on both test workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_real_scripts_round3 import hf_trainer

from helpers import read_report


# ----------------------------------------------------------------------------- items 13-15: transformers
def test_a_step_completed_before_an_earlier_callbacks_error_is_counted(tmp_path: Path) -> None:
    from transformers import TrainerCallback

    from perfhooks.integrations.transformers import PerfTrainerCallback

    class FailsAtStep5(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 5:
                raise RuntimeError("the user's callback failed at step 5")

    trainer = hf_trainer(tmp_path, 8, None)
    trainer.add_callback(FailsAtStep5())  # before perfhooks' in the list: HF runs them in order
    trainer.add_callback(PerfTrainerCallback(console=False, schedule=None))
    with pytest.raises(RuntimeError, match="at step 5"):
        trainer.train()
    report = read_report(tmp_path / "_perfhooks")
    assert trainer.state.global_step == 5
    assert (report["status"], report["steps"], report["global_step"]) == ("failed", 5, 5)  # before: 4 steps


def test_after_train_the_trainer_is_freed_at_once_and_a_copy_trains_itself(tmp_path: Path) -> None:
    import copy
    import gc
    import weakref

    from perfhooks.integrations.transformers import PerfTrainerCallback

    trainer = hf_trainer(tmp_path, 2, PerfTrainerCallback(console=False, schedule=None), disable_tqdm=True)
    trainer.train()
    assert "train" not in vars(trainer)  # no per-instance attribute outlives the run (nor is there one during it)
    twin = copy.copy(trainer)
    assert twin.train.__self__ is twin  # before: the copied wrapper trained the original
    del twin
    model = weakref.ref(trainer.model)
    gc.collect()
    gc.disable()
    try:
        del trainer
        assert model() is None  # freed without a GC pass, as without perfhooks
    finally:
        gc.enable()


def test_a_callback_added_later_leaves_nothing_behind_after_a_caught_error(tmp_path: Path) -> None:
    import tempfile
    import threading

    from perfhooks import Schedule
    from perfhooks.integrations.transformers import PerfTrainerCallback

    before = {t.name for t in threading.enumerate() if t.name.startswith("perfhooks")}
    for attempt in range(3):
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:  # its cleanup must not raise
            trainer = hf_trainer(Path(folder), 6, None, disable_tqdm=True)
            window = Schedule(skip_first=0, warmup=0, active=2)
            trainer.add_callback(PerfTrainerCallback(console=False, schedule=window))

            def fail_fifth(module: Any, args: Any, calls: dict[str, int] = {"n": 0}) -> None:  # noqa: B006
                calls["n"] += 1
                if calls["n"] == 5:
                    raise ValueError("user error")

            hook = trainer.model.register_forward_pre_hook(fail_fifth)
            with pytest.raises(ValueError, match="user error"):
                trainer.train()
            assert not {"get_batch_samples", "training_step", "compute_loss", "evaluate",
                        "_save_checkpoint"} & set(vars(trainer))
            assert list(trainer.model._forward_pre_hooks) == [hook.id] and not trainer.model._forward_hooks
            assert read_report(Path(folder) / "_perfhooks")["status"] == "failed"
        assert not Path(folder).exists(), f"attempt {attempt}: the folder was made again"
    assert {t.name for t in threading.enumerate() if t.name.startswith("perfhooks")} <= before


# ----------------------------------------------------------------------------- item 3: padding
class PaddedTokens:
    """Samples of 10 to 60 real tokens, each padded to 64 (as a tokenizer with padding="max_length" does): about
    half of every batch is padding; the labels of the padding are -100."""

    def __init__(self, samples: int, seed: int = 0) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(10, 61, (samples,), generator=generator).tolist()
        self.tokens = torch.randint(0, 512, (samples, 64), generator=generator)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        mask = (torch.arange(64) < self.lengths[index]).long()
        ids = torch.where(mask.bool(), self.tokens[index], torch.zeros_like(self.tokens[index]))
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, -100)}


def test_padding_waste_fires_on_a_trainer_whose_batches_are_half_padding(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from hf_trainer_example import tiny_gpt2
    from perfhooks.integrations.transformers import PerfTrainerCallback

    data = PaddedTokens(20 * 4)
    expected = 1 - sum(data.lengths) / (64 * len(data))
    assert 0.40 < expected < 0.50  # by hand: about 45% padding
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=20, per_device_train_batch_size=4, use_cpu=True,
                             save_strategy="no", logging_steps=5)
    Trainer(model=tiny_gpt2(), args=args, train_dataset=data,
            callbacks=[PerfTrainerCallback(console=False, schedule=None)]).train()
    report = read_report(tmp_path / "_perfhooks")
    [verdict] = [d for d in report["diagnoses"] if d["id"] == "padding_waste"]
    # the Dataset pads every sample to 64: grouping by length alone would change nothing, so the fix pads per batch
    # first, then groups, as the installed transformers spells it (5.x: train_sampling_strategy)
    assert verdict["measured"]["fixed_width"] and "every batch arrives 64 tokens wide" in verdict["evidence"]
    assert "DataCollatorWithPadding" in verdict["recommendation"]
    from perfhooks.rules.live import group_by_length
    assert group_by_length(__import__("transformers").__version__) in verdict["recommendation"]
    assert 0.35 < verdict["measured"]["padding_share"] < 0.55  # the steady steps' share (the first 3 are out)
    share = verdict["measured"]["padding_share"]  # a ceiling: attention's share of it grows with the square
    assert 0 < verdict["estimated_gain"] <= 1 - (1 - share) ** 2
