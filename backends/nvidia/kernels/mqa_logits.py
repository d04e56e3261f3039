"""fp8_mqa_logits in Triton (DeepSeek-V3.2's lightning indexer, prefill), DeepGEMM's work split:
logits[i, j] = Σ_h relu(q[i, h] · k[j]) · sk[j] · w[i, h], written at row i's valid keys only.

One program = one tile of ROWS query rows x one tile of BLOCK_N keys. The FP8 key tile [BLOCK_N, D]
and its scales are loaded once; the tile's query rows x heads, [ROWS·H_PAD, D] FP8, are the M
dimension of one fp8 x fp8 -> fp32 dot against it (wgmma / tcgen05 on the GPU; exact fp32 upcasts
in the interpreter). relu, times w[i, h], summed over the heads -> [ROWS, BLOCK_N], times the key
scale (positive, so it commutes with relu), stored where k_start[i] <= j < k_end[i] — at column j,
or j - k_start[i] when compressed. A tile outside every row's range returns at once, so causal
and context-parallel prefill touch only the keys they see. `head_reduced_logits` is shared with
the paged kernel (paged_mqa_logits.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, dot, serialized, to_out
from ._indexer_limits import HEAD_DIMS, MAX_HEADS

OP = "fp8_mqa_logits"
FP8 = torch.float8_e4m3fn
LOGITS_DTYPES = (torch.float32, torch.bfloat16)
WEIGHTS_DTYPES = (torch.float32, torch.bfloat16)
#: rows x padded heads of one dot (the M tile), and the smallest M tl.dot takes
M_TILE = 128
MIN_DOT_M = 16
#: keys per program
BLOCK_N = 128


def head_pad(heads: int) -> int:
    return triton.next_power_of_2(heads)


def rows_per_tile(heads: int, rows: int) -> int:
    """Query rows per dot: M_TILE // padded heads, no more than the rows there are (a power of two),
    and enough that the dot's M is at least MIN_DOT_M."""
    h_pad = head_pad(heads)
    return max(min(max(1, M_TILE // h_pad), triton.next_power_of_2(max(rows, 1))), max(1, MIN_DOT_M // h_pad))


@triton.jit
def head_reduced_logits(q, k, w, ROWS: tl.constexpr, H_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                        INTERPRET: tl.constexpr):
    """fp32 [ROWS, BLOCK_N] = Σ_h relu(q[r·H_PAD + h] · k[n]) · w[r·H_PAD + h], for q FP8
    [ROWS·H_PAD, D] (padded rows and heads zero), k FP8 [BLOCK_N, D], w fp32 [ROWS·H_PAD]."""
    score = dot(q, tl.trans(k), tl.zeros((ROWS * H_PAD, BLOCK_N), tl.float32), INTERPRET)
    score = tl.maximum(score, 0.0) * w[:, None]
    return tl.sum(tl.reshape(score, (ROWS, H_PAD, BLOCK_N)), axis=1)


@triton.jit
def mqa_logits_kernel(q_ptr, kv_ptr, sk_ptr, w_ptr, start_ptr, end_ptr, out_ptr, M, N, H, stride_w, stride_o,
                      COMPRESSED: tl.constexpr, OUT_BF16: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                      H_PAD: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    row0 = tl.program_id(0) * ROWS
    col0 = tl.program_id(1) * BLOCK_N
    rows = row0 + tl.arange(0, ROWS)
    row_ok = rows < M
    ks = tl.load(start_ptr + rows, mask=row_ok, other=0)
    ke = tl.load(end_ptr + rows, mask=row_ok, other=0)
    live = row_ok & (ks < ke)
    lo = tl.min(tl.where(live, ks, N), axis=0)
    hi = tl.max(tl.where(live, ke, 0), axis=0)
    if (col0 < hi) & (col0 + BLOCK_N > lo):
        d = tl.arange(0, D)
        cols = col0 + tl.arange(0, BLOCK_N)
        key_ok = cols < N
        k = tl.load(kv_ptr + cols[:, None].to(tl.int64) * D + d[None, :], mask=key_ok[:, None], other=0.0)
        sk = tl.load(sk_ptr + cols, mask=key_ok, other=0.0)
        idx = tl.arange(0, ROWS * H_PAD)
        q_row = row0 + idx // H_PAD
        head = idx % H_PAD
        q_ok = (q_row < M) & (head < H)
        q = tl.load(q_ptr + (q_row.to(tl.int64) * H + head)[:, None] * D + d[None, :], mask=q_ok[:, None],
                    other=0.0)
        w = tl.load(w_ptr + q_row.to(tl.int64) * stride_w + head, mask=q_ok, other=0.0).to(tl.float32)
        logits = head_reduced_logits(q, k, w, ROWS, H_PAD, BLOCK_N, INTERPRET) * sk[None, :]
        valid = row_ok[:, None] & (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
        if COMPRESSED:
            out_cols = cols[None, :] - ks[:, None]
        else:
            out_cols = cols[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o + out_cols, to_out(logits, OUT_BF16, INTERPRET),
                 mask=valid)


@serialized
def mqa_logits(q: torch.Tensor, kv: torch.Tensor, kv_scales: torch.Tensor, weights: torch.Tensor,
               k_start: torch.Tensor, k_end: torch.Tensor, compressed: bool, logits: torch.Tensor, *,
               block_n: int = BLOCK_N) -> None:
    """Write the valid entries of logits [M, W] (fp32 / bf16, stride(1) == 1).

    q: FP8 [M, H, D] contiguous; kv: FP8 [N, D] contiguous; kv_scales: fp32 [N]; weights: fp32
    (bf16 with bf16 logits) [M, H], stride(1) == 1; k_start / k_end: int32 [M] with
    0 <= start <= end <= N (the contract checked them); compressed: column j - k_start[i].
    """
    _checks.tensor(OP, "q", q, (FP8,), (None, None, None))
    m, heads, d = q.shape
    device = q.device
    _checks.contiguous(OP, "q", q)
    if d not in HEAD_DIMS or heads > MAX_HEADS:
        _checks.fail(OP, "q", f"[{m}, {heads}, {d}]", f"head dim in {HEAD_DIMS}, at most {MAX_HEADS} heads",
                     "use the layout-reference provider for other shapes")
    _checks.tensor(OP, "kv", kv, (FP8,), (None, d), device)
    _checks.contiguous(OP, "kv", kv)
    n = kv.shape[0]
    _checks.tensor(OP, "kv_scales", kv_scales, (torch.float32,), (n,), device)
    _checks.contiguous(OP, "kv_scales", kv_scales)
    _checks.tensor(OP, "weights", weights, WEIGHTS_DTYPES, (m, heads), device)
    _checks.inner_contiguous(OP, "weights", weights)
    for arg, t in (("k_start", k_start), ("k_end", k_end)):
        _checks.tensor(OP, arg, t, (torch.int32,), (m,), device)
        _checks.contiguous(OP, arg, t)
    _checks.tensor(OP, "logits", logits, LOGITS_DTYPES, (m, None), device)
    _checks.inner_contiguous(OP, "logits", logits)
    if m == 0 or n == 0 or logits.shape[1] == 0:
        return
    rows = rows_per_tile(heads, m)
    grid = (triton.cdiv(m, rows), triton.cdiv(n, block_n))
    mqa_logits_kernel[grid](q, kv, kv_scales, weights, k_start, k_end, logits, m, n, heads, weights.stride(0),
                            logits.stride(0), COMPRESSED=compressed, OUT_BF16=logits.dtype == torch.bfloat16, D=d,
                            ROWS=rows, H_PAD=head_pad(heads), BLOCK_N=block_n, INTERPRET=INTERPRET, num_warps=8)
