"""MLA decode over a paged KV cache (FlashMLA names and argument order).

`get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...)` returns the selected
backend's scheduling data as an opaque `MlaMetadata`; `flash_mla_with_kvcache(q, k_cache, ...)`
returns `(out, lse)`. Contract: V is the first `head_dim_v` (= 512) channels of K; query i of a
sequence with s_k keys sees keys 0..s_k-1, or with `causal` only keys <= s_k - s_q + i (bottom-right
aligned); with `indices` (sparse) it sees exactly the listed cache slots (-1 = none). A query with no
visible key gives out 0 and lse +inf. The rule kept here: every argument, data-dependent values
included (on CPU tensors), is checked before any kernel runs, and the reference reads only valid
cache slots, so NaN in unused slots or huge numbers in unused block_table entries never show.
NaN/Inf in q or in valid cache slots are not checked (that would cost a pass over the data); they
reach the outputs of the queries that see them.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import torch

from ...core.checks import check_bool, check_device, check_int, check_tensor, is_int
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import plan_for, run_plan
from ...core.errors import ContractError, format_problem
from ...layouts.constants import KV_FP8_BYTES_PER_TOKEN, KV_HEAD_DIM, KV_LATENT_DIM
from ...layouts.kv_cache import FLASHMLA_FP8_KV, KVCacheFormat, dequantize_fp8_kv_cache
from ...layouts.kv_cache_model1 import (FLASHMLA_MODEL1_FP8_KV, MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM,
                                        model1_cache_problem)
from ...core.kv_cache import PreparedKVCache, cache_bytes, cache_format_for, convert_cache_in_call
from ...core.registry import forced_key, use_backend
from ...core.providers import Inputs
from ...core.tensors import describe

#: V channels: the 512 latent channels of K
HEAD_DIM_V = KV_LATENT_DIM
#: head dims of q and a bf16 cache: 576 (512 latent + 64 RoPE) or 512 (latent only)
QK_HEAD_DIMS = (KV_HEAD_DIM, KV_LATENT_DIM)
#: the sparse `indices` marker for "no key here"
INVALID_INDEX = -1
INDEX_DTYPE = torch.int32
Q_DTYPE = torch.bfloat16
#: q (and a dense cache of the same dtype) may be bf16 or fp16; out has q's dtype. The FP8 cache
#: stores RoPE as bf16, so it takes bf16 q only (as FlashMLA's sparse kernels).
Q_DTYPES = (torch.bfloat16, torch.float16)
OUT_DTYPE = torch.bfloat16
#: dtype of attn_sink (one logit per query head)
SINK_DTYPE = torch.float32
LSE_DTYPE = torch.float32
#: the FP8 cache (656-byte tokens) holds one KV head
FP8_KV_HEADS = 1
#: the reference gathers at most this many KV elements at once, chunking the batch beyond it
REFERENCE_CHUNK_ELEMENTS = 1 << 25

#: published FlashMLA bounds (dense decode): |out - ref| <= OUT_ABS + OUT_REL·|ref|; lse likewise
OUT_ABS_TOL = 8e-4
OUT_REL_TOL = 2.01 / 128
LSE_ABS_TOL = 1e-6
LSE_REL_TOL = 8.01 / 65536


# -- reference math ------------------------------------------------------------------------------

def _gather_tokens(k_cache: torch.Tensor, blocks: torch.Tensor, offsets: torch.Tensor, is_fp8_kvcache: bool,
                   dtype: torch.dtype) -> torch.Tensor:
    """Cache tokens at (blocks, offsets) -> [..., h_kv, d] in `dtype` (FP8 tokens dequantized)."""
    if is_fp8_kvcache and k_cache.shape[-1] == MODEL1_BYTES_PER_TOKEN:  # MODEL1: a token's bytes are per page
        return FLASHMLA_MODEL1_FP8_KV.tokens(k_cache, blocks, offsets, torch.float32).to(dtype)
    tokens = k_cache[blocks, offsets]
    if is_fp8_kvcache:
        tokens = dequantize_fp8_kv_cache(tokens, torch.float32)
    return tokens.to(dtype)


def _softmax_out(logits: torch.Tensor, visible: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax weights and lse; a row with nothing visible gets weights 0 and lse +inf."""
    logits = logits.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(logits, dim=dim, keepdim=True)
    lse = lse.masked_fill(torch.isneginf(lse), math.inf)
    return torch.exp(logits - lse), lse.squeeze(dim)


def _dense_reference(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, is_fp8_kvcache,
                     dtype) -> tuple[torch.Tensor, torch.Tensor]:
    b, s_q, h_q, d = q.shape
    block_size, h_kv = k_cache.shape[1], k_cache.shape[2]
    seqlens = cache_seqlens.long()
    s_max = int(seqlens.max()) if b else 0
    pos = torch.arange(s_max, device=q.device)
    valid = pos < seqlens[:, None]                                              # [b, S]
    # invalid positions read slot (0, 0), then their values are replaced (NaN must not leak)
    blocks = torch.where(valid, block_table[:, pos // block_size].long(), 0)
    offsets = torch.where(valid, pos % block_size, 0)
    kv = _gather_tokens(k_cache, blocks, offsets, is_fp8_kvcache, dtype)        # [b, S, h_kv, d]
    kv = torch.where(valid[:, :, None, None], kv, 0)
    qg = q.to(dtype).view(b, s_q, h_kv, h_q // h_kv, d)
    logits = torch.einsum("bqhgd,bshd->bhgqs", qg, kv) * softmax_scale          # [b, h_kv, g, s_q, S]
    visible = valid[:, None, :]                                                 # [b, 1 or s_q, S]
    if causal:
        last = seqlens[:, None] - s_q + torch.arange(s_q, device=q.device)      # [b, s_q]
        visible = visible & (pos <= last[:, :, None])
    weights, lse = _softmax_out(logits, visible[:, None, None])
    out = torch.einsum("bhgqs,bshv->bqhgv", weights, kv[..., :head_dim_v])
    return out.reshape(b, s_q, h_q, head_dim_v), lse.reshape(b, h_q, s_q)


def _sparse_reference(q, k_cache, indices, head_dim_v, softmax_scale, is_fp8_kvcache,
                      dtype) -> tuple[torch.Tensor, torch.Tensor]:
    block_size = k_cache.shape[1]
    valid = indices != INVALID_INDEX                                            # [b, s_q, topk]
    slots = torch.where(valid, indices.long(), 0)
    kv = _gather_tokens(k_cache, slots // block_size, slots % block_size, is_fp8_kvcache, dtype)
    kv = torch.where(valid[..., None, None], kv, 0)[..., 0, :]                  # [b, s_q, topk, d]
    logits = torch.einsum("bqhd,bqkd->bqhk", q.to(dtype), kv) * softmax_scale   # [b, s_q, h_q, topk]
    weights, lse = _softmax_out(logits, valid[:, :, None, :])
    out = torch.einsum("bqhk,bqkv->bqhv", weights, kv[..., :head_dim_v])
    return out, lse.transpose(1, 2)


def mla_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
                         cache_seqlens: torch.Tensor | None, head_dim_v: int, softmax_scale: float,
                         causal: bool = False, is_fp8_kvcache: bool = False, indices: torch.Tensor | None = None,
                         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference math in `dtype`: gather the visible keys (FP8 tokens dequantized), logits = q·Kᵀ·scale,
    lse = logsumexp, out = exp(logits - lse) @ V. Returns (out [b, s_q, h_q, head_dim_v], lse
    [b, h_q, s_q]), both in `dtype`. Inputs must satisfy the contract (flash_mla_with_kvcache checks it).

    The batch is processed in one vectorized pass, split into batch chunks only when the gathered
    KV would exceed REFERENCE_CHUNK_ELEMENTS.
    """
    b, s_q, h_q, _ = q.shape
    if indices is not None:
        per_sequence = s_q * indices.shape[-1] * k_cache.shape[-1]
    else:
        s_max = int(cache_seqlens.max()) if b else 0
        per_sequence = s_max * k_cache.shape[2] * k_cache.shape[-1]
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, per_sequence))
    outs, lses = [], []
    for start in range(0, max(b, 1), chunk):
        rows = slice(start, start + chunk)
        if indices is not None:
            out, lse = _sparse_reference(q[rows], k_cache, indices[rows], head_dim_v, softmax_scale,
                                         is_fp8_kvcache, dtype)
        else:
            out, lse = _dense_reference(q[rows], k_cache, block_table[rows], cache_seqlens[rows], head_dim_v,
                                        softmax_scale, causal, is_fp8_kvcache, dtype)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def mla_metadata_reference(cache_seqlens: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """What a backend without a tile scheduler returns: no scheduling tensors, and num_splits int32
    [b + 1] = 0, 1, ..., b (one split per sequence, prefix-summed as FlashMLA lays num_splits out)."""
    return (), torch.arange(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=cache_seqlens.device)


@attrs.frozen
class MlaMetadataInputs(Inputs):
    """One get_mla_metadata call (validated). A provider returns (scheduling tensors tuple, num_splits)."""

    cache_seqlens: torch.Tensor
    num_q_tokens_per_head_k: int
    num_heads_k: int
    num_heads_q: int | None
    is_fp8_kvcache: bool
    topk: int | None
    device_field = "cache_seqlens"

    def dims(self) -> dict[str, int]:
        return {"b": self.cache_seqlens.shape[0], "s_q_h": self.num_q_tokens_per_head_k, "h_kv": self.num_heads_k}


@attrs.frozen
class MlaDecodeInputs(Inputs):
    """One flash_mla_with_kvcache call (validated, outputs allocated): q bf16 [b, s_q, h_q, d];
    k_cache bf16 [blocks, block_size, h_kv, d] or uint8 [blocks, block_size, 1, 656] (or MODEL1 pages
    [blocks, block_size, 1, 584], d = 512: read by page, layouts/kv_cache_model1.py); block_table,
    cache_seqlens (None allowed with indices); indices None or int32 [b, s_q, topk];
    tile_scheduler_metadata: the MlaMetadata of this backend (its `.tensors` are the backend's own);
    num_splits: its num_splits; out bf16 [b, s_q, h_q, 512] and lse fp32 [b, h_q, s_q] to write;
    k_cache_format: the byte order of an FP8 cache's rows (the selected backend's
    `kv_cache_format`, already converted: providers read it as is), None for a bf16 cache."""

    q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor | None
    cache_seqlens: torch.Tensor | None
    head_dim_v: int
    softmax_scale: float
    causal: bool
    is_fp8_kvcache: bool
    indices: torch.Tensor | None
    tile_scheduler_metadata: Any
    num_splits: torch.Tensor | None
    out: torch.Tensor
    lse: torch.Tensor
    k_cache_format: KVCacheFormat | None = None
    device_field = "q"

    def dims(self) -> dict[str, int]:
        b, s_q, h_q, d = self.q.shape
        dims = {"b": b, "s_q": s_q, "h_q": h_q, "d": d, "h_kv": self.k_cache.shape[2],
                "block_size": self.k_cache.shape[1]}
        if self.indices is not None:
            dims["topk"] = self.indices.shape[-1]
        return dims


def get_mla_metadata_kernel(call: MlaMetadataInputs) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Reference kernel of get_mla_metadata: no tile scheduler (mla_metadata_reference)."""
    return mla_metadata_reference(call.cache_seqlens)


def flash_mla_with_kvcache_kernel(call: MlaDecodeInputs) -> None:
    """Reference kernel of flash_mla_with_kvcache: the contract math in fp32, written into out and lse
    (the scheduling arguments are unused)."""
    reject_bad_cache_references(call)
    if call.out.numel() == 0:
        return
    k_cache, fp8_rows = call.k_cache, call.is_fp8_kvcache
    fmt = call.k_cache_format
    if fmt is not None and fmt.holds_values:
        fp8_rows = False  # the rows are the FP8 cache's values already (exact): read them as such
    elif fmt is not None and fmt is not FLASHMLA_FP8_KV:
        k_cache = fmt.decode(k_cache)  # the oracle reads the logical rows
    o, s = mla_decode_reference(call.q, k_cache, call.block_table, call.cache_seqlens, call.head_dim_v,
                                call.softmax_scale, call.causal, fp8_rows, call.indices, dtype=torch.float32)
    call.out.copy_(o)
    call.lse.copy_(s)


GET_MLA_METADATA = register_contract(OpContract(
    "get_mla_metadata", mla_metadata_reference, Tolerance(0.0), (), get_mla_metadata_kernel))
FLASH_MLA_WITH_KVCACHE = register_contract(OpContract(
    "flash_mla_with_kvcache", mla_decode_reference, Tolerance(dequantized=5e-6, unquantized=2e-3), (),
    flash_mla_with_kvcache_kernel, cache_args=("k_cache", "extra_k_cache")))


# -- the metadata value ----------------------------------------------------------------------------

@attrs.frozen(eq=False)
class MlaMetadata:
    """Scheduling data of one backend for one decode configuration (FlashMLA's tile_scheduler_metadata).

    backend:  the backend that computed it; flash_mla_with_kvcache refuses it on another backend
    tensors:  the backend's own scheduling tensors (opaque; empty on cpu)
    num_splits: the second value get_mla_metadata returned (opaque; None if the backend has none)
    the rest: the configuration it was computed for, checked against each call that uses it.
    The values of cache_seqlens are not checked on reuse (that would cost a pass): reuse a metadata
    only while the batch's sequence lengths are the ones it was computed from, as FlashMLA requires.
    """

    backend: str
    batch_size: int
    num_q_tokens_per_head_k: int
    num_heads_k: int
    num_heads_q: int | None
    is_fp8_kvcache: bool
    topk: int | None
    tensors: tuple[torch.Tensor, ...] = ()
    num_splits: torch.Tensor | None = None

    @property
    def signature(self) -> tuple:
        """What run-time selection keys on: the backend that computed it."""
        return ("mla-metadata", self.backend)


# -- validation --------------------------------------------------------------------------------------

def _check_cache_seqlens(op: str, cache_seqlens: Any, batch: int | None) -> None:
    check_tensor(op, "cache_seqlens", cache_seqlens, (INDEX_DTYPE,), (None,), None,
                  "pass the number of cached tokens of each sequence as int32 [b]")
    if batch is not None and cache_seqlens.shape[0] != batch:
        raise ContractError(format_problem(op, "cache_seqlens", f"of shape {tuple(cache_seqlens.shape)}",
                                           f"[b] = [{batch}] like q", "pass one length per sequence of q"))


def _check_dense_paging(op: str, k_cache: torch.Tensor, block_table: torch.Tensor,
                        cache_seqlens: torch.Tensor) -> None:
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    max_blocks = block_table.shape[1]
    capacity = max_blocks * block_size
    bad = (cache_seqlens < 0) | (cache_seqlens > capacity)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ContractError(format_problem(
            op, "cache_seqlens", f"{int(cache_seqlens[i])} for sequence {i}",
            f"0 <= length <= max_blocks·block_size = {max_blocks}·{block_size} = {capacity}",
            "widen block_table or shorten the sequence"))
    blocks_used = (cache_seqlens.long()[:, None] + block_size - 1) // block_size
    used = torch.arange(max_blocks, device=block_table.device) < blocks_used
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise ContractError(format_problem(
            op, "block_table", f"{int(block_table[i, j])} at [{i}, {j}] (a block sequence {i} uses)",
            f"a block index in [0, num_blocks = {num_blocks})",
            "point every used block_table entry at a cache block (unused entries may hold anything)"))


def _check_indices_values(op: str, indices: torch.Tensor, k_cache: torch.Tensor) -> None:
    total = k_cache.shape[0] * k_cache.shape[1]
    bad = (indices < INVALID_INDEX) | (indices >= total)
    if bool(bad.any()):
        at = tuple(int(v) for v in bad.nonzero()[0])
        raise ContractError(format_problem(
            op, "indices", f"{int(indices[at])} at {list(at)}",
            f"-1 or a slot in [0, num_blocks·block_size = {total})",
            "use block·block_size + offset for valid keys and -1 for none"))


def reject_bad_cache_references(call: "MlaDecodeInputs") -> None:
    """Raise the contract's ContractError for cache references out of range — lengths beyond the
    block table, used block_table entries outside the cache, sparse indices outside it — where
    values may be read (see checks_values). These checks read the index tensors, so they run in
    the provider's own pass: every provider calls this (or finds a bad reference itself and then
    calls this for the message) before it reads the cache, and never reads out of bounds."""
    op = FLASH_MLA_WITH_KVCACHE.name
    if call.indices is not None:
        if checks_values(call.indices):
            _check_indices_values(op, call.indices, call.k_cache)
    elif checks_values(call.cache_seqlens):
        _check_dense_paging(op, call.k_cache, call.block_table, call.cache_seqlens)


def _check_indices(op: str, indices: Any, k_cache: torch.Tensor, b: int, s_q: int, is_fp8_kvcache: bool,
                   causal: bool) -> None:
    if not isinstance(indices, torch.Tensor) or indices.dtype != INDEX_DTYPE or indices.dim() != 3:
        raise ContractError(format_problem(op, "indices", describe(indices), "None or an int32 [b, s_q, topk] tensor",
                                           "pass absolute cache slots block·block_size + offset, -1 for none"))
    if tuple(indices.shape[:2]) != (b, s_q) or indices.shape[2] < 1:
        raise ContractError(format_problem(op, "indices", f"of shape {tuple(indices.shape)}",
                                           f"[b, s_q, topk] = [{b}, {s_q}, topk >= 1]",
                                           "give every query token its own row of topk slots"))
    if not is_fp8_kvcache:
        raise ContractError(format_problem(op, "indices", "given with a bf16 cache",
                                           "sparse decode over the FP8 (656-byte) cache",
                                           "pack the cache with pack_fp8_kv_cache and pass is_fp8_kvcache=True, "
                                           "or pass indices=None for dense decode"))
    if causal:
        raise ContractError(format_problem(op, "causal", "True with indices (sparse decode)", "causal=False",
                                           "encode visibility in indices (-1 for hidden keys) and pass causal=False"))


def _check_cache(op: str, q: torch.Tensor, k_cache: Any, is_fp8_kvcache: bool, arg: str = "k_cache",
                 cache_format: KVCacheFormat | None = None) -> None:
    d, h_q = q.shape[3], q.shape[2]
    if cache_format is not None and cache_format.holds_values:  # an FP8 cache stored as its exact values
        problem = cache_format.check(k_cache)
        if problem is not None or not is_fp8_kvcache or q.dtype != Q_DTYPE or d != KV_HEAD_DIM:
            raise ContractError(format_problem(op, arg, f"a {cache_format.name} cache ({problem or 'rows ok'}) with "
                                               f"is_fp8_kvcache={is_fp8_kvcache}, q {q.dtype} of head dim {d}",
                                               f"its rows [num_blocks, block_size, 1, {cache_format.width}], "
                                               f"is_fp8_kvcache=True, bf16 q of head dim {KV_HEAD_DIM}",
                                               "pass the PreparedKVCache that allocate_kv_cache or prepare_inputs "
                                               "returned, as for the 656-byte cache"))
        return
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4 or k_cache.dtype not in (q.dtype, torch.uint8):
        raise ContractError(format_problem(op, arg, describe(k_cache),
                                           f"a 4-D [num_blocks, block_size, h_kv, d] tensor of q's dtype {q.dtype}, "
                                           f"or uint8 / float8_e4m3fn [num_blocks, block_size, 1, "
                                           f"{KV_FP8_BYTES_PER_TOKEN}] for the FP8 cache",
                                           "allocate the paged cache in one of those forms"))
    if is_fp8_kvcache and q.dtype != Q_DTYPE:
        raise ContractError(format_problem(op, "q", f"{q.dtype} with the FP8 cache", "bf16 q",
                                           "the FP8 cache stores RoPE as bf16 (FlashMLA's FP8 kernels take bf16 q); "
                                           "pass q.to(torch.bfloat16)"))
    if (k_cache.dtype == torch.uint8) != is_fp8_kvcache:
        given = f"{is_fp8_kvcache} with a {k_cache.dtype} cache"
        raise ContractError(format_problem(op, "is_fp8_kvcache", given, f"{not is_fp8_kvcache} for this cache",
                                           "pass is_fp8_kvcache=True exactly when k_cache is the uint8 FP8 cache"))
    if is_fp8_kvcache:
        want = (f"[num_blocks, block_size, {FP8_KV_HEADS}, {KV_FP8_BYTES_PER_TOKEN}] (V3.2 rows, d = {KV_HEAD_DIM}) "
                f"or [num_blocks, block_size, {FP8_KV_HEADS}, {MODEL1_BYTES_PER_TOKEN}] (MODEL1 pages, d = "
                f"{MODEL1_HEAD_DIM})")
        if k_cache.shape[2] != FP8_KV_HEADS or k_cache.shape[3] not in (KV_FP8_BYTES_PER_TOKEN, MODEL1_BYTES_PER_TOKEN):
            raise ContractError(format_problem(op, arg, f"uint8 of shape {tuple(k_cache.shape)}", want,
                                               "pack tokens with layouts.pack_fp8_kv_cache (V3.2) or "
                                               "layouts.pack_model1_kv_cache / flash_mla.quantize_k_cache (MODEL1)"))
        model1 = k_cache.shape[3] == MODEL1_BYTES_PER_TOKEN
        if model1 and d != MODEL1_HEAD_DIM:
            raise ContractError(format_problem(op, "q", f"of head dim {d}", f"{MODEL1_HEAD_DIM} for the MODEL1 cache",
                                               f"the {MODEL1_BYTES_PER_TOKEN}-byte MODEL1 cache holds 448 NoPE + 64 "
                                               f"RoPE channels; pass q with {MODEL1_HEAD_DIM}"))
        if not model1 and d != KV_HEAD_DIM:
            raise ContractError(format_problem(op, "q", f"of head dim {d}", f"{KV_HEAD_DIM} for the FP8 cache",
                                               "the 656-byte cache holds 512 latent + 64 RoPE channels; "
                                               "pass q with 576"))
        problem = model1_cache_problem(k_cache) if model1 else None
        if problem is not None:
            raise ContractError(format_problem(op, arg, f"MODEL1 pages with strides {k_cache.stride()}",
                                               "each page's block_size·584 bytes contiguous", problem))
    elif k_cache.shape[3] != d:
        raise ContractError(format_problem(op, "k_cache", f"of head dim {k_cache.shape[3]}", f"q's head dim {d}",
                                           "pass q and k_cache with the same head dim (576 or 512)"))
    h_kv = k_cache.shape[2]
    if h_kv < 1 or h_q % h_kv:
        raise ContractError(format_problem(op, "k_cache", f"with h_kv = {h_kv} heads", f"a divisor of h_q = {h_q}",
                                           "pass q with h_q a multiple of the cache's KV heads"))
    if k_cache.shape[1] < 1:
        raise ContractError(format_problem(op, "k_cache", f"with block_size {k_cache.shape[1]}", "block_size >= 1",
                                           "allocate pages of at least one token (64 on NVIDIA)"))
    if k_cache.stride(-1) != 1:
        raise ContractError(format_problem(op, "k_cache", f"with strides {k_cache.stride()}",
                                           "contiguous channels (stride(-1) == 1)",
                                           "store each token's channels contiguously"))


def _check_metadata(op: str, meta: Any, num_splits: Any, b: int, s_q: int, h_q: int, h_kv: int,
                    is_fp8_kvcache: bool, topk: int | None) -> MlaMetadata:
    if not isinstance(meta, MlaMetadata):
        raise ContractError(format_problem(op, "tile_scheduler_metadata", describe(meta),
                                           "the MlaMetadata returned by portable_kernels.get_mla_metadata",
                                           "call get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv, ...) "
                                           "from portable_kernels (not from flash_mla)"))
    want = {"batch_size": b, "num_q_tokens_per_head_k": s_q * h_q // h_kv, "num_heads_k": h_kv,
            "is_fp8_kvcache": is_fp8_kvcache, "topk": topk}
    if meta.num_heads_q is not None:
        want["num_heads_q"] = h_q
    for field, value in want.items():
        if getattr(meta, field) != value:
            raise ContractError(format_problem(
                op, "tile_scheduler_metadata", f"computed for {field}={getattr(meta, field)!r}",
                f"{field}={value!r} for this call",
                "call get_mla_metadata with this call's cache_seqlens, s_q * h_q // h_kv, h_kv, h_q, "
                "is_fp8_kvcache and topk"))
    if num_splits is not None and num_splits is not meta.num_splits:
        raise ContractError(format_problem(op, "num_splits", describe(num_splits),
                                           "None or the num_splits returned with tile_scheduler_metadata",
                                           "pass both values of the same get_mla_metadata call"))
    return meta


def _check_output(op: str, arg: str, value: Any, dtype: torch.dtype, shape: tuple[int, ...],
                  device: torch.device) -> None:
    if value is None:
        return
    if not isinstance(value, torch.Tensor) or value.dtype != dtype or tuple(value.shape) != shape:
        raise ContractError(format_problem(op, arg, describe(value), f"None or a {dtype} tensor of shape {list(shape)}",
                                           f"allocate {arg} = torch.empty({list(shape)}, dtype={dtype})"))
    if not value.is_contiguous():
        raise ContractError(format_problem(op, arg, f"non-contiguous (strides {value.stride()})", "contiguous",
                                           "pass a contiguous buffer"))
    check_device(op, arg, value, device, like="q")


# -- public ops ---------------------------------------------------------------------------------------

@public_op(GET_MLA_METADATA)
def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                     num_heads_q: int | None = None, is_fp8_kvcache: bool = False,
                     topk: int | None = None) -> tuple[MlaMetadata, torch.Tensor | None]:
    """Scheduling data for flash_mla_with_kvcache, computed by the backend the call selects.

    cache_seqlens: int32 [b]; num_q_tokens_per_head_k: s_q * h_q // h_kv; num_heads_k: h_kv;
    num_heads_q: h_q (required for sparse decode); is_fp8_kvcache: the cache is an FP8 one (656-byte rows or MODEL1 pages);
    topk: indices.shape[-1] for sparse decode, None for dense.
    Returns (tile_scheduler_metadata: MlaMetadata, num_splits: opaque tensor or None); pass both on.
    """
    if is_compiling():
        return compiled_call("get_mla_metadata", cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                             is_fp8_kvcache, topk)
    op = GET_MLA_METADATA.name
    _check_cache_seqlens(op, cache_seqlens, None)
    check_int(op, "num_q_tokens_per_head_k", num_q_tokens_per_head_k, 1, fix="pass s_q * h_q // h_kv")
    check_int(op, "num_heads_k", num_heads_k, 1, fix="pass the cache's KV heads (1 for MLA)")
    check_bool(op, "is_fp8_kvcache", is_fp8_kvcache)
    if num_heads_q is not None:
        check_int(op, "num_heads_q", num_heads_q, 1, fix="pass q's heads or None")
        if num_heads_q % num_heads_k or num_q_tokens_per_head_k % (num_heads_q // num_heads_k):
            raise ContractError(format_problem(
                op, "num_heads_q", f"{num_heads_q} with num_heads_k={num_heads_k} and "
                f"num_q_tokens_per_head_k={num_q_tokens_per_head_k}",
                "a multiple of num_heads_k with num_q_tokens_per_head_k = s_q * num_heads_q // num_heads_k",
                "pass h_q, h_kv and s_q * h_q // h_kv of the same call"))
    if topk is not None:
        check_int(op, "topk", topk, 1, fix="pass indices.shape[-1], or None for dense decode")
        if num_heads_q is None or not is_fp8_kvcache:
            raise ContractError(format_problem(
                op, "topk", f"{topk} with num_heads_q={num_heads_q}, is_fp8_kvcache={is_fp8_kvcache}",
                "sparse decode: num_heads_q given and is_fp8_kvcache=True",
                "pass num_heads_q=h_q and is_fp8_kvcache=True with topk"))
    inputs = MlaMetadataInputs(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, is_fp8_kvcache, topk)
    plan = plan_for(GET_MLA_METADATA, inputs)
    tensors, num_splits = run_plan(plan, inputs)
    meta = MlaMetadata(plan.backend, int(cache_seqlens.shape[0]), num_q_tokens_per_head_k, num_heads_k, num_heads_q,
                       is_fp8_kvcache, topk, tuple(tensors), num_splits)
    return meta, num_splits


@public_op(FLASH_MLA_WITH_KVCACHE)
def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor | None,
                           cache_seqlens: torch.Tensor | None, head_dim_v: int, tile_scheduler_metadata: MlaMetadata,
                           num_splits: torch.Tensor | None = None, softmax_scale: float | None = None,
                           causal: bool = False, is_fp8_kvcache: bool = False, indices: torch.Tensor | None = None,
                           attn_sink: torch.Tensor | None = None, extra_k_cache: torch.Tensor | None = None,
                           extra_indices_in_kvcache: torch.Tensor | None = None,
                           topk_length: torch.Tensor | None = None, extra_topk_length: torch.Tensor | None = None,
                           *, out: torch.Tensor | None = None,
                           lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode attention over a paged KV cache.

    q:             bf16 (or fp16 for a dense cache) [b, s_q, h_q, d], d = 576 (512 latent + 64 RoPE) or 512
    k_cache:       [num_blocks, block_size, h_kv, d] of q's dtype (h_q a multiple of h_kv), or with
                   is_fp8_kvcache uint8 (or the same bytes as float8_e4m3fn) [num_blocks, block_size, 1, 656]
                   (layouts.pack_fp8_kv_cache; d = 576) in FlashMLA's row order, or FlashMLA's MODEL1
                   pages [num_blocks, block_size, 1, 584] (layouts.pack_model1_kv_cache; d = 512, V = all
                   512 channels; stride(1) = 584, any page stride >= block_size·584), or a PreparedKVCache
                   (prepare_inputs(flash_mla_with_kvcache, k_cache=...), allocate_kv_cache) whose rows
                   are in its backend's order; a cache in another order than the selected backend's
                   is converted in the call (whole cache, counted by implicit_conversions())
    block_table:   int32 [b, max_blocks]; token t of sequence i is at slot (block_table[i, t // block_size],
                   t % block_size); entries past a sequence's blocks are never read (None allowed with indices)
    cache_seqlens: int32 [b], 0 <= s_k <= max_blocks·block_size (None allowed with indices)
    head_dim_v:    512; V = the first 512 channels of K
    tile_scheduler_metadata, num_splits: the two values of get_mla_metadata (num_splits may be None)
    softmax_scale: float, default d ** -0.5
    causal:        bottom-right mask: query i sees keys <= s_k - s_q + i (not with indices)
    indices:       None, or int32 [b, s_q, topk] absolute slots block·block_size + offset, -1 = none;
                   requires the FP8 cache (sparse decode); block_table and cache_seqlens are then unused
                   (their dtype and shape are still checked when given)
    Sparse decode only (FlashMLA's extensions, run by this op around the providers' decode):
    attn_sink:     None or fp32 [h_q]: out is scaled by exp(lse) / (exp(lse) + exp(attn_sink[h])) (lse unchanged;
                   +inf makes out 0)
    topk_length:   None or int32 [b], 0..topk: only indices[i, :, :topk_length[i]] are attended
    extra_k_cache, extra_indices_in_kvcache: a second FP8 cache (its own block size) and int32 [b, s_q, extra_topk]
                   slots in it, attended together with the first (one softmax over both); extra_topk_length
                   limits them like topk_length
    out, lse:      optional preallocated outputs (an extension of FlashMLA's call, e.g. for CUDA graphs)
    Returns (out [b, s_q, h_q, 512] of q's dtype, lse fp32 [b, h_q, s_q]); no visible key: out 0, lse +inf.
    On CPU tensors the data-dependent checks (lengths, used block_table entries, indices range) run
    before the kernel; on accelerators they would need a device sync and are left to the kernel.
    """
    if is_compiling():
        if isinstance(k_cache, PreparedKVCache) or isinstance(extra_k_cache, PreparedKVCache):
            raise ContractError(format_problem("flash_mla_with_kvcache", "k_cache", repr(k_cache),
                                               "a plain tensor under torch.compile",
                                               "pass the cache's bytes (FlashMLA's order) when compiling"))
        return compiled_call("flash_mla_with_kvcache", q, k_cache, block_table, cache_seqlens, head_dim_v,
                             tile_scheduler_metadata, num_splits, softmax_scale, causal, is_fp8_kvcache, indices,
                             attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length,
                             out=out, lse=lse)
    op = FLASH_MLA_WITH_KVCACHE.name
    if not isinstance(q, torch.Tensor) or q.dtype not in Q_DTYPES or q.dim() != 4 or q.shape[3] not in QK_HEAD_DIMS:
        raise ContractError(format_problem(op, "q", describe(q),
                                           f"a bf16 or fp16 [b, s_q, h_q, d] tensor with d in {QK_HEAD_DIMS}",
                                           "pass q as bf16 [b, s_q, h_q, 576] (or 512)"))
    k_cache = _as_bytes(k_cache, is_fp8_kvcache)
    if softmax_scale is None:
        softmax_scale = q.shape[3] ** -0.5
    no_extras = (attn_sink is None and extra_k_cache is None and extra_indices_in_kvcache is None
                 and topk_length is None and extra_topk_length is None)  # the plain decode: no tuple, no loop
    if no_extras or indices is None:
        if not no_extras:
            _refuse_sparse_extras(op, (attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                                       extra_topk_length))
        return _decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                       softmax_scale, causal, is_fp8_kvcache, indices, out, lse)
    from .extensions import sparse_decode_with_extras  # it builds on _decode (a module-level import would cycle)
    extra_k_cache = _as_bytes(extra_k_cache, True)
    return sparse_decode_with_extras(q, k_cache, head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale,
                                     is_fp8_kvcache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache,
                                     topk_length, extra_topk_length, block_table, cache_seqlens, causal, out, lse)


def _as_bytes(cache: Any, is_fp8_kvcache: bool) -> Any:
    """The FP8 cache handed over as float8_e4m3fn (as FlashMLA's tests do) is the same bytes: view them."""
    if isinstance(cache, PreparedKVCache):
        return cache
    if is_fp8_kvcache and isinstance(cache, torch.Tensor) and cache.dtype == torch.float8_e4m3fn:
        return cache.view(torch.uint8)
    return cache


def _plan(inputs: MlaDecodeInputs, tag: tuple[str, tuple] | None) -> Any:
    """The call's plan; a prepared cache's tag selects its backend unless use_backend forces one."""
    if tag is None or forced_key() is not None:
        return plan_for(FLASH_MLA_WITH_KVCACHE, inputs)
    with use_backend(tag[0], **dict(tag[1])):
        return plan_for(FLASH_MLA_WITH_KVCACHE, inputs)


def _refuse_sparse_extras(op: str, extras: tuple) -> None:
    names = ("attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length")
    for name, value in zip(names, extras):
        if value is not None:
            raise ContractError(format_problem(op, name, describe(value), "None for dense decode (indices=None)",
                                               "pass indices for sparse decode, or drop the argument (as FlashMLA "
                                               "requires)"))


def _decode(q: torch.Tensor, k_cache: Any, block_table: Any, cache_seqlens: Any, head_dim_v: Any,
            tile_scheduler_metadata: Any, num_splits: Any, softmax_scale: Any, causal: Any, is_fp8_kvcache: Any,
            indices: Any, out: Any, lse: Any, cache_arg: str = "k_cache") -> tuple[torch.Tensor, torch.Tensor]:
    """One validated decode through the registry: the body of flash_mla_with_kvcache (q already checked)."""
    op = FLASH_MLA_WITH_KVCACHE.name
    b, s_q, h_q, d = q.shape
    check_bool(op, "is_fp8_kvcache", is_fp8_kvcache)
    check_bool(op, "causal", causal)
    tag = (k_cache.backend, k_cache.params) if isinstance(k_cache, PreparedKVCache) else None
    k_cache, cache_format = cache_bytes(k_cache)
    if not is_int(head_dim_v) or head_dim_v != HEAD_DIM_V:
        raise ContractError(format_problem(op, "head_dim_v", describe(head_dim_v), HEAD_DIM_V,
                                           f"pass head_dim_v={HEAD_DIM_V} (V is K's latent part)"))
    _check_cache(op, q, k_cache, is_fp8_kvcache, cache_arg, cache_format)
    h_kv = k_cache.shape[2]
    dense = indices is None
    for arg, value in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
        if dense and value is None:
            raise ContractError(format_problem(op, arg, "None", "a tensor for dense decode",
                                               f"pass {arg}, or indices for sparse decode"))
    if block_table is not None:
        check_tensor(op, "block_table", block_table, (INDEX_DTYPE,), (None, None), None,
                     "pass block indices as int32 [b, max_blocks]")
        if block_table.shape[0] != b:
            raise ContractError(format_problem(op, "block_table", f"of shape {tuple(block_table.shape)}",
                                               f"[b, max_blocks] with b = {b} like q", "pass one row per sequence"))
    if cache_seqlens is not None:
        _check_cache_seqlens(op, cache_seqlens, b)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        raise ContractError(format_problem(op, "softmax_scale", describe(softmax_scale), "None or a finite float",
                                           f"pass e.g. {d ** -0.5:.6g} (d ** -0.5, the default)"))
    for arg, value in (("k_cache", k_cache), ("block_table", block_table), ("cache_seqlens", cache_seqlens),
                       ("indices", indices if isinstance(indices, torch.Tensor) else None)):
        check_device(op, arg, value, q.device, like="q")
    if not dense:
        _check_indices(op, indices, k_cache, b, s_q, is_fp8_kvcache, causal)
    topk = None if dense else int(indices.shape[2])
    meta = _check_metadata(op, tile_scheduler_metadata, num_splits, b, s_q, h_q, h_kv, is_fp8_kvcache, topk)
    _check_output(op, "out", out, q.dtype, (b, s_q, h_q, HEAD_DIM_V), q.device)
    _check_output(op, "lse", lse, LSE_DTYPE, (b, h_q, s_q), q.device)
    if out is None:
        out = torch.empty(b, s_q, h_q, HEAD_DIM_V, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(b, h_q, s_q, dtype=LSE_DTYPE, device=q.device)
    inputs = MlaDecodeInputs(q, k_cache, block_table, cache_seqlens, head_dim_v, float(softmax_scale), causal,
                             is_fp8_kvcache, indices, meta, meta.num_splits, out, lse, cache_format)
    plan = _plan(inputs, tag)
    if cache_format is not None:
        want = cache_format_for(plan.selection.backend, plan.selection.options, cache_format)
        if want is not cache_format:  # the slow path: the whole cache, counted (prepare it once instead)
            k_cache = convert_cache_in_call(op, cache_arg, k_cache, cache_format, want, plan.backend)
            inputs = inputs.replace(k_cache=k_cache, k_cache_format=want)
            plan = _plan(inputs, tag)
    if meta.backend != plan.backend:
        raise ContractError(format_problem(op, "tile_scheduler_metadata", f"computed by backend {meta.backend!r}",
                                           f"metadata of backend {plan.backend!r}, which runs this call",
                                           "call get_mla_metadata under the same backend (and device) as the decode"))
    run_plan(plan, inputs)
    return out, lse
