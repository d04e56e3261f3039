"""Shared, seeded input generators and output poisoning for tests and conformance cases."""

from __future__ import annotations

import torch


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
          scale: float = 1.0) -> torch.Tensor:
    """Normal values (never all zeros), drawn on CPU for reproducibility, then moved."""
    x = torch.randn(*shape, generator=generator(seed), dtype=torch.float32) * scale
    return x.to(dtype=dtype, device=device)


def poison(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An output buffer full of NaN (or the dtype's max for ints), so unwritten elements show."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).max, dtype=dtype, device=device)
