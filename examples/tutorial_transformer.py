"""The transformer layer of the PyTorch profiler tutorial, as a LightningModule.

Multi-head self-attention, a 4x MLP and two residual LayerNorms; d_model 512, 8 heads,
batch 16, sequence 128, trained on synthetic data (nothing is downloaded). Shared by the
Lightning, transformers-free and accelerate examples and by the benchmarks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class TransformerLayer(nn.Module):
    """The tutorial's layer (baseline: ``nn.MultiheadAttention``, which runs the unfused math path)."""

    def __init__(self, d_model: int = 512, heads: int = 8) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(d_model, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.norm2 = nn.LayerNorm(d_model)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x)  # need_weights=True (the default): explicit bmm + softmax
        return attended

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attend(x))
        return self.norm2(x + self.mlp(x))


class OptimizedTransformerLayer(TransformerLayer):
    """The same layer with attention through ``scaled_dot_product_attention`` (flash or memory-efficient
    kernels under bf16 on CUDA); train it under bf16 autocast and with a larger batch."""

    def __init__(self, d_model: int = 512, heads: int = 8) -> None:
        super().__init__(d_model, heads)
        self.heads = heads

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        projection = self.attention
        q, k, v = nn.functional.linear(x, projection.in_proj_weight, projection.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        return projection.out_proj(attended.transpose(1, 2).reshape(batch, length, width))


class SyntheticSequences(Dataset):
    """Random input sequences and regression targets, generated per item from a fixed seed."""

    def __init__(self, samples: int, seq_len: int = 128, d_model: int = 512, seed: int = 0) -> None:
        self.samples, self.seq_len, self.d_model, self.seed = samples, seq_len, d_model, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed + index)
        x = torch.randn(self.seq_len, self.d_model, generator=generator)
        return x, torch.tanh(x)


def make_dataloader(steps: int, batch_size: int = 16, seq_len: int = 128, d_model: int = 512,
                    num_workers: int = 0) -> DataLoader:
    dataset = SyntheticSequences(steps * batch_size, seq_len, d_model)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, shuffle=False)


def lightning_module(d_model: int = 512, heads: int = 8, lr: float = 1e-4, optimized: bool = False):
    """The layer (``optimized``: :class:`OptimizedTransformerLayer`) wrapped in a LightningModule (imported
    lazily: Lightning is an extra)."""
    import lightning as L

    layer_class = OptimizedTransformerLayer if optimized else TransformerLayer

    class TutorialTransformer(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer_class(d_model, heads)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=lr)

    return TutorialTransformer()
