"""Conformance cases for the lightning-indexer logits (fp8_mqa_logits, fp8_paged_mqa_logits): seeded
queries and keys quantized as DeepSeek-V3.2 does, DeepGEMM's context-parallel key ranges, ragged
paged sequences on shuffled cache blocks, compressed logits, bf16 logits and weights. Each result
is compared with calc_diff against the reference computed from the dequantized operands (DeepGEMM's
own bounds), the -inf pattern must match exactly where clean_logits asks for it, and the valid
entries of a NaN-poisoned logits buffer must all be written."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Sequence

import attrs
import torch

from ..core.numerics import calc_diff
from ..layouts.indexer_cache import (dequantize_fp4_rows, dequantize_indexer_cache, dequantize_indexer_cache_fp4,
                                     pack_indexer_cache, quantize_fp4_rows, quantize_indexer_keys)
from ..ops.attention import indexer
from ..ops.attention.indexer import (BF16_TOLERANCE, FP32_TOLERANCE, LOGITS_ROW_ALIGN_BYTES, fp8_mqa_logits,
                                     fp8_paged_mqa_logits, get_paged_mqa_logits_metadata, mqa_logits_reference,
                                     paged_mqa_logits_reference)
from .checks import assert_refused
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn


@contextlib.contextmanager
def poisoned_logits() -> Iterator[None]:
    """Inside: every logits buffer the indexer ops allocate starts as NaN."""
    saved = indexer.POISON_LOGITS
    indexer.POISON_LOGITS = True
    try:
        yield
    finally:
        indexer.POISON_LOGITS = saved


def cp_ranges(m: int, n: int, context_parallel: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's key ranges: causal over the last m of n keys, or (context_parallel) two chunks
    of a CP rank's zig-zag split (n a multiple of m, m even)."""
    if not context_parallel:
        return torch.zeros(m, dtype=torch.int32), torch.arange(m, dtype=torch.int32) + (n - m)
    half, ranks = m // 2, n // m
    rank = ranks // 3
    ke = torch.zeros(m, dtype=torch.int32)
    for i in range(half):
        ke[i] = rank * half + i
        ke[i + half] = (2 * ranks - 1 - rank) * half + i
    return torch.zeros(m, dtype=torch.int32), ke


def quantized_queries(*shape: int, seed: int) -> torch.Tensor:
    return randn(*shape, seed=seed).to(torch.float8_e4m3fn)


def tolerance(logits_dtype: torch.dtype, weights_dtype: torch.dtype) -> float:
    return BF16_TOLERANCE if torch.bfloat16 in (logits_dtype, weights_dtype) else FP32_TOLERANCE


def check_logits(got: torch.Tensor, want: torch.Tensor, valid: torch.Tensor, clean: bool, bound: float) -> float:
    """got (logits, possibly compressed into want's valid layout already) vs want fp32 with -inf
    outside `valid`; returns calc_diff over the valid entries."""
    if got.stride(0) * got.element_size() % LOGITS_ROW_ALIGN_BYTES or got.stride(1) != 1:
        raise CaseFailure(f"logits strides {got.stride()}: rows must be {LOGITS_ROW_ALIGN_BYTES}-byte aligned")
    g = got.float().cpu()
    if bool(torch.isnan(g[valid]).any()):
        raise CaseFailure("a valid logits entry is NaN (left unwritten in the poisoned buffer)")
    if clean and not torch.equal(g == float("-inf"), ~valid):
        raise CaseFailure("clean_logits: the -inf entries are not exactly those outside each row's keys")
    error = calc_diff(g.masked_fill(~valid, 0), want.masked_fill(~valid, 0))
    if error > bound:
        raise CaseFailure(f"calc_diff {error:.3g} > {bound:.3g} against the reference on dequantized operands")
    return error


@attrs.frozen
class PrefillShape:
    m: int
    n: int
    heads: int
    d: int
    context_parallel: bool = False
    compressed: bool = False
    logits_dtype: torch.dtype = torch.float32
    weights_dtype: torch.dtype = torch.float32
    fp4: bool = False  # DeepGEMM's FP4 q and keys (packed E2M1, UE8M0 per 32)


def _fp4_operand(x: torch.Tensor, device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((int8 packed, int32 words) on device, its dequantized fp32 values) of x [..., D]."""
    packed, words = quantize_fp4_rows(x)
    return (packed.view(torch.int8).to(device), words.to(device)), dequantize_fp4_rows(packed, words)


def _prefill_case(shape: PrefillShape, seed: int, device: torch.device) -> float:
    raw_keys = randn(shape.n, shape.d, seed=seed + 1, dtype=torch.bfloat16)
    if shape.fp4:
        q, q_values = _fp4_operand(randn(shape.m, shape.heads, shape.d, seed=seed), device)
        kv, k_values = _fp4_operand(raw_keys, device)
    else:
        q = q_values = quantized_queries(shape.m, shape.heads, shape.d, seed=seed)
        keys, scales = quantize_indexer_keys(raw_keys)
        q, kv, k_values = q.to(device), (keys.to(device), scales.to(device)), keys.float() * scales[:, None]
    weights = randn(shape.m, shape.heads, seed=seed + 2).to(shape.weights_dtype)
    ks, ke = cp_ranges(shape.m, shape.n, shape.context_parallel)
    want = mqa_logits_reference(q_values, k_values, weights.float(), ks, ke)
    width = int((ke - ks).max()) if shape.compressed else 0
    with poisoned_logits():
        got = fp8_mqa_logits(q, kv, weights.to(device), ks.to(device), ke.to(device),
                             clean_logits=not shape.compressed, max_seqlen_k=width, logits_dtype=shape.logits_dtype)
    if got.dtype != shape.logits_dtype:
        raise CaseFailure(f"logits dtype {got.dtype}, expected {shape.logits_dtype}")
    if shape.compressed:
        if tuple(got.shape) != (shape.m, width):
            raise CaseFailure(f"compressed logits shape {tuple(got.shape)}, expected {(shape.m, width)}")
        cols = torch.arange(width)[None, :]
        valid = cols < (ke - ks)[:, None]
        want = want.gather(1, (cols + ks[:, None]).clamp(max=shape.n - 1).long()).masked_fill(~valid, float("-inf"))
    else:
        if tuple(got.shape) != (shape.m, shape.n):
            raise CaseFailure(f"logits shape {tuple(got.shape)}, expected {(shape.m, shape.n)}")
        valid = want != float("-inf")
    return check_logits(got, want, valid, not shape.compressed, tolerance(shape.logits_dtype, shape.weights_dtype))


@attrs.frozen
class PagedShape:
    lengths: tuple[int, ...]
    next_n: int
    heads: int
    d: int
    block_kv: int
    clean: bool = True
    logits_dtype: torch.dtype = torch.float32
    weights_dtype: torch.dtype = torch.float32
    fp4: bool = False


def build_indexer_cache(lengths: Sequence[int], block_kv: int, d: int, *, seed: int,
                        spare_blocks: int = 3, fp4: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 cache [blocks, block_kv, 1, d + 4] (FP4: d/2 + 4), int32 block_table [B, max_blocks]):
    each sequence's blocks drawn from a shuffled pool with spare blocks, unused table entries set to
    a huge id."""
    used = [-(-n // block_kv) for n in lengths]
    total = sum(used) + spare_blocks
    keys = randn(total, block_kv, d, seed=seed, dtype=torch.bfloat16)
    cache = pack_indexer_cache(*(quantize_fp4_rows(keys) if fp4 else quantize_indexer_keys(keys)))
    pool = torch.randperm(total, generator=generator(seed + 1)).to(torch.int32)
    table = torch.full((len(lengths), max(max(used), 1) + 1), 2**30, dtype=torch.int32)
    offset = 0
    for b, count in enumerate(used):
        table[b, :count] = pool[offset: offset + count]
        offset += count
    return cache, table


def paged_context_lens(lengths: Sequence[int], next_n: int) -> torch.Tensor:
    """int32 [B, next_n]: the MTP pattern, row t of sequence b sees lengths[b] - next_n + 1 + t keys."""
    return torch.tensor([[max(n - next_n + 1 + t, 0) for t in range(next_n)] for n in lengths], dtype=torch.int32)


def _paged_case(shape: PagedShape, seed: int, device: torch.device) -> float:
    batch = len(shape.lengths)
    cache, table = build_indexer_cache(shape.lengths, shape.block_kv, shape.d, seed=seed, fp4=shape.fp4)
    if shape.fp4:
        q, q_values = _fp4_operand(randn(batch, shape.next_n, shape.heads, shape.d, seed=seed + 2), device)
        k_values = dequantize_indexer_cache_fp4(cache)
    else:
        q = q_values = quantized_queries(batch, shape.next_n, shape.heads, shape.d, seed=seed + 2)
        q, k_values = q.to(device), dequantize_indexer_cache(cache)
    weights = randn(batch * shape.next_n, shape.heads, seed=seed + 3).to(shape.weights_dtype)
    lens = paged_context_lens(shape.lengths, shape.next_n)
    width = max(shape.lengths) + 5
    want = paged_mqa_logits_reference(q_values, k_values, weights.float(), lens, table, width)
    meta = get_paged_mqa_logits_metadata(lens.to(device), shape.block_kv, 8)
    with poisoned_logits():
        got = fp8_paged_mqa_logits(q, cache.to(device), weights.to(device), lens.to(device),
                                   table.to(device), meta, width, clean_logits=shape.clean,
                                   logits_dtype=shape.logits_dtype)
    if got.dtype != shape.logits_dtype or tuple(got.shape) != (batch * shape.next_n, width):
        raise CaseFailure(f"logits {got.dtype} {tuple(got.shape)}, expected {shape.logits_dtype} "
                          f"{(batch * shape.next_n, width)}")
    valid = torch.arange(width)[None, :] < lens.reshape(-1, 1)
    return check_logits(got, want, valid, shape.clean, tolerance(shape.logits_dtype, shape.weights_dtype))


def _refusal_case(defect: str, seed: int, device: torch.device) -> float:
    """A key range or cache reference out of bounds is refused before anything reads memory."""
    if defect in ("cu_seq_len_k_end", "max_seqlen_k"):
        q = quantized_queries(4, 8, 32, seed=seed).to(device)
        kv = tuple(t.to(device) for t in quantize_indexer_keys(randn(16, 32, seed=seed + 1)))
        ks, ke = (t.to(device) for t in cp_ranges(4, 16, False))
        w = randn(4, 8, seed=seed + 2, device=device)
        if defect == "cu_seq_len_k_end":
            ke = ke.clone()
            ke[2] = 17
            return assert_refused(lambda: fp8_mqa_logits(q, kv, w, ks, ke), defect, ke)
        return assert_refused(lambda: fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=False, max_seqlen_k=3), defect, ke)
    cache, table = build_indexer_cache((70, 20), 16, 32, seed=seed)
    lens = paged_context_lens((70, 20), 1)
    if defect == "block_table":
        table[0, 2] = cache.shape[0]
    else:
        lens[1, 0] = 100
    q = quantized_queries(2, 1, 8, 32, seed=seed + 3).to(device)
    w = randn(2, 8, seed=seed + 4, device=device)
    meta = get_paged_mqa_logits_metadata(lens.to(device), 16, 4)
    return assert_refused(lambda: fp8_paged_mqa_logits(q, cache.to(device), w, lens.to(device), table.to(device),
                                                       meta, 80), defect, table)


PREFILL_QUICK = (
    PrefillShape(8, 96, 4, 32),
    PrefillShape(8, 64, 32, 64, context_parallel=True),
    PrefillShape(6, 40, 8, 128, compressed=True),
    PrefillShape(5, 33, 16, 64, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16),
    PrefillShape(8, 64, 8, 128, context_parallel=True, fp4=True),
    PrefillShape(6, 40, 16, 64, compressed=True, fp4=True),
)
PREFILL_FULL = PREFILL_QUICK + (
    PrefillShape(32, 512, 64, 128),
    PrefillShape(16, 256, 32, 128, context_parallel=True, compressed=True),
    PrefillShape(12, 300, 64, 32, logits_dtype=torch.bfloat16),
    PrefillShape(1, 7, 1, 16),
)
PAGED_QUICK = (
    PagedShape((70, 1, 130), 1, 8, 32, 16),
    PagedShape((64, 37), 2, 32, 64, 64, clean=False),
    PagedShape((5, 200, 0), 1, 16, 128, 64, logits_dtype=torch.bfloat16, weights_dtype=torch.bfloat16),
    PagedShape((70, 1, 130), 2, 8, 128, 64, fp4=True),
    PagedShape((33, 64), 1, 16, 64, 32, clean=False, logits_dtype=torch.bfloat16, fp4=True),
)
PAGED_FULL = PAGED_QUICK + (
    PagedShape((300, 257, 1, 64), 2, 64, 128, 64),
    PagedShape(tuple(range(1, 90, 11)), 1, 32, 128, 32, logits_dtype=torch.bfloat16),
    PagedShape((129,), 4, 16, 64, 16),
)


@conformance_cases("fp8_mqa_logits")
def mqa_logits_cases(quick: bool) -> list[Case]:
    cases = [Case("fp8_mqa_logits", f"{s}", 7100 + 10 * i, functools.partial(_prefill_case, s, 7100 + 10 * i))
             for i, s in enumerate(PREFILL_QUICK if quick else PREFILL_FULL)]
    cases += [Case("fp8_mqa_logits", f"refuses a bad {d}", 7190 + i, functools.partial(_refusal_case, d, 7190 + i))
              for i, d in enumerate(("cu_seq_len_k_end", "max_seqlen_k"))]
    return cases


@conformance_cases("fp8_paged_mqa_logits")
def paged_mqa_logits_cases(quick: bool) -> list[Case]:
    cases = [Case("fp8_paged_mqa_logits", f"{s}", 7200 + 10 * i, functools.partial(_paged_case, s, 7200 + 10 * i))
             for i, s in enumerate(PAGED_QUICK if quick else PAGED_FULL)]
    cases += [Case("fp8_paged_mqa_logits", f"refuses a bad {d}", 7290 + i,
                   functools.partial(_refusal_case, d, 7290 + i)) for i, d in enumerate(("block_table", "context_lens"))]
    return cases
