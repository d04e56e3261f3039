"""fp8_paged_mqa_logits in Triton (DeepSeek-V3.2's lightning indexer, decode) over DeepGEMM's paged
FP8 key cache (layouts.indexer_cache): logits[b·next_n + t, j] = Σ_h relu(q[b, t, h] · k_b[j]) ·
sk_b[j] · w[b·next_n + t, h] for j < context_lens[b, t].

One program = one sequence b x one tile of BLOCK_N keys of it. Key j lives in cache block
block_table[b, j // BLOCK_KV], slot j % BLOCK_KV: its D FP8 bytes at slot·D of the block and its
fp32 scale at BLOCK_KV·D + 4·slot, so the key tile is gathered token by token (any BLOCK_KV; the
table is read once per token, only for j below the sequence's longest row, and clamped to the
cache, so no access leaves it). The tile is loaded once for all next_n rows; their rows x heads
form the dot's M dimension, ROWS rows at a time (mqa_logits.head_reduced_logits). Tiles past the
sequence's longest row return at once. The schedule of get_paged_mqa_logits_metadata is not read:
the grid covers (B, key tiles of max_context_len) and idle programs exit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.indexer_cache import INDEXER_SCALE_BYTES

from . import _checks
from ._common import INTERPRET, serialized, to_out
from ._indexer_limits import HEAD_DIMS, MAX_HEADS, MAX_NEXT_N
from .mqa_logits import FP8, LOGITS_DTYPES, M_TILE, MIN_DOT_M, WEIGHTS_DTYPES, head_reduced_logits

OP = "fp8_paged_mqa_logits"
#: keys per program
BLOCK_N = 64


def head_pad(heads: int) -> int:
    """Heads padded to a power of two, and to MIN_DOT_M (one row per dot when next_n == 1)."""
    return max(triton.next_power_of_2(heads), MIN_DOT_M)


def rows_per_dot(heads: int, next_n: int) -> int:
    return max(1, min(M_TILE // head_pad(heads), triton.next_power_of_2(next_n)))


@triton.jit
def paged_mqa_logits_kernel(q_ptr, cache_ptr, w_ptr, lens_ptr, table_ptr, out_ptr, H, NUM_BLOCKS, stride_block,
                            stride_table, stride_w, stride_o,
                            NEXT_N: tl.constexpr, NEXT_N_POW2: tl.constexpr, BLOCK_KV: tl.constexpr,
                            OUT_BF16: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, H_PAD: tl.constexpr,
                            BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    b = tl.program_id(0)
    col0 = tl.program_id(1) * BLOCK_N
    t_all = tl.arange(0, NEXT_N_POW2)
    longest = tl.max(tl.load(lens_ptr + b * NEXT_N + t_all, mask=t_all < NEXT_N, other=0), axis=0)
    if col0 < longest:
        d = tl.arange(0, D)
        cols = col0 + tl.arange(0, BLOCK_N)
        key_ok = cols < longest
        block = tl.load(table_ptr + b.to(tl.int64) * stride_table + cols // BLOCK_KV, mask=key_ok, other=0)
        block = tl.minimum(tl.maximum(block, 0), NUM_BLOCKS - 1)
        slot = cols % BLOCK_KV
        base = cache_ptr + block.to(tl.int64) * stride_block
        raw = tl.load(base[:, None] + slot[:, None] * D + d[None, :], mask=key_ok[:, None], other=0)
        k = raw.to(tl.float8e4nv, bitcast=True)
        sk = tl.load((base + BLOCK_KV * D + 4 * slot).to(tl.pointer_type(tl.float32)), mask=key_ok, other=0.0)
        idx = tl.arange(0, ROWS * H_PAD)
        head = idx % H_PAD
        for t0 in tl.static_range(0, NEXT_N, ROWS):
            t_q = t0 + idx // H_PAD
            q_ok = (t_q < NEXT_N) & (head < H)
            q_row = (b * NEXT_N + t_q).to(tl.int64)
            q = tl.load(q_ptr + (q_row * H + head)[:, None] * D + d[None, :], mask=q_ok[:, None], other=0.0)
            w = tl.load(w_ptr + q_row * stride_w + head, mask=q_ok, other=0.0).to(tl.float32)
            logits = head_reduced_logits(q, k, w, ROWS, H_PAD, BLOCK_N, INTERPRET) * sk[None, :]
            t = t0 + tl.arange(0, ROWS)
            lens = tl.load(lens_ptr + b * NEXT_N + t, mask=t < NEXT_N, other=0)
            rows = (b * NEXT_N + t).to(tl.int64)
            tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :], to_out(logits, OUT_BF16, INTERPRET),
                     mask=cols[None, :] < lens[:, None])


@serialized
def paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                     block_table: torch.Tensor, logits: torch.Tensor, *, block_n: int = BLOCK_N) -> None:
    """Write the valid entries of logits [B·next_n, W] (fp32 / bf16, stride(1) == 1).

    q: FP8 [B, next_n, H, D] contiguous; kv_cache: uint8 [blocks, block_kv, 1, D + 4]
    (layouts.indexer_cache; stride(0) a multiple of 4); weights: fp32 (bf16 with bf16 logits)
    [B·next_n, H], stride(1) == 1; context_lens: int32 [B, next_n], each <= W; block_table: int32
    [B, max_blocks], stride(1) == 1, valid for every block in use (the contract checked the values).
    """
    _checks.tensor(OP, "q", q, (FP8,), (None, None, None, None))
    batch, next_n, heads, d = q.shape
    device = q.device
    _checks.contiguous(OP, "q", q)
    if d not in HEAD_DIMS or heads > MAX_HEADS or next_n > MAX_NEXT_N:
        _checks.fail(OP, "q", f"[{batch}, {next_n}, {heads}, {d}]",
                     f"head dim in {HEAD_DIMS}, at most {MAX_HEADS} heads and next_n <= {MAX_NEXT_N}",
                     "use the layout-reference provider for other shapes")
    _checks.tensor(OP, "kv_cache", kv_cache, (torch.uint8,), (None, None, 1, d + INDEXER_SCALE_BYTES), device)
    num_blocks, block_kv = kv_cache.shape[:2]
    if kv_cache.stride(1) != d + INDEXER_SCALE_BYTES or kv_cache.stride(3) != 1 \
            or kv_cache.stride(0) % INDEXER_SCALE_BYTES or kv_cache.data_ptr() % INDEXER_SCALE_BYTES:
        _checks.fail(OP, "kv_cache", f"strides {kv_cache.stride()}", "the layouts.indexer_cache layout",
                     "build it with layouts.pack_indexer_cache")
    _checks.tensor(OP, "weights", weights, WEIGHTS_DTYPES, (batch * next_n, heads), device)
    _checks.inner_contiguous(OP, "weights", weights)
    _checks.tensor(OP, "context_lens", context_lens, (torch.int32,), (batch, next_n), device)
    _checks.contiguous(OP, "context_lens", context_lens)
    _checks.tensor(OP, "block_table", block_table, (torch.int32,), (batch, None), device)
    _checks.inner_contiguous(OP, "block_table", block_table)
    _checks.tensor(OP, "logits", logits, LOGITS_DTYPES, (batch * next_n, None), device)
    _checks.inner_contiguous(OP, "logits", logits)
    width = logits.shape[1]
    if batch == 0 or width == 0 or num_blocks == 0:
        return
    grid = (batch, triton.cdiv(width, block_n))
    paged_mqa_logits_kernel[grid](
        q, kv_cache, weights, context_lens, block_table, logits, heads, num_blocks, kv_cache.stride(0),
        block_table.stride(0), weights.stride(0), logits.stride(0), NEXT_N=next_n,
        NEXT_N_POW2=triton.next_power_of_2(next_n), BLOCK_KV=block_kv, OUT_BF16=logits.dtype == torch.bfloat16,
        D=d, ROWS=rows_per_dot(heads, next_n), H_PAD=head_pad(heads), BLOCK_N=block_n, INTERPRET=INTERPRET,
        num_warps=8)
