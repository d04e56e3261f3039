"""Scale storage the quantizer kernels write directly: plain fp32, sm90, or sm100 words.

- "plain": fp32 [(G,) ceil(MN/gm), kb] row-major (the logical form);
- "sm90": per-row scales fp32 MN-major, TMA-aligned (layouts.sm90_sfa_encode's bytes, pad rows 0);
  block scales (gm > 1) as is, like "plain" (SFB);
- "sm100": UE8M0 exponent bytes, four K-blocks per int32, MN-major, TMA-aligned, one word row per
  element row (block scales broadcast along MN), pad rows and missing blocks 0
  (layouts.sm100_ue8m0_encode's bytes). Needs power-of-two scales.
A kernel gets a pointer and three strides; for "sm100" the pointer is a byte view and the kernel
adds byte kb % 4 of word kb // 4.
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch
import triton
import triton.language as tl

from portable_kernels.layouts import tma_aligned_mn

ScaleForm = Literal["plain", "sm90", "sm100"]
SCALE_FORMS = ("plain", "sm90", "sm100")
#: kernel-side kinds: fp32 value per scale row, or one exponent byte per element row
FP32_PER_BLOCK_ROW = 0
UE8M0_PER_ROW = 1


@attrs.frozen
class ScaleOut:
    """Where a quantizer kernel writes its scales, and what the caller gets back."""

    result: torch.Tensor  # the scale tensor returned to the caller (a view of the storage)
    target: torch.Tensor  # what the kernel writes through (fp32 storage, or its uint8 view)
    kind: int
    stride_g: int
    stride_row: int
    stride_k: int


def scale_out(form: ScaleForm, lead: tuple[int, ...], rows: int, k_blocks: int, gran_mn: int,
              device: torch.device) -> ScaleOut:
    """Allocate the scale storage of `form` for data [*lead, rows, K] with k_blocks scale blocks."""
    block_rows = -(-rows // gran_mn)
    if form == "sm100":
        words, tma = -(-k_blocks // 4), tma_aligned_mn(rows)
        storage = torch.zeros(*lead, words, tma, dtype=torch.int32, device=device)
        return ScaleOut(storage[..., :rows].transpose(-1, -2), storage.view(torch.uint8), UE8M0_PER_ROW,
                        words * tma * 4, 4, tma * 4)
    if form == "sm90" and gran_mn == 1:
        tma = tma_aligned_mn(rows)
        storage = torch.zeros(*lead, k_blocks, tma, dtype=torch.float32, device=device)
        return ScaleOut(storage[..., :rows].transpose(-1, -2), storage, FP32_PER_BLOCK_ROW, k_blocks * tma, 1, tma)
    plain = torch.empty(*lead, block_rows, k_blocks, dtype=torch.float32, device=device)
    return ScaleOut(plain, plain, FP32_PER_BLOCK_ROW, block_rows * k_blocks, k_blocks, 1)


@triton.jit
def store_scales(base, sf, rows, row_mask, kb, stride_row, stride_k, KIND: tl.constexpr, GRAN_MN: tl.constexpr):
    """Write the scales `sf` (one per element of `rows`) of K-block `kb` into one group's storage.

    KIND 0: fp32 at (row // GRAN_MN, kb) (every row of a block writes the same value);
    KIND 1: the exponent byte at (row, word kb // 4) + byte kb % 4.
    """
    if KIND == 1:
        e = ((sf.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
        tl.store(base + rows * stride_row + (kb // 4) * stride_k + kb % 4, e, mask=row_mask)
    else:
        tl.store(base + (rows // GRAN_MN) * stride_row + kb * stride_k, sf, mask=row_mask)
