"""``padding_waste`` when the framework moves each batch before perfhooks sees it: the mask is then on the device,
where summing it would sync. perfhooks reads it on the host, as the DataLoader hands the batch over
(perfhooks.runtime.hooks.host_batches), and pairs it with the moved batch in order.

On this CPU machine the move is made to the ``meta`` device, which like a GPU holds no value the host can read
without a transfer; each test runs with perfhooks on the CPU and on the simulated GPU (``cuda:0``: device-timed
steps, read on the timing thread). Every batch is 4 rows padded to 100 tokens, with 100, 60, 50 and 30 real ones:
40% padding."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from simulated_gpu import simulated_cuda

from perfhooks.runtime.engine import Engine
from perfhooks.runtime.step import timing_reader

SHARE = 0.40
LENGTHS = (100, 60, 50, 30)


@pytest.fixture(autouse=True, params=["cpu", "simulated_gpu"])
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """perfhooks on the CPU, or bound to ``cuda:0`` of the simulated GPU (the tensors stay where the test puts
    them)."""
    if request.param == "cpu":
        yield None
        return
    start = Engine.start.__func__  # type: ignore[attr-defined]

    def on_device(cls: type, config: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["device"] = "cuda:0"
        # no profiler window: CUPTI on a CPU build of torch raises inside every operator
        return start(cls, dataclasses.replace(config, schedule=None, on_demand=False), *args, **kwargs)

    monkeypatch.setattr(Engine, "start", classmethod(on_device))
    monkeypatch.setattr(timing_reader, "READ_EVERY_S", 0.01)
    with simulated_cuda(memory_bytes=1 << 30) as gpu:
        yield gpu


class Rows(torch.utils.data.Dataset):
    """Rows of token ids whose real lengths cycle through :data:`LENGTHS`; batches of 4 are each 40% padding."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = LENGTHS[index % 4]
        ids = torch.full((100,), 0, dtype=torch.long)
        ids[:length] = torch.randint(1, 256, (length,))
        mask = torch.zeros(100, dtype=torch.long)
        mask[:length] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.clone()}


class TinyLM(torch.nn.Module):
    """Token ids in, a loss out; the mask is taken and not used (it may be on another device)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 32)
        self.head = torch.nn.Linear(32, 256)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, attention_mask: Any = None,
                **kwargs: Any) -> dict[str, torch.Tensor]:
        logits = self.head(self.embed(input_ids))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), (labels if labels is not None
                                                                        else input_ids).flatten())
        return {"loss": loss, "logits": logits}


def _moved(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**batch, "attention_mask": batch["attention_mask"].to("meta")}


def _padding(report: dict[str, Any]) -> float:
    verdicts = {d["id"]: d for d in report["diagnoses"]}
    assert "padding_waste" in verdicts, report["throughput"].get("token_source")
    assert report["throughput"]["token_source"].startswith("attention_mask, read on the host")
    return verdicts["padding_waste"]["measured"]["padding_share"]


def test_lightning_padding_seen_after_transfer_batch_to_device_moved_the_mask(tmp_path: Path) -> None:
    import lightning as L

    from perfhooks.integrations.lightning import PerfCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = TinyLM()

        def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
            return _moved(super().transfer_batch_to_device(batch, device, dataloader_idx))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = self.model(batch["input_ids"], batch["labels"])["loss"]
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.model(batch["input_ids"], batch["labels"])["loss"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    # the defaults on (logger, checkpoints, progress bar), with validation every 10 steps
    trainer = L.Trainer(default_root_dir=tmp_path, max_steps=24, accelerator="cpu", devices=1, val_check_interval=10,
                        limit_val_batches=2, callbacks=[PerfCallback(output_dir=tmp_path / "perf", console=False)])
    trainer.fit(Module(), torch.utils.data.DataLoader(Rows(96), batch_size=4),
                torch.utils.data.DataLoader(Rows(8), batch_size=4))
    assert list((tmp_path / "lightning_logs").rglob("*.ckpt")), "the default checkpoint was written"
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert _padding(report) == pytest.approx(SHARE, abs=1e-9)  # every batch


def test_hf_trainer_padding_seen_when_its_batches_arrive_moved(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from perfhooks.integrations.transformers import PerfTrainerCallback

    class Moving(Trainer):
        """Its batches arrive with the mask off the host, as accelerate's loader hands them over on a GPU."""

        def get_batch_samples(self, *args: Any, **kwargs: Any) -> Any:
            batches, items = super().get_batch_samples(*args, **kwargs)
            return [_moved(batch) for batch in batches], items

        def _prepare_input(self, data: Any) -> Any:  # already "on the device"
            return data if isinstance(data, torch.Tensor) and data.is_meta else super()._prepare_input(data)

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            """Rows in order (``train_sampling_strategy="sequential"`` from transformers 5 on), so that each batch
            holds one row of each length: in the default random order each batch's share differs, and which steps
            count as steady depends on when perfhooks' own work overlapped them."""
            return torch.utils.data.SequentialSampler(self.train_dataset)

    # the defaults on (progress bar, checkpoints), with evaluation and logging every 10 steps
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=24, per_device_train_batch_size=4, use_cpu=True,
                             save_steps=10, eval_strategy="steps", eval_steps=10, logging_steps=10)
    Moving(model=TinyLM(), args=args, train_dataset=Rows(96), eval_dataset=Rows(8),
           callbacks=[PerfTrainerCallback(console=False)]).train()
    assert (tmp_path / "checkpoint-20").exists()
    report = json.loads((tmp_path / "_perfhooks" / "report.json").read_text())
    assert _padding(report) == pytest.approx(SHARE, abs=1e-9)  # every batch


def test_accelerate_padding_seen_after_the_loop_moves_the_batch(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from perfhooks.integrations.accelerate import attach

    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    model = TinyLM().to("meta")  # the device: the whole step runs there, as on a GPU
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = accelerator.prepare(torch.utils.data.DataLoader(Rows(96), batch_size=4))
    data.device = torch.device("meta")  # the prepared loader moves each batch there, as it does to a GPU
    with attach(accelerator, model, optimizer, data, output_dir=tmp_path / "perf", console=False):
        for batch in data:
            assert batch["attention_mask"].is_meta
            loss = model(**batch)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    report = json.loads((tmp_path / "perf" / "report.json").read_text())
    assert _padding(report) == pytest.approx(SHARE, abs=1e-9)  # every batch
