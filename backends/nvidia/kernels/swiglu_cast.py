"""swiglu_forward_and_per_token_cast in Triton: y = silu(gate)·up (· the row's top-k weight),
padding rows zero, then FP8 per (1, num_per_channels) with scales in the consumer's format.

x is [M, 2I] with the gate in the first half. With a clamp value c the gate is clamped to <= c and
up to [-c, c] first, and `clamped_count` (int64 [3]) gains this call's counts of gate > c, up > c
and up < -c over valid rows (atomic adds, one per program). A scale block wider than CHUNK
columns (e.g. one scale per row) is walked twice: once for amax, once to quantize.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP8_E4M3_MAX, SCALE_AMAX_FLOOR

from . import _checks
from ._common import INTERPRET, block_scale, e4m3_codes, nonfinite_rows, serialized
from ._scale_out import ScaleForm, scale_out, store_scales
from .cast_fp8 import INPUT_DTYPES, check_form

OP = "swiglu_forward_and_per_token_cast"
ROWS = 64 if INTERPRET else 16  # as cast_fp8.TOKEN_ROWS
CHUNK = 128


@triton.jit
def _swiglu(x_ptr, rows, cols, mask, stride_xr, I, weight, valid, CLAMP: tl.constexpr, clamp_value):
    """y of a [rows, cols] tile, with the raw gate and up for the clamp counts."""
    base = x_ptr + rows[:, None].to(tl.int64) * stride_xr + cols[None, :]
    gate = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + I, mask=mask, other=0.0).to(tl.float32)
    g, u = gate, up
    if CLAMP:
        g = tl.minimum(g, clamp_value, propagate_nan=tl.PropagateNan.ALL)
        u = tl.clamp(u, -clamp_value, clamp_value, propagate_nan=tl.PropagateNan.ALL)
    y = tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u * weight[:, None]
    return tl.where(valid[:, None], y, 0.0), gate, up


@triton.jit
def swiglu_cast_kernel(x_ptr, q_ptr, sf_ptr, ttk_ptr, w_ptr, pte_ptr, count_ptr, M, I, stride_xr, stride_qr,
                       sf_stride_row, sf_stride_k, clamp_value, NPC: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                       HAS_EXPERT: tl.constexpr, CLAMP: tl.constexpr, COUNT: tl.constexpr, UE8M0: tl.constexpr,
                       SF_KIND: tl.constexpr, BLOCK_R: tl.constexpr, CHUNK: tl.constexpr,
                       AMAX_FLOOR: tl.constexpr, FP8_MAX: tl.constexpr, INTERPRET: tl.constexpr):
    kb = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < M
    valid = row_mask
    weight = tl.full((BLOCK_R,), 1.0, tl.float32)
    if HAS_EXPERT:
        valid = valid & (tl.load(pte_ptr + rows, mask=row_mask, other=-1) >= 0)
    if HAS_WEIGHT:
        slot = tl.load(ttk_ptr + rows, mask=row_mask, other=-1)
        valid = valid & (slot >= 0)
        weight = tl.load(w_ptr + tl.maximum(slot, 0), mask=valid, other=0.0)
    j = tl.arange(0, CHUNK)
    amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
    has_nan = tl.zeros((BLOCK_R,), dtype=tl.int32)
    nonfinite = tl.zeros((BLOCK_R,), dtype=tl.int32)
    # per-row counts in int32 (a program sees at most BLOCK_R x NPC elements), summed once at the end
    n_gate = tl.zeros((BLOCK_R,), dtype=tl.int32)
    n_up_hi = tl.zeros((BLOCK_R,), dtype=tl.int32)
    n_up_lo = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for c0 in range(0, NPC, CHUNK):
        cols = kb * NPC + c0 + j
        mask = row_mask[:, None] & (cols[None, :] < I) & (c0 + j[None, :] < NPC)
        y, gate, up = _swiglu(x_ptr, rows, cols, mask, stride_xr, I, weight, valid, CLAMP, clamp_value)
        amax = tl.maximum(amax, tl.max(tl.abs(y), axis=1))
        chunk_nan, chunk_bad = nonfinite_rows(y)
        has_nan = tl.maximum(has_nan, chunk_nan)
        nonfinite = tl.maximum(nonfinite, chunk_bad)
        if COUNT:
            counted = mask & valid[:, None]
            n_gate += tl.sum((counted & (gate > clamp_value)).to(tl.int32), axis=1)
            n_up_hi += tl.sum((counted & (up > clamp_value)).to(tl.int32), axis=1)
            n_up_lo += tl.sum((counted & (up < -clamp_value)).to(tl.int32), axis=1)
    if COUNT:
        tl.atomic_add(count_ptr, tl.sum(n_gate, axis=0).to(tl.int64))
        tl.atomic_add(count_ptr + 1, tl.sum(n_up_hi, axis=0).to(tl.int64))
        tl.atomic_add(count_ptr + 2, tl.sum(n_up_lo, axis=0).to(tl.int64))
    sf = block_scale(tl.where(has_nan > 0, float("nan"), amax), nonfinite, AMAX_FLOOR, FP8_MAX, UE8M0)
    for c0 in range(0, NPC, CHUNK):
        cols = kb * NPC + c0 + j
        mask = row_mask[:, None] & (cols[None, :] < I) & (c0 + j[None, :] < NPC)
        y, gate, up = _swiglu(x_ptr, rows, cols, mask, stride_xr, I, weight, valid, CLAMP, clamp_value)
        q = tl.clamp(tl.math.div_rn(y, sf[:, None]), -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_qr + cols[None, :], e4m3_codes(q, INTERPRET), mask=mask)
    store_scales(sf_ptr, sf, rows, row_mask, kb, sf_stride_row, sf_stride_k, SF_KIND, 1)


@serialized
def swiglu_cast(x: torch.Tensor, num_per_channels: int, round_sf: bool,
                pos_to_token_topk: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
                pos_to_expert: torch.Tensor | None = None, swiglu_clamp_value: float | None = None,
                clamped_count: torch.Tensor | None = None,
                scale_form: ScaleForm = "plain") -> tuple[torch.Tensor, torch.Tensor]:
    """x bf16/fp16/fp32 [M, 2I] -> (e4m3 [M, I], scales (1, num_per_channels) in `scale_form`).

    pos_to_token_topk int32 [M] with topk_weights fp32 [T, k] (row weight = topk_weights.flatten()
    [pos_to_token_topk[r]], -1 = padding row), pos_to_expert int32 [M] (-1 = padding row),
    swiglu_clamp_value > 0 or None, clamped_count int64 [3] or None (needs the clamp value).
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES or x.dim() != 2 or x.shape[1] % 2:
        _checks.fail(OP, "x", repr(x) if not isinstance(x, torch.Tensor) else f"{x.dtype} {tuple(x.shape)}",
                     "a 2-D [M, 2I] float tensor", "pass the gate/up projection output")
    if isinstance(num_per_channels, bool) or not isinstance(num_per_channels, int) or num_per_channels < 1:
        _checks.fail(OP, "num_per_channels", repr(num_per_channels), "a positive int", "pass 128")
    check_form(OP, scale_form, round_sf)
    _checks.inner_contiguous(OP, "x", x)
    m, i = x.shape[0], x.shape[1] // 2
    device = x.device
    for arg, t in (("pos_to_token_topk", pos_to_token_topk), ("pos_to_expert", pos_to_expert)):
        if t is not None:
            _checks.tensor(OP, arg, t, (torch.int32,), (m,), device)
    if (pos_to_token_topk is None) != (topk_weights is None):
        _checks.fail(OP, "topk_weights", "given without pos_to_token_topk (or the reverse)", "both or neither",
                     "pass both")
    if topk_weights is not None:
        _checks.tensor(OP, "topk_weights", topk_weights, (torch.float32,), (None, None), device)
        _checks.contiguous(OP, "topk_weights", topk_weights)
    if clamped_count is not None:
        if swiglu_clamp_value is None:
            _checks.fail(OP, "clamped_count", "given without swiglu_clamp_value", "a clamp value", "pass one")
        _checks.tensor(OP, "clamped_count", clamped_count, (torch.int64,), (3,), device)
    k_blocks = -(-i // num_per_channels)
    q = torch.empty(m, i, dtype=torch.float8_e4m3fn, device=device)
    out = scale_out(scale_form, (), m, k_blocks, 1, device)
    if q.numel() == 0:
        return q, out.result
    dummy_i32 = torch.empty(1, dtype=torch.int32, device=device)
    grid = (triton.cdiv(m, ROWS), k_blocks)
    swiglu_cast_kernel[grid](
        x, q.view(torch.uint8), out.target,
        pos_to_token_topk if pos_to_token_topk is not None else dummy_i32,
        topk_weights if topk_weights is not None else x,
        pos_to_expert if pos_to_expert is not None else dummy_i32,
        clamped_count if clamped_count is not None else dummy_i32,
        m, i, x.stride(0), q.stride(0), out.stride_row, out.stride_k,
        float(swiglu_clamp_value) if swiglu_clamp_value is not None else 0.0,
        NPC=num_per_channels, HAS_WEIGHT=topk_weights is not None, HAS_EXPERT=pos_to_expert is not None,
        CLAMP=swiglu_clamp_value is not None, COUNT=clamped_count is not None, UE8M0=round_sf, SF_KIND=out.kind,
        BLOCK_R=ROWS, CHUNK=min(CHUNK, triton.next_power_of_2(num_per_channels)), AMAX_FLOOR=SCALE_AMAX_FLOOR,
        FP8_MAX=FP8_E4M3_MAX, INTERPRET=INTERPRET)
    return q, out.result
