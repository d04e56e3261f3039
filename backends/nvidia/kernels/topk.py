"""topk (DeepSelect semantics) in Triton: a per-row radix select on order-preserving 32-bit keys.

Each row is one program. Four passes build 256-bin histograms of the key's bytes (high byte
first) over the elements still matching the chosen prefix; they fix the exact key T of the
count-th largest valid element and how many elements equal to T are needed. A last pass writes
every element above T and the first needed ties (smaller index first) in increasing index order,
so the default and `sorted_index` outputs are the same; with `sorted` the k chosen pairs are
sorted by value afterwards. Slots past min(topk, end[i]) get the fill values. Values are copied
as raw bits (bf16 or fp32), so nothing is rounded. The row is walked in chunks of BLOCK_N, so any
length works; a NaN sorts above +inf (the op refuses NaN before calling on CPU tensors).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "topk"
INPUT_DTYPES = (torch.bfloat16, torch.float32)
MAX_TOPK = 4096
#: elements of a row held at once
BLOCK_N = 4096
_BITS_DTYPE = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


@triton.jit
def _keys(x_ptr, cols, mask, IS_BF16: tl.constexpr):
    """uint32 keys ordered like the float values, from raw bits (bf16 widened to fp32 bits)."""
    if IS_BF16:
        bits = tl.load(x_ptr + cols, mask=mask, other=0).to(tl.int32) << 16
    else:
        bits = tl.load(x_ptr + cols, mask=mask, other=0)
    # flip every bit of negatives, only the sign bit of positives: unsigned order = float order
    flip = (bits >> 31) | (-2147483647 - 1)
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def topk_kernel(x_ptr, end_ptr, val_ptr, idx_ptr, N, TOPK, stride_x, stride_v, stride_i, idx_fill, val_fill,
                HAS_END: tl.constexpr, IS_BF16: tl.constexpr, SORTED: tl.constexpr, RETURN_VALUE: tl.constexpr,
                BLOCK_N: tl.constexpr, K_POW2: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    v_row = val_ptr + row.to(tl.int64) * stride_v
    i_row = idx_ptr + row.to(tl.int64) * stride_i
    length = N
    if HAS_END:
        length = tl.minimum(tl.maximum(tl.load(end_ptr + row), 0), N)
    count = tl.minimum(length, TOPK)
    offs = tl.arange(0, BLOCK_N)
    bins = tl.arange(0, 256)
    if count > 0:
        # radix select: the exact threshold key, and how many keys equal to it are taken
        prefix = tl.zeros((), dtype=tl.uint32)
        prefix_mask = tl.zeros((), dtype=tl.uint32)
        need = count
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros((256,), dtype=tl.int32)
            for start in range(0, length, BLOCK_N):
                cols = start + offs
                valid = cols < length
                key = _keys(x_row, cols, valid, IS_BF16)
                match = valid & ((key & prefix_mask) == prefix)
                digit = ((key >> shift) & 0xFF).to(tl.int32)
                hist += tl.histogram(digit, 256, mask=match)
            at_least = tl.cumsum(hist, axis=0, reverse=True)  # keys with digit >= d
            d = tl.sum((at_least >= need).to(tl.int32), axis=0) - 1
            above = tl.sum(tl.where(bins == d + 1, at_least, 0), axis=0)
            need -= above
            prefix = prefix | (d.to(tl.uint32) << shift)
            prefix_mask = prefix_mask | (tl.full((), 0xFF, tl.uint32) << shift)
        # write the selection in index order
        written = 0
        ties_seen = 0
        for start in range(0, length, BLOCK_N):
            cols = start + offs
            valid = cols < length
            key = _keys(x_row, cols, valid, IS_BF16)
            tie = valid & (key == prefix)
            tie_rank = tl.cumsum(tie.to(tl.int32), axis=0) - tie.to(tl.int32) + ties_seen
            take = (valid & (key > prefix)) | (tie & (tie_rank < need))
            slot = tl.cumsum(take.to(tl.int32), axis=0) - take.to(tl.int32) + written
            tl.store(i_row + slot, cols.to(i_row.dtype.element_ty), mask=take)
            if RETURN_VALUE and not SORTED:
                tl.store(v_row + slot, tl.load(x_row + cols, mask=take, other=0), mask=take)
            written += tl.sum(take.to(tl.int32), axis=0)
            ties_seen += tl.sum(tie.to(tl.int32), axis=0)
        if SORTED:
            slots = tl.arange(0, K_POW2)
            chosen = slots < count
            cols = tl.load(i_row + slots, mask=chosen, other=0).to(tl.int32)
            key = _keys(x_row, cols, chosen, IS_BF16)
            # signed-order key in the high word, the slot (index order) reversed in the low word:
            # one descending sort orders by value, equal values by index
            signed = key.to(tl.int32, bitcast=True) ^ (-2147483647 - 1)
            pair = (signed.to(tl.int64) << 32) | (0x7FFFFFFF - cols)
            pair = tl.where(chosen, pair, -9223372036854775807 - 1)
            pair = tl.sort(pair, descending=True)
            cols = (0x7FFFFFFF - (pair & 0x7FFFFFFF)).to(tl.int32)
            tl.store(i_row + slots, cols.to(i_row.dtype.element_ty), mask=chosen)
            if RETURN_VALUE:
                tl.store(v_row + slots, tl.load(x_row + cols, mask=chosen, other=0), mask=chosen)
    for start in range(count, TOPK, BLOCK_N):
        slots = start + offs
        fill = slots < TOPK
        tl.store(i_row + slots, tl.full((BLOCK_N,), idx_fill, tl.int64).to(i_row.dtype.element_ty), mask=fill)
        if RETURN_VALUE:
            tl.store(v_row + slots, tl.full((BLOCK_N,), val_fill, tl.int32).to(v_row.dtype.element_ty), mask=fill)


@serialized
def topk(input: torch.Tensor, k: int, end: torch.Tensor | None = None, sorted: bool = False,
         sorted_index: bool = False, indices_type: torch.dtype = torch.int64, idx_oob_fill_value: int = 2 ** 31 - 1,
         value_oob_fill_value: float = float("-inf"),
         return_value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(values input.dtype [b, k] | None, indices [b, k]) of the k largest of each row's first end[i]."""
    _checks.tensor(OP, "input", input, INPUT_DTYPES, (None, None))
    b, n = input.shape
    _checks.inner_contiguous(OP, "input", input)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOPK:
        _checks.fail(OP, "topk", repr(k), f"an int in [1, {MAX_TOPK}]", "select at most 4096")
    if sorted and sorted_index:
        _checks.fail(OP, "sorted_index", "True with sorted=True", "at most one order", "choose one")
    if end is not None:
        _checks.tensor(OP, "end", end, (torch.int32,), (b,), input.device)
    if indices_type not in (torch.int32, torch.int64):
        _checks.fail(OP, "indices_type", repr(indices_type), "torch.int32 or torch.int64", "pass one of them")
    indices = torch.empty(b, k, dtype=indices_type, device=input.device)
    values = torch.empty(b, k, dtype=input.dtype, device=input.device) if return_value else None
    if b == 0:
        return values, indices
    bits_dtype = _BITS_DTYPE[input.dtype]
    fill_bits = int(torch.tensor(value_oob_fill_value, dtype=input.dtype).view(bits_dtype))
    values_arg = values.view(bits_dtype) if values is not None else indices
    x_bits = input.view(bits_dtype) if n else input.new_empty(b, 1).view(bits_dtype)
    topk_kernel[(b,)](x_bits, end if end is not None else indices, values_arg, indices, n, k, x_bits.stride(0),
                      values_arg.stride(0), indices.stride(0), int(idx_oob_fill_value), fill_bits,
                      HAS_END=end is not None, IS_BF16=input.dtype == torch.bfloat16, SORTED=sorted,
                      RETURN_VALUE=return_value, BLOCK_N=min(BLOCK_N, triton.next_power_of_2(max(n, k, 16))),
                      K_POW2=triton.next_power_of_2(k), num_warps=8)
    return values, indices
