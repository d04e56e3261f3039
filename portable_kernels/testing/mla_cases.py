"""Conformance cases for get_mla_metadata and flash_mla_with_kvcache, and the paged-cache builder
tests share: per-sequence KV scattered over randomly assigned cache blocks, every unused slot NaN
(0xFF bytes in the FP8 cache) and every unused block_table entry a huge index, so a kernel that
reads outside the valid slots shows it in its output."""

from __future__ import annotations

import functools
from typing import Sequence

import attrs
import torch

from ..layouts.constants import KV_FP8_BYTES_PER_TOKEN, KV_LATENT_DIM
from ..layouts.kv_cache import dequantize_fp8_kv_cache, pack_fp8_kv_cache
from ..layouts.kv_cache_model1 import (MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, dequantize_model1_kv_cache,
                                       model1_token_rows, pack_model1_kv_cache)
from ..ops.attention.decode import (FLASH_MLA_WITH_KVCACHE, HEAD_DIM_V, INVALID_INDEX, LSE_ABS_TOL, LSE_REL_TOL, OUT_ABS_TOL,
                   OUT_REL_TOL, MlaMetadata, flash_mla_with_kvcache, get_mla_metadata, mla_decode_reference)
from ..core.registry import forced_backend
from ..core.tensors import cdiv
from .checks import assert_close, assert_refused
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, poison, randn

#: what unused block_table entries hold (an index far past any cache)
UNUSED_BLOCK_ENTRY = 2 ** 31 - 1
#: what unused FP8 cache bytes hold: 0xFF is NaN as e4m3, as fp32 scale and as bf16 RoPE
FP8_POISON_BYTE = 0xFF


@attrs.frozen(eq=False)
class PagedKV:
    """A paged KV cache and the per-sequence values it holds.

    k_cache:       bf16 [num_blocks, block_size, h_kv, d] or uint8 [num_blocks, block_size, 1, 656]
    block_table:   int32 [b, max_blocks]; cache_seqlens: int32 [b]
    sequences:     fp32 [s_k, h_kv, d] per sequence: the values a kernel reads (FP8 tokens dequantized)
    """

    k_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor
    sequences: tuple[torch.Tensor, ...]
    is_fp8: bool

    def to(self, device: torch.device | str) -> "PagedKV":
        return PagedKV(self.k_cache.to(device), self.block_table.to(device), self.cache_seqlens.to(device),
                       self.sequences, self.is_fp8)


def build_paged_cache(sequences: Sequence[torch.Tensor], block_size: int, *, seed: int, fp8: bool = False,
                      spare_blocks: int = 2, spare_columns: int = 1, dtype: torch.dtype = torch.bfloat16) -> PagedKV:
    """Scatter per-sequence KV (each [s_k, h_kv, d], the same h_kv and d) over a paged cache.

    Blocks are assigned in a seeded random order; `spare_blocks` extra blocks stay unused and the
    table gets `spare_columns` extra columns. With `fp8`, tokens (h_kv = 1, d = 576) are packed into
    the 656-byte FP8 format (d = 512: FlashMLA's MODEL1 pages, 584 bytes per token), else stored in
    `dtype`. Unused slots are NaN, unused table entries UNUSED_BLOCK_ENTRY.
    """
    if fp8 and sequences[0].shape[-1] == MODEL1_HEAD_DIM:
        return _build_model1_cache(sequences, block_size, seed=seed, spare_blocks=spare_blocks,
                                   spare_columns=spare_columns)
    h_kv, d = sequences[0].shape[1:]
    lengths = [int(s.shape[0]) for s in sequences]
    counts = [cdiv(n, block_size) for n in lengths]
    num_blocks = max(1, sum(counts) + spare_blocks)
    order = torch.randperm(num_blocks, generator=generator(seed))
    table = torch.full((len(sequences), max(counts, default=0) + spare_columns), UNUSED_BLOCK_ENTRY,
                       dtype=torch.int32)
    if fp8:
        cache = torch.full((num_blocks, block_size, 1, KV_FP8_BYTES_PER_TOKEN), FP8_POISON_BYTE, dtype=torch.uint8)
    else:
        cache = torch.full((num_blocks, block_size, h_kv, d), float("nan"), dtype=dtype)
    flat = cache.view(num_blocks * block_size, *cache.shape[2:])
    held, start = [], 0
    for i, (seq, n, count) in enumerate(zip(sequences, lengths, counts)):
        blocks = order[start:start + count]
        start += count
        table[i, :count] = blocks.to(torch.int32)
        t = torch.arange(n)
        slots = blocks[t // block_size] * block_size + t % block_size
        if fp8:
            tokens = pack_fp8_kv_cache(seq[..., :KV_LATENT_DIM], seq[..., KV_LATENT_DIM:].to(torch.bfloat16))
            values = dequantize_fp8_kv_cache(tokens, torch.float32)
        else:
            tokens = seq.to(dtype)
            values = tokens.float()
        flat[slots] = tokens
        held.append(values)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return PagedKV(cache, table, seqlens, tuple(held), fp8)


def _build_model1_cache(sequences: Sequence[torch.Tensor], block_size: int, *, seed: int, spare_blocks: int,
                        spare_columns: int) -> PagedKV:
    """build_paged_cache for MODEL1: the values scattered into NaN-filled bf16 pages, then the pages
    quantized with FlashMLA's rule (NaN passes through, as in FlashMLA's test: unused slots are NaN)."""
    plain = build_paged_cache(sequences, block_size, seed=seed, spare_blocks=spare_blocks,
                              spare_columns=spare_columns)
    cache = pack_model1_kv_cache(plain.k_cache, scale_rule="flash_mla")
    values = dequantize_model1_kv_cache(cache, torch.float32).view(-1, 1, MODEL1_HEAD_DIM)
    held = []
    for i, seq in enumerate(sequences):
        t = torch.arange(seq.shape[0])
        blocks = plain.block_table[i, :cdiv(seq.shape[0], block_size)].long()
        held.append(values[blocks[t // block_size] * block_size + t % block_size])
    return PagedKV(cache, plain.block_table, plain.cache_seqlens, tuple(held), True)


def random_kv(lengths: Sequence[int], h_kv: int, d: int, *, seed: int) -> list[torch.Tensor]:
    """bf16 per-sequence KV [s_k, h_kv, d] with fresh normal values."""
    return [randn(n, h_kv, d, seed=seed + i, dtype=torch.bfloat16) for i, n in enumerate(lengths)]


def random_indices(paged: PagedKV, s_q: int, topk: int, *, seed: int,
                   invalid_fraction: float = 0.25) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse indices int32 [b, s_q, topk] (absolute slots of random valid tokens, a fraction -1)
    and the token positions they point at (int64, -1 where invalid). Empty sequences get only -1."""
    g = generator(seed)
    b = paged.block_table.shape[0]
    block_size = paged.k_cache.shape[1]
    lengths = paged.cache_seqlens.long().view(b, 1, 1)
    pos = (torch.rand(b, s_q, topk, generator=g) * lengths).long().clamp(min=0)
    valid = (lengths > 0) & (torch.rand(b, s_q, topk, generator=g) >= invalid_fraction)
    pos = torch.where(valid, torch.minimum(pos, lengths - 1), INVALID_INDEX)
    column = torch.where(valid, pos // block_size, 0).view(b, -1)
    blocks = paged.block_table.long().gather(1, column).view(b, s_q, topk)
    slots = torch.where(valid, blocks * block_size + pos % block_size, INVALID_INDEX)
    return slots.to(torch.int32), pos


# -- checks -------------------------------------------------------------------------------------------

def assert_allclose(got: torch.Tensor, want: torch.Tensor, abs_tol: float, rel_tol: float, what: str) -> float:
    """|got - want| <= abs_tol + rel_tol·|want| elementwise, with equal non-finite positions; returns
    the largest absolute difference over the finite positions."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    bad_got, bad_want = ~torch.isfinite(got), ~torch.isfinite(want)
    same_bad = torch.equal(bad_got, bad_want) and torch.equal(got[bad_got].nan_to_num(0.0),
                                                              want[bad_want].nan_to_num(0.0))
    if not same_bad:
        raise CaseFailure(f"{what}: non-finite positions differ from the reference "
                          f"({int(bad_got.sum())} vs {int(bad_want.sum())}; NaN means unwritten or a leaked NaN)")
    diff = (got - want).abs().nan_to_num(0.0)
    over = diff > abs_tol + rel_tol * want.abs().nan_to_num(0.0)
    if bool(over.any()):
        raise CaseFailure(f"{what}: {int(over.sum())} elements outside abs {abs_tol:.1e} + rel {rel_tol:.3g}·|ref| "
                          f"(max abs diff {float(diff.max()):.3e})")
    return float(diff.max()) if diff.numel() else 0.0


def check_decode(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor) -> float:
    """The contract's bounds on (out, lse) against an fp64 reference of the same math; returns out's
    calc_diff. out: calc_diff <= 5e-6 and abs 8e-4 + rel 2.01/128; lse: abs 1e-6 + rel 8.01/65536."""
    assert_allclose(out, ref_out, OUT_ABS_TOL, OUT_REL_TOL, "out")
    assert_allclose(lse, ref_lse, LSE_ABS_TOL, LSE_REL_TOL, "lse")
    return assert_close(out, ref_out, FLASH_MLA_WITH_KVCACHE.tolerance.dequantized, "out vs fp64 reference")


# -- cases --------------------------------------------------------------------------------------------

@attrs.frozen
class DecodeShape:
    lengths: tuple[int, ...]
    s_q: int
    h_q: int
    h_kv: int = 1
    d: int = 576
    block_size: int = 64
    causal: bool = False
    fp8: bool = False
    topk: int | None = None
    softmax_scale: float | None = None
    dtype: torch.dtype = torch.bfloat16

    def label(self) -> str:
        mode = f"sparse topk={self.topk}" if self.topk else ("causal" if self.causal else "dense")
        cache = ("fp8 MODEL1" if self.d == MODEL1_HEAD_DIM else "fp8") if self.fp8 else str(self.dtype).replace("torch.", "")
        scale = "" if self.softmax_scale is None else f" scale={self.softmax_scale}"
        return (f"{mode} {cache} s_k={list(self.lengths)} s_q={self.s_q} h_q={self.h_q} h_kv={self.h_kv} "
                f"d={self.d} block={self.block_size}{scale}")


QUICK_SHAPES = [
    DecodeShape((70, 0, 1, 130), s_q=1, h_q=16),
    DecodeShape((33, 64, 5), s_q=2, h_q=8, h_kv=2, d=512, block_size=16, causal=True),
    DecodeShape((3, 90), s_q=4, h_q=4, block_size=32, causal=True, softmax_scale=0.02),
    DecodeShape((65, 0, 17), s_q=1, h_q=16, fp8=True),
    DecodeShape((100, 0, 7), s_q=2, h_q=16, fp8=True, topk=32, block_size=16),
    DecodeShape((40, 0, 9), s_q=2, h_q=8, d=512, block_size=16, causal=True, dtype=torch.float16),
    # FlashMLA's MODEL1 pages (fp8 with d = 512): sparse as DeepSeek-V4 decodes, and dense
    DecodeShape((100, 0, 69), s_q=2, h_q=16, d=512, fp8=True, topk=48, block_size=69),
    DecodeShape((65, 3), s_q=1, h_q=8, d=512, fp8=True, block_size=2),
]
FULL_SHAPES = QUICK_SHAPES + [
    DecodeShape((1000, 4096, 1, 2047), s_q=1, h_q=128),
    DecodeShape((515, 64, 2000), s_q=2, h_q=64, causal=True),
    DecodeShape((300, 4096, 0, 1500), s_q=2, h_q=128, fp8=True),
    DecodeShape((4096, 2048, 130), s_q=2, h_q=128, fp8=True, topk=2048),
    DecodeShape((777, 33, 64), s_q=3, h_q=32, h_kv=4, d=512, block_size=64, causal=True),
]


def _decode_case(shape: DecodeShape, seed: int, device: torch.device) -> float:
    sequences = random_kv(shape.lengths, shape.h_kv, shape.d, seed=seed)
    paged = build_paged_cache(sequences, shape.block_size, seed=seed, fp8=shape.fp8, dtype=shape.dtype)
    indices = None
    if shape.topk:
        indices = random_indices(paged, shape.s_q, shape.topk, seed=seed + 1)[0]
    b = len(shape.lengths)
    q = randn(b, shape.s_q, shape.h_q, shape.d, seed=seed + 2, dtype=shape.dtype)
    dev = paged.to(device)
    meta, num_splits = get_mla_metadata(dev.cache_seqlens, shape.s_q * shape.h_q // shape.h_kv, shape.h_kv,
                                        shape.h_q, shape.fp8, shape.topk)
    out = poison(b, shape.s_q, shape.h_q, HEAD_DIM_V, dtype=shape.dtype, device=device)
    lse = poison(b, shape.h_q, shape.s_q, dtype=torch.float32, device=device)
    got_out, got_lse = flash_mla_with_kvcache(
        q.to(device), dev.k_cache, dev.block_table, dev.cache_seqlens, HEAD_DIM_V, meta, num_splits,
        softmax_scale=shape.softmax_scale, causal=shape.causal, is_fp8_kvcache=shape.fp8,
        indices=None if indices is None else indices.to(device), out=out, lse=lse)
    if got_out is not out or got_lse is not lse:
        raise CaseFailure("flash_mla_with_kvcache did not return the out/lse buffers it was given")
    scale = shape.softmax_scale if shape.softmax_scale is not None else shape.d ** -0.5
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            scale, shape.causal, shape.fp8, indices, dtype=torch.float64)
    error = check_decode(out, lse, ref_out, ref_lse)
    if shape.fp8:
        # the same pages in bf16: the error of FP8 storage itself, reported against the unquantized KV
        plain = build_paged_cache(sequences, shape.block_size, seed=seed)
        unq_out, _ = mla_decode_reference(q, plain.k_cache, plain.block_table, plain.cache_seqlens, HEAD_DIM_V,
                                          scale, shape.causal, False, indices, dtype=torch.float64)
        assert_close(out, unq_out, FLASH_MLA_WITH_KVCACHE.tolerance.unquantized, "out vs unquantized KV")
    return error


def _refusal_case(defect: str, seed: int, device: torch.device) -> float:
    """A cache reference out of range is refused (every provider checks before it reads the cache)."""
    fp8 = defect == "indices"
    sequences = random_kv((70, 130), 1, 576, seed=seed)
    paged = build_paged_cache(sequences, 64, seed=seed, fp8=fp8).to(device)
    q = randn(2, 1, 16, 576, seed=seed + 1, dtype=torch.bfloat16, device=device)
    block_table, seqlens, indices = paged.block_table.clone(), paged.cache_seqlens.clone(), None
    if defect == "cache_seqlens":
        seqlens[1] = block_table.shape[1] * 64 + 1
    elif defect == "block_table":
        block_table[1, 1] = paged.k_cache.shape[0]  # a block sequence 1 uses, one past the cache
    else:
        indices = random_indices(paged, 1, 8, seed=seed + 2)[0].to(device)
        indices[0, 0, 3] = paged.k_cache.shape[0] * 64
    topk = None if indices is None else 8
    meta, splits = get_mla_metadata(seqlens, 16, 1, 16, fp8, topk)
    return assert_refused(lambda: flash_mla_with_kvcache(q, paged.k_cache, block_table, seqlens, HEAD_DIM_V, meta,
                                                         splits, is_fp8_kvcache=fp8, indices=indices),
                          defect, block_table)


def _all_tokens(cache: torch.Tensor) -> torch.Tensor:
    """Every token of an FP8 cache as a block-size-1 cache [nb·bs, 1, 1, width] (MODEL1: per-token bytes)."""
    nb, bs = cache.shape[:2]
    if cache.shape[-1] == MODEL1_BYTES_PER_TOKEN:
        slots = torch.arange(nb * bs)
        return model1_token_rows(cache, slots // bs, slots % bs).view(-1, 1, 1, MODEL1_BYTES_PER_TOKEN)
    return cache.reshape(-1, 1, 1, KV_FP8_BYTES_PER_TOKEN)


def _extras_case(lengths: tuple[int, ...], extra_lengths: tuple[int, ...], s_q: int, h_q: int, topk: int,
                 extra_topk: int, sink: bool, limit: bool, seed: int, device: torch.device, d: int = 576) -> float:
    """FlashMLA's sparse extensions (attn_sink, topk_length, a second FP8 cache with its own block size)
    against one sparse decode over both caches' tokens side by side (a different path from the op's).
    d = 512: both caches are MODEL1 pages."""
    first = build_paged_cache(random_kv(lengths, 1, d, seed=seed), 16, seed=seed, fp8=True)
    second = build_paged_cache(random_kv(extra_lengths, 1, d, seed=seed + 1), 8, seed=seed + 1, fp8=True)
    idx1 = random_indices(first, s_q, topk, seed=seed + 2)[0]
    idx2 = random_indices(second, s_q, extra_topk, seed=seed + 3)[0]
    b = len(lengths)
    g = generator(seed + 4)
    len1 = torch.randint(0, topk + 1, (b,), generator=g, dtype=torch.int32) if limit else None
    len2 = torch.randint(0, extra_topk + 1, (b,), generator=g, dtype=torch.int32) if limit else None
    attn_sink = (torch.randn(h_q, generator=g) * 2).float() if sink else None
    if sink:
        attn_sink[0] = float("inf")  # FlashMLA: +inf makes that head's output 0
    q = randn(b, s_q, h_q, d, seed=seed + 5, dtype=torch.bfloat16)
    meta, splits = get_mla_metadata(first.cache_seqlens.to(device), s_q * h_q, 1, h_q, True, topk)
    out, lse = flash_mla_with_kvcache(
        q.to(device), first.k_cache.to(device), None, None, HEAD_DIM_V, meta, splits, is_fp8_kvcache=True,
        indices=idx1.to(device), attn_sink=None if attn_sink is None else attn_sink.to(device),
        extra_k_cache=second.k_cache.to(device), extra_indices_in_kvcache=idx2.to(device),
        topk_length=None if len1 is None else len1.to(device),
        extra_topk_length=None if len2 is None else len2.to(device))
    # the reference: both caches' tokens as one block-size-1 cache, the limited indices side by side
    n1 = first.k_cache.shape[0] * first.k_cache.shape[1]
    joint = torch.cat((_all_tokens(first.k_cache), _all_tokens(second.k_cache)))
    keep1 = torch.ones_like(idx1, dtype=torch.bool) if len1 is None else torch.arange(topk) < len1.view(-1, 1, 1)
    keep2 = torch.ones_like(idx2, dtype=torch.bool) if len2 is None else torch.arange(extra_topk) < len2.view(-1, 1, 1)
    joint_idx = torch.cat((torch.where(keep1, idx1, INVALID_INDEX),
                           torch.where(keep2 & (idx2 >= 0), idx2 + n1, INVALID_INDEX)), dim=-1)
    ref_out, ref_lse = mla_decode_reference(q, joint, None, None, HEAD_DIM_V, d ** -0.5, False, True, joint_idx,
                                            dtype=torch.float64)
    if attn_sink is not None:
        factor = torch.sigmoid(ref_lse - attn_sink.double().view(1, -1, 1)).masked_fill(torch.isposinf(ref_lse), 0)
        ref_out = ref_out * factor.transpose(1, 2).unsqueeze(-1)
    assert_allclose(out, ref_out, OUT_ABS_TOL, OUT_REL_TOL, "out")
    assert_allclose(lse, ref_lse, LSE_ABS_TOL, LSE_REL_TOL, "lse")
    return assert_close(out, ref_out, FLASH_MLA_WITH_KVCACHE.tolerance.dequantized, "out vs fp64 reference")


@conformance_cases("flash_mla_with_kvcache")
def flash_mla_cases(quick: bool) -> list[Case]:
    cases = []
    for i, shape in enumerate(QUICK_SHAPES if quick else FULL_SHAPES):
        seed = 4000 + 10 * i
        cases.append(Case("flash_mla_with_kvcache", shape.label(), seed, functools.partial(_decode_case, shape, seed)))
    extras = [((50, 0, 9), (20, 33, 0), 2, 16, 16, 8, True, True, 576), ((70,), (5,), 1, 8, 32, 4, False, False, 576),
              ((40, 7), (30, 0), 2, 16, 16, 8, True, True, 512)]  # the last: MODEL1 pages (DeepSeek-V4's call)
    if not quick:
        extras.append(((900, 300), (2000, 64), 2, 64, 256, 128, True, True, 576))
    for j, (lengths, extra_lengths, s_q, h_q, topk, extra_topk, sink, limit, d) in enumerate(extras):
        seed = 4700 + 10 * j
        label = (f"sparse extras: s_k={list(lengths)} extra s_k={list(extra_lengths)} topk={topk}+{extra_topk} "
                 f"attn_sink={sink} topk_length={limit}" + (" MODEL1 d=512" if d == MODEL1_HEAD_DIM else ""))
        cases.append(Case("flash_mla_with_kvcache", label, seed,
                          functools.partial(_extras_case, lengths, extra_lengths, s_q, h_q, topk, extra_topk, sink,
                                            limit, seed, d=d)))
    for j, defect in enumerate(("cache_seqlens", "block_table", "indices")):
        seed = 4900 + 10 * j
        cases.append(Case("flash_mla_with_kvcache", f"refuses an out-of-range {defect}", seed,
                          functools.partial(_refusal_case, defect, seed)))
    return cases


def _metadata_case(lengths: tuple[int, ...], s_q: int, h_q: int, topk: int | None, seed: int,
                   device: torch.device) -> float:
    fp8 = topk is not None
    paged = build_paged_cache(random_kv(lengths, 1, 576, seed=seed), 64, seed=seed, fp8=fp8).to(device)
    meta, num_splits = get_mla_metadata(paged.cache_seqlens, s_q * h_q, 1, h_q, fp8, topk)
    if not isinstance(meta, MlaMetadata):
        raise CaseFailure(f"get_mla_metadata returned {type(meta).__name__}, not MlaMetadata")
    forced = forced_backend()
    if forced is not None and meta.backend != forced[0]:
        raise CaseFailure(f"metadata names backend {meta.backend!r}, but the call ran on {forced[0]!r}")
    echo = (meta.batch_size, meta.num_q_tokens_per_head_k, meta.num_heads_k, meta.num_heads_q, meta.topk)
    if echo != (len(lengths), s_q * h_q, 1, h_q, topk) or meta.is_fp8_kvcache is not fp8:
        raise CaseFailure(f"metadata does not record its configuration: {meta}")
    if num_splits is not meta.num_splits:
        raise CaseFailure("the num_splits returned is not the one the metadata carries")
    for t in (*meta.tensors, *(() if num_splits is None else (num_splits,))):
        if t.device != paged.cache_seqlens.device:
            raise CaseFailure(f"a scheduling tensor is on {t.device}, not on {paged.cache_seqlens.device}")
    q = randn(len(lengths), s_q, h_q, 576, seed=seed + 1, dtype=torch.bfloat16, device=device)
    indices = None
    if topk:
        indices = random_indices(paged.to("cpu"), s_q, topk, seed=seed + 2)[0].to(device)
    out, lse = flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                                      num_splits, is_fp8_kvcache=fp8, indices=indices)
    if bool(torch.isnan(out.float()).any()) or bool(torch.isnan(lse).any()):
        raise CaseFailure("a decode with the returned metadata produced NaN")
    return 0.0


@conformance_cases("get_mla_metadata")
def mla_metadata_cases(quick: bool) -> list[Case]:
    shapes = [((5, 0, 70), 1, 16, None), ((40, 3), 2, 16, 8)]
    return [Case("get_mla_metadata", f"s_k={list(lengths)} s_q={s_q} h_q={h_q} topk={topk}", 4900 + i,
                 functools.partial(_metadata_case, lengths, s_q, h_q, topk, 4900 + i))
            for i, (lengths, s_q, h_q, topk) in enumerate(shapes)]
