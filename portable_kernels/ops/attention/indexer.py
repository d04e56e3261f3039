"""Lightning-indexer logits (DeepSeek-V3.2), DeepGEMM names and argument order.

`fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
max_seqlen_k=0, logits_dtype=torch.float32)` — prefill, keys in one contiguous FP8 tensor;
`fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
max_context_len, clean_logits=False, logits_dtype=torch.float32, indices=None)` — decode, keys in
a paged cache (`layouts.indexer_cache`); `get_paged_mqa_logits_metadata(context_lens, block_kv,
num_sms, indices=None)` — the schedule the paged call takes.

Contract (K the dequantized keys, fp8 value · fp32 scale per token; q FP8 without a scale, the
query's scale being folded into `weights` as DeepSeek's inference does):

    logits[i, j] = sum_h relu(q[i, h, :] · K[j, :]) · weights[i, h]

computed in fp32, stored as `logits_dtype` (fp32 or bf16), for the valid keys of row i: j in
[k_start[i], k_end[i]) for `fp8_mqa_logits`, j < context_lens[b, t] for row b·next_n + t of the
paged call (key j of sequence b lives in cache block block_table[b, j // block_kv], slot
j % block_kv). Every other entry is -inf with `clean_logits`, unspecified without. With
max_seqlen_k > 0 (compressed) column j of row i holds key k_start[i] + j and the width is
max_seqlen_k (clean_logits must then be False, as in DeepGEMM). `logits` is a view of a buffer
whose row stride is a multiple of 1024 bytes, as DeepGEMM allocates it. Providers write the valid
entries only; the op fills -inf first when clean_logits asks for it.

The indices, lengths and tables are checked on the host before anything runs (on CPU tensors; on
accelerators with PK_CHECK_VALUES=1), so a bad block_table entry is a ContractError, never an
out-of-bounds read.

FP4 (DeepGEMM's `fp8_fp4_*` with FP4 operands, SM100): q as the pair (int8 packed E2M1 [..., D/2],
int32 [...] UE8M0 exponent words, one exponent per 32 channels) and the keys in the same form —
(int8 [N, D/2], int32 [N]) for the prefill call, the FP4 paged cache (D/2 + 4 bytes per token,
layouts.indexer_cache) for the decode call; q and keys are FP4 together. The contract is the same
sum over the dequantized q and K (exact in fp32); weights carry no q scale then.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_bool, check_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ...core.tensors import describe
from ...layouts.errors import LayoutConversionError
from ...layouts.indexer_cache import (FP4_INDEXER_BLOCK, INDEXER_SCALE_BYTES, dequantize_fp4_rows,
                                      dequantize_indexer_cache, dequantize_indexer_cache_fp4, indexer_cache_views)

Q_DTYPE = torch.float8_e4m3fn
#: dtypes of packed FP4 (E2M1) q and keys (DeepGEMM's per_token_cast_to_fp4 returns int8)
FP4_DTYPES = (torch.int8, torch.uint8)
#: the FP4 head dims one int32 word of exponents covers
FP4_MAX_HEAD_DIM = FP4_INDEXER_BLOCK * INDEXER_SCALE_BYTES
LOGITS_DTYPES = (torch.float32, torch.bfloat16)
WEIGHTS_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPE = torch.int32
#: DeepGEMM's logits row alignment (bytes) and the column granules it pads to
LOGITS_ROW_ALIGN_BYTES = 1024
PREFILL_BLOCK_KV = 256
PAGED_SPLIT_KV = 256
#: DeepGEMM's bounds on the simulated (dequantized) reference: bf16 in the chain, else fp32
BF16_TOLERANCE = 3e-5
FP32_TOLERANCE = 5e-6


# -- reference math ------------------------------------------------------------------------------

def mqa_logits_reference(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, k_start: torch.Tensor,
                         k_end: torch.Tensor) -> torch.Tensor:
    """q [M, H, D] and k [N, D] (any float dtype, dequantized), weights [M, H] -> fp32 [M, N] with
    -inf outside [k_start[i], k_end[i])."""
    score = torch.einsum("mhd,nd->mhn", q.float(), k.float()).relu_()
    logits = torch.einsum("mhn,mh->mn", score, weights.float())
    cols = torch.arange(k.shape[0], device=q.device)
    valid = (cols[None, :] >= k_start.long()[:, None]) & (cols[None, :] < k_end.long()[:, None])
    return logits.masked_fill_(~valid, float("-inf"))


def paged_keys(kv: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """Keys 0..length-1 of sequence b from a dequantized paged cache kv [blocks, block_kv, D]."""
    block_kv = kv.shape[1]
    blocks = block_table[b, : -(-length // block_kv)].long()
    return kv[blocks].reshape(-1, kv.shape[-1])[:length]


def paged_mqa_logits_reference(q: torch.Tensor, kv: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                               block_table: torch.Tensor, max_context_len: int) -> torch.Tensor:
    """q [B, T, H, D], kv [blocks, block_kv, D] (dequantized), weights [B·T, H], context_lens [B, T]
    -> fp32 [B·T, max_context_len] with -inf past each row's context length."""
    batch, next_n = q.shape[:2]
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    lens = context_lens.tolist()
    for b in range(batch):
        longest = max(lens[b])
        if longest == 0:
            continue
        keys = paged_keys(kv, block_table, b, longest)
        rows = slice(b * next_n, (b + 1) * next_n)
        ends = context_lens[b].to(torch.int32)
        out[rows, :longest] = mqa_logits_reference(q[b], keys, weights[rows], torch.zeros_like(ends), ends)
    return out


# -- inputs values ------------------------------------------------------------------------------

@attrs.frozen
class MqaLogitsInputs(Inputs):
    """One fp8_mqa_logits call (validated, logits allocated): q fp8 [M, H, D]; kv fp8 [N, D] and
    kv_scales fp32 [N]; weights fp32/bf16 [M, H]; k_start / k_end int32 [M]; compressed: column j of
    row i is key k_start[i] + j; logits [M, W] to write (valid entries only). Returns None.
    FP4 (q_scales given): q int8 packed [M, H, D/2] with q_scales int32 words [M, H], kv int8
    packed [N, D/2] with kv_scales int32 words [N]."""

    q: torch.Tensor
    kv: torch.Tensor
    kv_scales: torch.Tensor
    weights: torch.Tensor
    k_start: torch.Tensor
    k_end: torch.Tensor
    compressed: bool
    logits: torch.Tensor
    q_scales: torch.Tensor | None = None
    device_field = "q"

    def dims(self) -> dict[str, int]:
        m, h, d = self.q.shape
        return {"m": m, "h": h, "d": d * (2 if self.q_scales is not None else 1), "n": self.kv.shape[0]}


@attrs.frozen
class PagedMqaLogitsInputs(Inputs):
    """One fp8_paged_mqa_logits call (validated, logits allocated): q fp8 [B, T, H, D]; kv_cache
    uint8 [blocks, block_kv, 1, D + 4] (layouts.indexer_cache); weights [B·T, H]; context_lens int32
    [B, T]; block_table int32 [B, max_blocks]; schedule_meta int32 [S + 1, 2] from
    get_paged_mqa_logits_metadata (providers may use it to divide the work); logits [B·T, W] to
    write (valid entries only). Returns None. FP4 (q_scales given): q int8 packed [B, T, H, D/2]
    with q_scales int32 words [B, T, H], the cache in its FP4 form [blocks, block_kv, 1, D/2 + 4]."""

    q: torch.Tensor
    kv_cache: torch.Tensor
    weights: torch.Tensor
    context_lens: torch.Tensor
    block_table: torch.Tensor
    schedule_meta: torch.Tensor
    logits: torch.Tensor
    q_scales: torch.Tensor | None = None
    device_field = "q"

    def dims(self) -> dict[str, int]:
        b, t, h, d = self.q.shape
        return {"b": b, "next_n": t, "h": h, "d": d * (2 if self.q_scales is not None else 1),
                "block_kv": self.kv_cache.shape[1]}


def mqa_logits_kernel(call: MqaLogitsInputs) -> None:
    """Reference kernel of fp8_mqa_logits: the contract math, written into call.logits."""
    if call.q_scales is not None:
        q, k = dequantize_fp4_rows(call.q, call.q_scales), dequantize_fp4_rows(call.kv, call.kv_scales)
    else:
        q, k = call.q, call.kv.float() * call.kv_scales.float()[:, None]
    full = mqa_logits_reference(q, k, call.weights, call.k_start, call.k_end)
    write_valid(call.logits, full, call.k_start, call.k_end, call.compressed)


def write_valid(logits: torch.Tensor, full: torch.Tensor, k_start: torch.Tensor, k_end: torch.Tensor,
                compressed: bool) -> None:
    """Copy the valid entries of full [M, N] (fp32) into logits, uncompressed or compressed."""
    m, width = logits.shape
    cols = torch.arange(width, device=logits.device)
    start, end = k_start.long()[:, None], k_end.long()[:, None]
    if compressed:
        valid = cols[None, :] < end - start
        source = full.gather(1, (cols[None, :] + start).clamp(max=max(full.shape[1] - 1, 0))) if full.shape[1] \
            else full.new_zeros(m, width)
    else:
        valid = (cols[None, :] >= start) & (cols[None, :] < end)
        source = full
    logits.copy_(torch.where(valid, source.to(logits.dtype), logits))


def paged_mqa_logits_kernel(call: PagedMqaLogitsInputs) -> None:
    """Reference kernel of fp8_paged_mqa_logits, written into call.logits (valid entries only)."""
    if call.q_scales is not None:
        q, kv = dequantize_fp4_rows(call.q, call.q_scales), dequantize_indexer_cache_fp4(call.kv_cache)
    else:
        q, kv = call.q, dequantize_indexer_cache(call.kv_cache)
    full = paged_mqa_logits_reference(q, kv, call.weights, call.context_lens, call.block_table,
                                      call.logits.shape[1])
    ends = call.context_lens.reshape(-1)
    write_valid(call.logits, full, torch.zeros_like(ends), ends, False)


MQA_LOGITS = register_contract(OpContract("fp8_mqa_logits", mqa_logits_reference, Tolerance(dequantized=BF16_TOLERANCE),
                                          kernel=mqa_logits_kernel))
PAGED_MQA_LOGITS = register_contract(OpContract("fp8_paged_mqa_logits", paged_mqa_logits_reference,
                                                Tolerance(dequantized=BF16_TOLERANCE), kernel=paged_mqa_logits_kernel))


# -- argument checks ----------------------------------------------------------------------------

def _fail(op: str, arg: str, given: Any, expected: str, fix: str) -> None:
    raise ContractError(format_problem(op, arg, given, expected, fix))


def unwrap_q(op: str, q: Any, dims: int) -> torch.Tensor:
    """The FP8 q of a call (a tensor or (tensor, None)); FP4 pairs are refused (see unwrap_any_q)."""
    values, scales = unwrap_any_q(op, q, dims)
    if scales is not None:
        _fail(op, "q", "an FP4 pair", "an fp8 tensor or (fp8 tensor, None)", "pass FP8 queries here")
    return values


def unwrap_any_q(op: str, q: Any, dims: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(values, None) for an FP8 q — a float8_e4m3fn tensor or (it, None) — or (packed, words) for
    DeepGEMM's FP4 pair (int8 [..., D/2], int32 [...]), checked."""
    shape = "[seq_len, heads, head_dim]" if dims == 3 else "[batch, next_n, heads, head_dim]"
    if isinstance(q, tuple) and len(q) == 2 and q[1] is not None:
        values, words = q
        if not isinstance(values, torch.Tensor) or values.dtype not in FP4_DTYPES or values.dim() != dims \
                or not values.is_contiguous():
            _fail(op, "q", f"an FP4 pair with values {describe(values)}",
                  f"contiguous int8 packed E2M1 {shape[:-10]}head_dim / 2]",
                  "quantize q with deep_gemm.utils.per_token_cast_to_fp4(..., gran_k=32, use_packed_ue8m0=True)")
        d = values.shape[-1] * 2
        if d % FP4_INDEXER_BLOCK or d > FP4_MAX_HEAD_DIM:
            _fail(op, "q", f"FP4 values of head dim {d}", f"a multiple of {FP4_INDEXER_BLOCK} up to {FP4_MAX_HEAD_DIM} "
                  "(one int32 word of exponents per row)", "use head_dim 64 or 128 for FP4")
        if not isinstance(words, torch.Tensor) or words.dtype != torch.int32 \
                or tuple(words.shape) != tuple(values.shape[:-1]) or not words.is_contiguous():
            _fail(op, "q", f"an FP4 pair with scales {describe(words)}",
                  f"contiguous int32 {list(values.shape[:-1])} (packed UE8M0, one word per row)",
                  "pass per_token_cast_to_fp4's packed scales viewed to the rows' shape")
        if words.device != values.device:
            _fail(op, "q", f"scales on {words.device}", f"on {values.device} like the values", "move them together")
        return values, words
    if isinstance(q, tuple):
        if len(q) != 2:
            _fail(op, "q", f"a tuple ({', '.join(describe(v) for v in q)})",
                  "an fp8 tensor, (fp8 tensor, None) or an FP4 pair (int8 values, int32 scales)",
                  "pass q as DeepGEMM does")
        q = q[0]
    if not isinstance(q, torch.Tensor) or q.dtype != Q_DTYPE or q.dim() != dims or not q.is_contiguous():
        _fail(op, "q", describe(q), f"a contiguous float8_e4m3fn tensor {shape}",
              "quantize q with q.to(torch.float8_e4m3fn) (fold its scale into weights) and pass it contiguous")
    return q, None


def _check_index(op: str, arg: str, t: Any, shape: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != INDEX_DTYPE or tuple(t.shape) != shape or not t.is_contiguous():
        _fail(op, arg, describe(t), f"a contiguous int32 tensor of shape {list(shape)}",
              f"pass {arg} as torch.int32 {list(shape)}")
    if t.device != device:
        _fail(op, arg, f"on {t.device}", f"on {device} like q", f"move {arg} to q's device")


def _check_weights(op: str, weights: Any, rows: int, heads: int, logits_dtype: Any, device: torch.device) -> None:
    if logits_dtype not in LOGITS_DTYPES:
        _fail(op, "logits_dtype", repr(logits_dtype), "torch.float32 or torch.bfloat16", "pass one of them")
    if not isinstance(weights, torch.Tensor) or weights.dtype not in WEIGHTS_DTYPES \
            or tuple(weights.shape) != (rows, heads) or weights.stride(1) != 1:
        _fail(op, "weights", describe(weights), f"an fp32 (or bf16) tensor [{rows}, {heads}] with stride(1) == 1",
              "pass one weight per query row and head (weights_proj(x) · scales)")
    if weights.dtype == torch.bfloat16 and logits_dtype != torch.bfloat16:
        _fail(op, "weights", "bf16 with fp32 logits", "fp32 weights, or bf16 weights with bf16 logits (DeepGEMM's rule)",
              "pass weights.float() or logits_dtype=torch.bfloat16")
    if weights.device != device:
        _fail(op, "weights", f"on {weights.device}", f"on {device} like q", "move weights to q's device")


#: set by testing.indexer_cases.poisoned_logits: new logits buffers are filled with NaN, so an entry a
#: provider should have written and did not shows in conformance (never set on a hot path)
POISON_LOGITS = False


def allocate_logits(rows: int, width: int, padded: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A [rows, width] view of a [rows, stride] buffer, stride = padded rounded up to 1024 bytes."""
    per_row = LOGITS_ROW_ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    stride = -(-max(padded, 1) // per_row) * per_row
    buffer = torch.empty(rows, stride, dtype=dtype, device=device)
    if POISON_LOGITS:
        buffer.fill_(float("nan"))
    return buffer[:, :width]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@public_op(MQA_LOGITS)
def fp8_mqa_logits(q: Any, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   cu_seq_len_k_start: torch.Tensor, cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True,
                   max_seqlen_k: int = 0, logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Indexer logits of M queries against N keys (DeepGEMM `fp8_mqa_logits` / `fp8_fp4_mqa_logits`).

    q: float8_e4m3fn [M, H, D] (or (q, None)); kv: (float8_e4m3fn [N, D], fp32 [N] scales); or FP4
    both: q (int8 [M, H, D/2], int32 [M, H]) and kv (int8 [N, D/2], int32 [N]) (module docstring);
    weights: fp32 [M, H] (bf16 only with bf16 logits); cu_seq_len_k_start / _end: int32 [M] with
    0 <= start[i] <= end[i] <= N; clean_logits: -inf outside each row's keys; max_seqlen_k: 0 for
    [M, N] logits, else the compressed width (>= every end[i] - start[i]; clean_logits False);
    logits_dtype: fp32 or bf16. Returns logits [M, N or max_seqlen_k] (row stride 1024-byte aligned).
    """
    if is_compiling():
        return compiled_call("fp8_mqa_logits", q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                             max_seqlen_k, logits_dtype)
    op = MQA_LOGITS.name
    q, q_scales = unwrap_any_q(op, q, 3)
    fp4 = q_scales is not None
    m, heads, d = q.shape
    if not isinstance(kv, tuple) or len(kv) != 2:
        _fail(op, "kv", describe(kv), "a pair (float8_e4m3fn [N, D], fp32 [N]) (FP4: (int8 [N, D/2], int32 [N]))",
              "quantize the keys per token: deep_gemm.per_custom_dims_cast_to_fp8(k, (0,), False)")
    keys, scales = kv
    key_dtypes, key_name = (FP4_DTYPES, "int8 packed E2M1") if fp4 else ((Q_DTYPE,), "float8_e4m3fn")
    if not isinstance(keys, torch.Tensor) or keys.dtype not in key_dtypes or keys.dim() != 2 or keys.shape[1] != d \
            or not keys.is_contiguous():
        _fail(op, "kv", f"values {describe(keys)}", f"contiguous {key_name} [N, {d}] (q's {'packed ' if fp4 else ''}"
              "head dim: FP4 q takes FP4 keys, FP8 q FP8 keys)", "quantize the keys like q and pass them contiguous")
    n = keys.shape[0]
    scale_dtype = torch.int32 if fp4 else torch.float32
    if not isinstance(scales, torch.Tensor) or scales.dtype != scale_dtype or tuple(scales.shape) != (n,) \
            or not scales.is_contiguous():
        _fail(op, "kv", f"scales {describe(scales)}", f"contiguous {str(scale_dtype)[6:]} [{n}] (one per key)",
              "pass the per-token scales squeezed to [N]")
    for arg, t in (("kv", keys), ("kv", scales)):
        if t.device != q.device:
            _fail(op, arg, f"on {t.device}", f"on {q.device} like q", "move the keys to q's device")
    _check_weights(op, weights, m, heads, logits_dtype, q.device)
    _check_index(op, "cu_seq_len_k_start", cu_seq_len_k_start, (m,), q.device)
    _check_index(op, "cu_seq_len_k_end", cu_seq_len_k_end, (m,), q.device)
    check_bool(op, "clean_logits", clean_logits)
    check_int(op, "max_seqlen_k", max_seqlen_k, 0, fix="pass 0 for [M, N] logits or the compressed width")
    compressed = max_seqlen_k > 0
    if compressed and clean_logits:
        _fail(op, "clean_logits", "True with max_seqlen_k > 0", "False for compressed logits (as DeepGEMM)",
              "pass clean_logits=False; entries past end[i] - start[i] are unspecified")
    if m and checks_values(cu_seq_len_k_start, cu_seq_len_k_end):
        start, end = cu_seq_len_k_start.long(), cu_seq_len_k_end.long()
        bad = (start < 0) | (end < start) | (end > n)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            _fail(op, "cu_seq_len_k_end", f"row {i}: start {int(start[i])}, end {int(end[i])}",
                  f"0 <= start[i] <= end[i] <= N = {n}", "clamp each row's key range to the keys passed")
        if compressed and int((end - start).max()) > max_seqlen_k:
            _fail(op, "max_seqlen_k", repr(max_seqlen_k), f">= the longest row ({int((end - start).max())} keys)",
                  "pass max_seqlen_k=(end - start).max().item()")
    width = max_seqlen_k if compressed else n
    padded = _round_up(max_seqlen_k, PREFILL_BLOCK_KV) if compressed else n + PREFILL_BLOCK_KV
    logits = allocate_logits(m, width, padded, logits_dtype, q.device)
    if clean_logits:
        logits.fill_(float("-inf"))
    if m and width:
        run(MQA_LOGITS, MqaLogitsInputs(q, keys, scales, weights, cu_seq_len_k_start, cu_seq_len_k_end, compressed,
                                        logits, q_scales))
    return logits


def _check_cache(op: str, kv_cache: Any, d: int, device: torch.device, fp4: bool = False) -> tuple[int, int]:
    """d: q's last dim (the head dim, or half of it for packed FP4 q, whose cache has D/2 + 4 bytes)."""
    what = "head dim / 2 of FP4" if fp4 else "head dim"
    try:
        indexer_cache_views(kv_cache)
    except LayoutConversionError as exc:
        _fail(op, "kv_cache", describe(kv_cache), f"a uint8 paged cache [blocks, block_kv, 1, {d} + 4] "
              "(layouts.indexer_cache)", f"build it with layouts.pack_indexer_cache ({exc})")
    if kv_cache.shape[3] != d + INDEXER_SCALE_BYTES:
        _fail(op, "kv_cache", describe(kv_cache), f"{d + INDEXER_SCALE_BYTES} bytes per token ({what} {d} + 4)",
              "use a cache built for q's head dim (FP4 q reads the FP4 cache)")
    if kv_cache.device != device:
        _fail(op, "kv_cache", f"on {kv_cache.device}", f"on {device} like q", "move the cache to q's device")
    return kv_cache.shape[0], kv_cache.shape[1]


@public_op(PAGED_MQA_LOGITS)
def fp8_paged_mqa_logits(q: Any, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
                         indices: torch.Tensor | None = None) -> torch.Tensor:
    """Indexer logits of B·next_n queries against their sequences' paged keys (DeepGEMM
    `fp8_paged_mqa_logits` / `fp8_fp4_paged_mqa_logits`).

    q: float8_e4m3fn [B, next_n, H, D] (or (q, None)); kv_cache: uint8 [blocks, block_kv, 1, D + 4];
    or FP4 both: q (int8 [B, next_n, H, D/2], int32 [B, next_n, H]) and the FP4 cache [.., D/2 + 4];
    weights: fp32 [B·next_n, H]; context_lens: int32 [B, next_n] (row b·next_n + t sees keys
    j < context_lens[b, t] <= max_context_len); block_table: int32 [B, max_blocks], stride(1) == 1,
    entries < blocks for every block in use; schedule_meta: from get_paged_mqa_logits_metadata;
    clean_logits: -inf past each row's keys (DeepGEMM refuses it with 2-D context_lens; provided
    here); indices: None or int32 [B] (DeepGEMM's varlen hint: row i's sequence; checked, no effect
    on the math). Returns logits [B·next_n, max_context_len] (row stride 1024-byte aligned).
    """
    if is_compiling():
        return compiled_call("fp8_paged_mqa_logits", q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, clean_logits, logits_dtype, indices)
    op = PAGED_MQA_LOGITS.name
    q, q_scales = unwrap_any_q(op, q, 4)
    batch, next_n, heads, d = q.shape
    num_blocks, block_kv = _check_cache(op, kv_cache, d, q.device, q_scales is not None)
    _check_weights(op, weights, batch * next_n, heads, logits_dtype, q.device)
    _check_index(op, "context_lens", context_lens, (batch, next_n), q.device)
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != INDEX_DTYPE or block_table.dim() != 2 \
            or block_table.shape[0] != batch or block_table.stride(1) != 1:
        _fail(op, "block_table", describe(block_table), f"int32 [{batch}, max_blocks] with stride(1) == 1",
              "pass one row of cache block ids per sequence")
    if not isinstance(schedule_meta, torch.Tensor) or schedule_meta.dtype != INDEX_DTYPE \
            or schedule_meta.dim() != 2 or schedule_meta.shape[0] < 2 or schedule_meta.shape[1] != 2:
        _fail(op, "schedule_meta", describe(schedule_meta), "int32 [num_sms + 1, 2]",
              "pass get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)")
    check_int(op, "max_context_len", max_context_len, 0, fix="pass the logits width (>= every context length)")
    check_bool(op, "clean_logits", clean_logits)
    if indices is not None:
        _check_index(op, "indices", indices, (batch,), q.device)
    if batch and checks_values(context_lens, block_table):
        lens = context_lens.long()
        if int(lens.min()) < 0 or int(lens.max()) > max_context_len:
            _fail(op, "context_lens", f"values in [{int(lens.min())}, {int(lens.max())}]",
                  f"values in [0, max_context_len = {max_context_len}]", "pass a max_context_len >= every length")
        used = -(-lens.amax(dim=1) // block_kv)
        if int(used.max()) > block_table.shape[1]:
            _fail(op, "block_table", f"{block_table.shape[1]} columns", f">= {int(used.max())} (the longest "
                  "sequence's blocks)", "allocate a wider block table")
        in_use = torch.arange(block_table.shape[1], device=q.device)[None, :] < used[:, None]
        bad = in_use & ((block_table < 0) | (block_table >= num_blocks))
        if bool(bad.any()):
            b, col = (int(v) for v in bad.nonzero()[0])
            _fail(op, "block_table", f"entry [{b}, {col}] = {int(block_table[b, col])}",
                  f"a block id in [0, {num_blocks}) for every block in use", "point each used entry at a cache block")
    if indices is not None and batch and checks_values(indices) and bool(((indices < 0) | (indices >= batch)).any()):
        _fail(op, "indices", f"values in [{int(indices.min())}, {int(indices.max())}]", f"values in [0, {batch})",
              "pass each row's sequence index")
    logits = allocate_logits(batch * next_n, max_context_len, _round_up(max_context_len, PAGED_SPLIT_KV),
                             logits_dtype, q.device)
    if clean_logits:
        logits.fill_(float("-inf"))
    if batch and max_context_len:
        run(PAGED_MQA_LOGITS, PagedMqaLogitsInputs(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                                                   logits, q_scales))
    return logits


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """The paged call's schedule: int32 [num_sms + 1, 2]; row s = (sequence, first block) where
    worker s starts, the key blocks of all sequences (each sequence's longest row) split evenly in
    order; row num_sms = (B, 0). DeepGEMM computes its own split of the same work; the portable
    providers may use this one to divide theirs, and none reads beyond its shape otherwise.
    context_lens: int32 [B, next_n] (2-D, as DeepGEMM); indices: None or int32 [B] (checked only)."""
    op = "get_paged_mqa_logits_metadata"
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != INDEX_DTYPE or context_lens.dim() != 2 \
            or not context_lens.is_contiguous():
        _fail(op, "context_lens", describe(context_lens), "a contiguous int32 tensor [B, next_n]",
              "pass the per-query context lengths as torch.int32 [batch, next_n]")
    check_int(op, "block_kv", block_kv, 1, fix="pass the cache's tokens per block (kv_cache.shape[1])")
    check_int(op, "num_sms", num_sms, 1, fix="pass deep_gemm.get_num_sms()")
    if indices is not None:
        _check_index(op, "indices", indices, (context_lens.shape[0],), context_lens.device)
    blocks = (-(-context_lens.long().amax(dim=1) // block_kv)).clamp(min=0) if context_lens.numel() else \
        torch.zeros(context_lens.shape[0], dtype=torch.long, device=context_lens.device)
    ends = torch.cumsum(blocks, 0)
    total = int(ends[-1]) if ends.numel() else 0
    starts = torch.arange(num_sms + 1, device=context_lens.device, dtype=torch.long) * total // num_sms
    seq = torch.searchsorted(ends, starts, right=True)
    before = torch.where(seq > 0, ends[(seq - 1).clamp(min=0)], 0) if ends.numel() else torch.zeros_like(starts)
    meta = torch.stack((seq, starts - before), dim=1)
    meta[-1] = torch.tensor([context_lens.shape[0], 0], device=meta.device)
    return meta.to(INDEX_DTYPE)


__all__ = ["fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata", "mqa_logits_reference",
           "paged_mqa_logits_reference", "MQA_LOGITS", "PAGED_MQA_LOGITS", "MqaLogitsInputs", "PagedMqaLogitsInputs"]
