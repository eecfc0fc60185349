"""Tiny real models and runs for the tests (no mocks: real Trainer, real torch.profiler)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfhooks.device.clock import HostClock


class ManualClock(HostClock):
    """A clock the test moves by hand, for exact timing asserts."""

    def __init__(self) -> None:
        self.now_ns = 0
        self.mark = lambda: self.now_ns

    def advance(self, ms: float) -> None:
        self.now_ns += int(ms * 1e6)


def framework_step(engine: Any, clock: ManualClock, global_step: int | None = None, callbacks_ms: float = 0.0,
                   checkpoint_ms: float = 0.0, optimizer_ms: float = 1.0) -> None:
    """What an integration reports for one batch: fetch 0.5, forward 3, backward 4, optimizer ``optimizer_ms``
    (ms), then the framework's own work after the optimizer (callbacks, logging) and maybe a checkpoint write."""
    engine.fetch()
    clock.advance(0.5)
    engine.phase_start("forward")
    clock.advance(3)
    engine.phase_start("backward")
    clock.advance(4)
    engine.phase_start("optimizer")
    clock.advance(optimizer_ms)
    engine.phase_end("optimizer")
    engine.stepped(global_step)
    clock.advance(callbacks_ms)
    if checkpoint_ms:
        with engine.aside("checkpoint"):
            clock.advance(checkpoint_ms)


def random_loader(batches: int, batch_size: int = 8, features: int = 32, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * batch_size, features, generator=generator)
    y = torch.randn(batches * batch_size, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def mlp(features: int = 32, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def lightning_mlp(manual: bool = False, fail_at_step: int | None = None, features: int = 32):
    """A small regression LightningModule; ``manual`` uses manual optimization."""
    import lightning as L

    class TinyModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(features)
            self.automatic_optimization = not manual

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
            if fail_at_step is not None and self.global_step == fail_at_step:
                raise RuntimeError(f"user error at step {fail_at_step}")
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            if not manual:
                return loss
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            return None

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return TinyModule()


def default_trainer(root: Path, **overrides: Any):
    """A CPU Trainer with Lightning's defaults kept on: its logger, checkpointing, progress bar and summary."""
    import lightning as L

    return L.Trainer(**{"accelerator": "cpu", "devices": 1, "default_root_dir": str(root), **overrides})


def sized_loader(batches: int, batch_size: int = 128, features: int = 256, seed: int = 0) -> DataLoader:
    """Batches for :func:`sized_mlp`: steps of about 10 ms on a CPU, so phase shares mean something."""
    return random_loader(batches, batch_size=batch_size, features=features, seed=seed)


def sized_mlp(features: int = 256, hidden: int = 1024) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


def trace_spans(trace: dict[str, Any], prefix: str) -> list[tuple[float, float]]:
    """``(start, end)`` µs of the user annotations whose name starts with ``prefix``."""
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                  if e.get("cat") == "user_annotation" and e["name"].startswith(prefix))


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def quiet_trainer(**overrides: Any):
    """A CPU Trainer with no logger, checkpoint, progress bar or summary."""
    import lightning as L

    settings: dict[str, Any] = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False)
    settings.update(overrides)
    return L.Trainer(**settings)


def read_report(output_dir: Path) -> dict[str, Any]:
    return json.loads((output_dir / "report.json").read_text())


def train_steps(engine: Any, loss_of: Any, optimizer: torch.optim.Optimizer, batches: Any) -> None:
    """One optimizer step per batch, announced to the engine as an integration would: ``loss_of(batch)``
    is the forward pass (and the loss), then backward and the optimizer."""
    for batch in batches:
        engine.phase_start("data_wait")
        engine.phase_start("forward")
        loss = loss_of(batch)
        engine.phase_start("backward")
        loss.backward()
        engine.phase_start("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        engine.step_end()


def plain_loop(engine: Any, steps: int, accumulate: int = 1, before_step: Any = None, in_forward: Any = None,
               micro_batch_sizes: tuple[int, ...] | None = None) -> None:
    """A hand-written training loop feeding the engine its events (what an integration does);
    ``before_step(step)`` runs before the step opens, ``in_forward(step)`` inside its forward. With
    ``micro_batch_sizes`` each step takes micro-batches of those sizes, and the engine sees each batch."""
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = iter(random_loader(steps * accumulate))
    sizes = micro_batch_sizes or (None,) * accumulate
    for step in range(steps):
        if before_step is not None:
            before_step(step)
        for size in sizes:
            engine.phase_start("data_wait")
            x, y = next(batches) if size is None else (torch.randn(size, 32), torch.randn(size, 1))
            engine.phase_start("forward")
            if size is not None:
                engine.batch((x, y))
            if in_forward is not None:
                in_forward(step)
            loss = nn.functional.mse_loss(model(x), y)
            engine.phase_start("backward")
            loss.backward()
            engine.phase_end("backward")
        engine.phase_start("optimizer")
        optimizer.step()
        optimizer.zero_grad()
        engine.phase_end("optimizer")
        engine.step_end()


def load_trace(path: Path) -> dict[str, Any]:
    import gzip

    with gzip.open(path, "rt") as handle:
        return json.load(handle)


def annotation_names(trace: dict[str, Any]) -> list[str]:
    return [event["name"] for event in trace["traceEvents"] if event.get("cat") == "user_annotation"]


def longest_step_after_the_first_ms(report: dict) -> float:
    """The longest step but the run's first (ms), from the report's per-step series: the first step pays one-time
    costs (first calls, thread pools, allocator growth), which a loaded machine can stretch past any evaluation."""
    series = report["series"]
    names = ("data_wait", "forward", "backward", "optimizer", "other")
    totals = [sum(values) for values in zip(*(series[name] for name in names), strict=True)]
    return max(totals[1:])


def plain_ctrl_c() -> None:
    """``preexec_fn`` for a child a test sends Ctrl-C (SIGINT): the signal's default action, unblocked, as a terminal
    gives a program. An ignored or blocked SIGINT survives ``exec``: in one busy suite run two such tests on one
    worker saw their child ignore it, whatever an earlier test in that worker had left."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ctrl_c_state() -> str:
    """This process's SIGINT disposition and whether it is blocked (for a failing Ctrl-C test's message)."""
    import signal

    return (f"SIGINT here: {signal.getsignal(signal.SIGINT)!r}, "
            f"blocked: {signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}")

