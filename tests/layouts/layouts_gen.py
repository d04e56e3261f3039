"""Shared input generators and byte readers for the layouts tests (imported by module name)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

SEED = 20240601


def generator(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def storage_bytes(t: torch.Tensor) -> list[int]:
    """Every byte of the storage behind `t` (pads included), in address order."""
    assert t.storage_offset() == 0
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).tolist()


def random_scales(shape: tuple[int, ...], seed: int = SEED) -> torch.Tensor:
    """Arbitrary positive fp32 scales (not powers of two), never zero."""
    g = generator(seed)
    return torch.rand(shape, generator=g) * 3.0 + 1e-3


def random_pow2_scales(shape: tuple[int, ...], seed: int = SEED) -> torch.Tensor:
    """Positive power-of-two fp32 scales spanning the whole normal range (exponent bytes 1..254)."""
    g = generator(seed)
    e = torch.randint(1, 255, shape, generator=g, dtype=torch.int32)
    return (e << 23).view(torch.float32)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a.contiguous()), bits(b.contiguous()))


groups = st.one_of(st.none(), st.integers(1, 3))
mn_sizes = st.integers(1, 70)
k_blocks = st.integers(1, 11)
seeds = st.integers(0, 2**31 - 1)
