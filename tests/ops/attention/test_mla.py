"""MLA decode (FlashMLA names): the vectorized reference against a per-sequence fp64 oracle, the public
op against the published bounds with poisoned caches and outputs, the metadata, and the bad-input
catalogue of both public functions."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.ops.attention import decode as mla
from portable_kernels.ops.attention.decode import HEAD_DIM_V, mla_decode_reference
from portable_kernels.testing import run_conformance
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import (UNUSED_BLOCK_ENTRY, DecodeShape, assert_allclose,
                                                build_paged_cache, check_decode, random_indices, random_kv)

#: fp64 against fp64 of the same math in another order
ORACLE_BOUND = 1e-12


def _oracle(q: torch.Tensor, sequences, scale: float, causal: bool, positions: torch.Tensor | None = None):
    """Attention one (sequence, query token) at a time from the per-sequence values, in fp64."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, HEAD_DIM_V, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float64)
    for i in range(b):
        kv = sequences[i].double()
        s_k, h_kv = kv.shape[0], kv.shape[1]
        heads = torch.arange(h_q) // (h_q // h_kv)
        for t in range(s_q):
            if positions is not None:
                keys = positions[i, t][positions[i, t] >= 0]
            else:
                keys = torch.arange(max(0, s_k - s_q + t + 1) if causal else s_k)
            if keys.numel() == 0:
                continue
            k = kv[keys][:, heads]                                       # [n, h_q, d]
            logits = torch.einsum("nhd,hd->hn", k, q[i, t].double()) * scale
            lse[i, :, t] = torch.logsumexp(logits, -1)
            out[i, t] = torch.einsum("hn,nhv->hv", torch.softmax(logits, -1), k[..., :HEAD_DIM_V])
    return out, lse


def _setup(shape: DecodeShape, seed: int):
    sequences = random_kv(shape.lengths, shape.h_kv, shape.d, seed=seed)
    paged = build_paged_cache(sequences, shape.block_size, seed=seed, fp8=shape.fp8)
    indices = positions = None
    if shape.topk:
        indices, positions = random_indices(paged, shape.s_q, shape.topk, seed=seed + 1)
    q = randn(len(shape.lengths), shape.s_q, shape.h_q, shape.d, seed=seed + 2, dtype=torch.bfloat16)
    return paged, q, indices, positions


def _decode(paged, q, shape: DecodeShape, indices=None, **kwargs):
    h_kv = paged.k_cache.shape[2]
    meta, splits = pk.get_mla_metadata(paged.cache_seqlens, q.shape[1] * q.shape[2] // h_kv, h_kv, q.shape[2],
                                       paged.is_fp8, None if indices is None else indices.shape[-1])
    return pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                                     splits, softmax_scale=shape.softmax_scale, causal=shape.causal,
                                     is_fp8_kvcache=paged.is_fp8, indices=indices, **kwargs)


SHAPES = {
    "dense bf16 d576": DecodeShape((70, 0, 1, 130), s_q=1, h_q=8),
    "dense bf16 d512 gqa causal": DecodeShape((33, 64, 5), s_q=3, h_q=8, h_kv=2, d=512, block_size=16, causal=True),
    "causal s_q > s_k": DecodeShape((2, 9), s_q=4, h_q=2, block_size=4, causal=True),
    "dense fp8": DecodeShape((65, 0, 17), s_q=2, h_q=4, fp8=True, softmax_scale=0.07),
    "sparse fp8": DecodeShape((100, 0, 7), s_q=2, h_q=8, fp8=True, topk=24, block_size=16),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_reference_matches_per_sequence_oracle(name):
    shape = SHAPES[name]
    paged, q, indices, positions = _setup(shape, seed=100)
    scale = shape.softmax_scale or shape.d ** -0.5
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            scale, shape.causal, shape.fp8, indices, dtype=torch.float64)
    want_out, want_lse = _oracle(q, paged.sequences, scale, shape.causal, positions)
    assert pk.calc_diff(ref_out, want_out) <= ORACLE_BOUND
    assert_allclose(ref_lse, want_lse, 1e-12, 1e-12, "lse")


@pytest.mark.parametrize("name", list(SHAPES))
def test_decode_writes_poisoned_outputs_within_published_bounds(name):
    shape = SHAPES[name]
    paged, q, indices, positions = _setup(shape, seed=200)
    out = poison(*q.shape[:3], HEAD_DIM_V, dtype=torch.bfloat16)
    lse = poison(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    got = _decode(paged, q, shape, indices, out=out, lse=lse)
    assert got[0] is out and got[1] is lse
    want_out, want_lse = _oracle(q, paged.sequences, shape.softmax_scale or shape.d ** -0.5, shape.causal, positions)
    assert check_decode(out, lse, want_out, want_lse) <= 5e-6


def test_paged_cache_poisons_every_unused_slot_and_table_entry():
    paged = build_paged_cache(random_kv((70, 0, 1), 1, 576, seed=1), 64, seed=1)
    nan_tokens = torch.isnan(paged.k_cache.float()).all(dim=(-1, -2)).sum()
    assert int(nan_tokens) == paged.k_cache.shape[0] * 64 - 71
    used = (paged.block_table != UNUSED_BLOCK_ENTRY).sum(dim=1)
    assert used.tolist() == [2, 0, 1]


def test_empty_sequence_gives_zero_out_and_infinite_lse():
    shape = DecodeShape((0, 5), s_q=2, h_q=4, causal=True)
    paged, q, _, _ = _setup(shape, seed=300)
    out, lse = _decode(paged, q, shape)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isposinf(lse[0]).all() and torch.isfinite(lse[1]).all()


def test_causal_queries_before_the_first_key_see_nothing():
    shape = DecodeShape((2,), s_q=4, h_q=2, block_size=4, causal=True)
    paged, q, _, _ = _setup(shape, seed=301)
    out, lse = _decode(paged, q, shape)
    assert torch.equal(out[0, :2], torch.zeros_like(out[0, :2]))
    assert torch.isposinf(lse[0, :, :2]).all() and torch.isfinite(lse[0, :, 2:]).all()


def test_sparse_row_of_invalid_indices_gives_zero_out_and_infinite_lse():
    shape = DecodeShape((40,), s_q=2, h_q=4, fp8=True, topk=8)
    paged, q, indices, _ = _setup(shape, seed=302)
    indices[0, 1] = -1
    out, lse = _decode(paged, q, shape, indices)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    assert torch.isposinf(lse[0, :, 1]).all() and torch.isfinite(lse[0, :, 0]).all()


def test_default_softmax_scale_is_head_dim_to_the_minus_half():
    shape = DecodeShape((50, 9), s_q=1, h_q=4, d=512)
    paged, q, _, _ = _setup(shape, seed=303)
    default = _decode(paged, q, shape)
    explicit = _decode(paged, q, DecodeShape((50, 9), s_q=1, h_q=4, d=512, softmax_scale=512 ** -0.5))
    assert torch.equal(default[0], explicit[0]) and torch.equal(default[1], explicit[1])


def test_outputs_are_allocated_when_not_given():
    shape = DecodeShape((10, 3), s_q=2, h_q=4)
    paged, q, _, _ = _setup(shape, seed=304)
    out, lse = _decode(paged, q, shape)
    assert (out.dtype, tuple(out.shape), out.is_contiguous()) == (torch.bfloat16, (2, 2, 4, 512), True)
    assert (lse.dtype, tuple(lse.shape), lse.is_contiguous()) == (torch.float32, (2, 4, 2), True)


def test_reference_chunks_the_batch_without_changing_the_result(monkeypatch):
    shape = DecodeShape((70, 3, 0, 20), s_q=2, h_q=4, causal=True)
    paged, q, _, _ = _setup(shape, seed=305)
    args = (q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, 0.05, True, False, None)
    whole = mla_decode_reference(*args, dtype=torch.float64)
    monkeypatch.setattr(mla, "REFERENCE_CHUNK_ELEMENTS", 1)
    chunked = mla_decode_reference(*args, dtype=torch.float64)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])


def test_empty_batch_returns_empty_outputs():
    q = torch.empty(0, 1, 4, 576, dtype=torch.bfloat16)
    k_cache = torch.full((1, 64, 1, 576), float("nan"), dtype=torch.bfloat16)
    table, lengths = torch.empty(0, 1, dtype=torch.int32), torch.empty(0, dtype=torch.int32)
    meta, splits = pk.get_mla_metadata(lengths, 4, 1)
    out, lse = pk.flash_mla_with_kvcache(q, k_cache, table, lengths, 512, meta, splits)
    assert out.shape == (0, 1, 4, 512) and lse.shape == (0, 4, 1)


# -- metadata ------------------------------------------------------------------------------------------

def test_metadata_records_backend_and_configuration():
    lengths = torch.tensor([3, 0, 9], dtype=torch.int32)
    meta, splits = pk.get_mla_metadata(lengths, 32, 1, 16, True, 64)
    assert isinstance(meta, pk.MlaMetadata) and meta.backend == "cpu"
    assert (meta.batch_size, meta.num_q_tokens_per_head_k, meta.num_heads_k, meta.num_heads_q, meta.topk) == \
        (3, 32, 1, 16, 64)
    assert meta.is_fp8_kvcache and splits is meta.num_splits
    # num_splits is prefix-summed per sequence (its values are the backend's schedule)
    assert splits.dtype == torch.int32 and splits.shape == (4,) and splits[0] == 0 and bool((splits.diff() >= 0).all())


def test_metadata_is_reusable_across_layers():
    shape = DecodeShape((30, 4), s_q=1, h_q=4)
    paged, q, _, _ = _setup(shape, seed=306)
    meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 4, 1)
    first = pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, meta, splits)
    again = pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, meta, None)
    assert torch.equal(first[0], again[0])


# -- bad inputs ------------------------------------------------------------------------------------------

def _base(sparse: bool = False) -> dict:
    """Valid arguments: dense over a bf16 cache, or sparse over the FP8 cache."""
    shape = DecodeShape((5, 70), s_q=2, h_q=4, fp8=sparse, topk=8 if sparse else None)
    paged, q, indices, _ = _setup(shape, seed=7)
    meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 8, 1, 4, sparse, shape.topk)
    return dict(q=q, k_cache=paged.k_cache, block_table=paged.block_table, cache_seqlens=paged.cache_seqlens,
                head_dim_v=512, tile_scheduler_metadata=meta, num_splits=splits, is_fp8_kvcache=sparse,
                indices=indices)


def _meta(**changes):
    lengths = torch.tensor([5, 70], dtype=torch.int32)
    args = dict(cache_seqlens=lengths, num_q_tokens_per_head_k=8, num_heads_k=1, num_heads_q=4,
                is_fp8_kvcache=False, topk=None)
    args.update(changes)
    return pk.get_mla_metadata(**args)[0]


def _with(sparse=False, **changes):
    def build():
        args = _base(sparse)
        for key, value in changes.items():
            args[key] = value(args) if callable(value) else value
        return args
    return build


BAD_DECODE = {
    "q not a tensor": (_with(q=lambda a: a["q"].tolist()), "'q'"),
    "q fp16 with a bf16 cache": (_with(q=lambda a: a["q"].half()), "'k_cache'"),
    "q fp16 with the fp8 cache": (_with(True, q=lambda a: a["q"].half()), "'q'"),
    "q fp32": (_with(q=lambda a: a["q"].float()), "'q'"),
    "attn_sink in dense decode": (_with(attn_sink=torch.zeros(4)), "'attn_sink'"),
    "topk_length in dense decode": (_with(topk_length=torch.ones(2, dtype=torch.int32)), "'topk_length'"),
    "q 3-D": (_with(q=lambda a: a["q"][0]), "'q'"),
    "q head dim 128": (_with(q=lambda a: a["q"][..., :128]), "'q'"),
    "q 512 with fp8 cache": (_with(True, q=lambda a: a["q"][..., :512]), "'q'"),
    "q on another device": (_with(q=lambda a: a["q"].to("meta")), "'k_cache'"),
    "k_cache fp16": (_with(k_cache=lambda a: a["k_cache"].half()), "'k_cache'"),
    "k_cache 3-D": (_with(k_cache=lambda a: a["k_cache"][:, :, 0]), "'k_cache'"),
    "k_cache head dim differs from q": (_with(k_cache=lambda a: a["k_cache"][..., :512]), "'k_cache'"),
    "h_q not a multiple of h_kv": (_with(k_cache=lambda a: a["k_cache"].expand(-1, -1, 3, -1)), "'k_cache'"),
    "k_cache channels strided": (_with(k_cache=lambda a: a["k_cache"].repeat_interleave(2, -1)[..., ::2]),
                                 "'k_cache'"),
    "k_cache on another device": (_with(k_cache=lambda a: a["k_cache"].to("meta")), "'k_cache'"),
    "uint8 cache without is_fp8_kvcache": (_with(True, is_fp8_kvcache=False), "'is_fp8_kvcache'"),
    "bf16 cache with is_fp8_kvcache": (_with(is_fp8_kvcache=True), "'is_fp8_kvcache'"),
    "fp8 cache 576 bytes": (_with(True, k_cache=lambda a: a["k_cache"][..., :576]), "'k_cache'"),
    "fp8 cache two heads": (_with(True, k_cache=lambda a: a["k_cache"].expand(-1, -1, 2, -1)), "'k_cache'"),
    "is_fp8_kvcache not a bool": (_with(is_fp8_kvcache=0), "'is_fp8_kvcache'"),
    "head_dim_v 576": (_with(head_dim_v=576), "'head_dim_v'"),
    "head_dim_v a bool": (_with(head_dim_v=True), "'head_dim_v'"),
    "block_table int64": (_with(block_table=lambda a: a["block_table"].long()), "'block_table'"),
    "block_table 1-D": (_with(block_table=lambda a: a["block_table"][0]), "'block_table'"),
    "block_table wrong batch": (_with(block_table=lambda a: a["block_table"][:1]), "'block_table'"),
    "block_table None for dense": (_with(block_table=None), "'block_table'"),
    "block_table used entry past the cache": (
        _with(block_table=lambda a: a["block_table"].index_fill(1, torch.tensor([0]), 10 ** 6)), "'block_table'"),
    "block_table used entry negative": (
        _with(block_table=lambda a: a["block_table"].index_fill(1, torch.tensor([0]), -1)), "'block_table'"),
    "block_table on another device": (_with(block_table=lambda a: a["block_table"].to("meta")), "'block_table'"),
    "cache_seqlens int64": (_with(cache_seqlens=lambda a: a["cache_seqlens"].long()), "'cache_seqlens'"),
    "cache_seqlens 2-D": (_with(cache_seqlens=lambda a: a["cache_seqlens"][None]), "'cache_seqlens'"),
    "cache_seqlens wrong length": (_with(cache_seqlens=lambda a: a["cache_seqlens"][:1]), "'cache_seqlens'"),
    "cache_seqlens None for dense": (_with(cache_seqlens=None), "'cache_seqlens'"),
    "cache_seqlens negative": (_with(cache_seqlens=torch.tensor([-1, 70], dtype=torch.int32)), "'cache_seqlens'"),
    "cache_seqlens past the table": (_with(cache_seqlens=torch.tensor([5, 10 ** 4], dtype=torch.int32)),
                                     "'cache_seqlens'"),
    "softmax_scale a string": (_with(softmax_scale="0.1"), "'softmax_scale'"),
    "softmax_scale nan": (_with(softmax_scale=float("nan")), "'softmax_scale'"),
    "softmax_scale inf": (_with(softmax_scale=float("inf")), "'softmax_scale'"),
    "causal not a bool": (_with(causal=1), "'causal'"),
    "indices with a bf16 cache": (_with(indices=torch.zeros(2, 2, 4, dtype=torch.int32)), "'indices'"),
    "indices int64": (_with(True, indices=lambda a: a["indices"].long()), "'indices'"),
    "indices 2-D": (_with(True, indices=lambda a: a["indices"][0]), "'indices'"),
    "indices wrong batch": (_with(True, indices=lambda a: a["indices"][:1]), "'indices'"),
    "indices wrong s_q": (_with(True, indices=lambda a: a["indices"][:, :1]), "'indices'"),
    "indices topk 0": (_with(True, indices=lambda a: a["indices"][..., :0]), "'indices'"),
    "indices below -1": (_with(True, indices=lambda a: a["indices"].index_fill(2, torch.tensor([0]), -2)),
                         "'indices'"),
    "indices past the cache": (_with(True, indices=lambda a: a["indices"].index_fill(2, torch.tensor([0]), 10 ** 6)),
                               "'indices'"),
    "indices on another device": (_with(True, indices=lambda a: a["indices"].to("meta")), "'indices'"),
    "indices with causal": (_with(True, causal=True), "'causal'"),
    "metadata a tensor": (_with(tile_scheduler_metadata=torch.zeros(1, 8, dtype=torch.int32)),
                          "'tile_scheduler_metadata'"),
    "metadata None": (_with(tile_scheduler_metadata=None), "'tile_scheduler_metadata'"),
    "metadata other batch": (_with(tile_scheduler_metadata=lambda a: _meta(cache_seqlens=a["cache_seqlens"][:1])),
                             "'tile_scheduler_metadata'"),
    "metadata other s_q": (_with(tile_scheduler_metadata=lambda a: _meta(num_q_tokens_per_head_k=4)),
                           "'tile_scheduler_metadata'"),
    "metadata other h_q": (_with(tile_scheduler_metadata=lambda a: _meta(num_q_tokens_per_head_k=16,
                                                                         num_heads_q=8)),
                           "'tile_scheduler_metadata'"),
    "metadata for fp8": (_with(tile_scheduler_metadata=lambda a: _meta(is_fp8_kvcache=True)),
                         "'tile_scheduler_metadata'"),
    "metadata dense for sparse": (_with(True, tile_scheduler_metadata=lambda a: _meta(is_fp8_kvcache=True)),
                                  "'tile_scheduler_metadata'"),
    "metadata other topk": (_with(True, tile_scheduler_metadata=lambda a: _meta(is_fp8_kvcache=True, topk=9)),
                            "'tile_scheduler_metadata'"),
    "num_splits of another call": (_with(num_splits=torch.arange(3, dtype=torch.int32)), "'num_splits'"),
    "out fp32": (_with(out=torch.empty(2, 2, 4, 512)), "'out'"),
    "out wrong shape": (_with(out=torch.empty(2, 2, 4, 576, dtype=torch.bfloat16)), "'out'"),
    "out not contiguous": (_with(out=torch.empty(2, 2, 512, 4, dtype=torch.bfloat16).transpose(2, 3)), "'out'"),
    "out on another device": (_with(out=torch.empty(2, 2, 4, 512, dtype=torch.bfloat16, device="meta")), "'out'"),
    "lse bf16": (_with(lse=torch.empty(2, 4, 2, dtype=torch.bfloat16)), "'lse'"),
    "lse [b, s_q, h_q]": (_with(lse=torch.empty(2, 2, 4)), "'lse'"),
}


@pytest.mark.parametrize("name", list(BAD_DECODE))
def test_flash_mla_with_kvcache_bad_input(name):
    build, arg = BAD_DECODE[name]
    args = build()
    with pytest.raises(pk.ContractError, match=arg):
        pk.flash_mla_with_kvcache(**args)


def test_sparse_decode_needs_no_block_table_or_lengths():
    args = _base(sparse=True)
    want = pk.flash_mla_with_kvcache(**args)
    args.update(block_table=None, cache_seqlens=None)
    got = pk.flash_mla_with_kvcache(**args)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_metadata_of_another_backend_is_refused(exp_backend):
    args = _base()
    args.update(tile_scheduler_metadata=mla.MlaMetadata(exp_backend, 2, 8, 1, 4, False, None), num_splits=None)
    with pytest.raises(pk.ContractError, match="'tile_scheduler_metadata'.*backend"):
        pk.flash_mla_with_kvcache(**args)


LENGTHS = torch.tensor([5, 70], dtype=torch.int32)
BAD_METADATA = {
    "cache_seqlens int64": (dict(cache_seqlens=LENGTHS.long()), "'cache_seqlens'"),
    "cache_seqlens 2-D": (dict(cache_seqlens=LENGTHS[None]), "'cache_seqlens'"),
    "cache_seqlens a list": (dict(cache_seqlens=[5, 70]), "'cache_seqlens'"),
    "num_q_tokens_per_head_k 0": (dict(num_q_tokens_per_head_k=0), "'num_q_tokens_per_head_k'"),
    "num_q_tokens_per_head_k float": (dict(num_q_tokens_per_head_k=8.0), "'num_q_tokens_per_head_k'"),
    "num_heads_k bool": (dict(num_heads_k=True), "'num_heads_k'"),
    "num_heads_k 0": (dict(num_heads_k=0), "'num_heads_k'"),
    "num_heads_q not a multiple of num_heads_k": (dict(num_heads_k=3), "'num_heads_q'"),
    "num_heads_q inconsistent with tokens": (dict(num_q_tokens_per_head_k=6), "'num_heads_q'"),
    "is_fp8_kvcache None": (dict(is_fp8_kvcache=None), "'is_fp8_kvcache'"),
    "topk 0": (dict(is_fp8_kvcache=True, topk=0), "'topk'"),
    "topk without fp8": (dict(topk=8), "'topk'"),
    "topk without num_heads_q": (dict(is_fp8_kvcache=True, topk=8, num_heads_q=None), "'topk'"),
}


@pytest.mark.parametrize("name", list(BAD_METADATA))
def test_get_mla_metadata_bad_input(name):
    changes, arg = BAD_METADATA[name]
    with pytest.raises(pk.ContractError, match=arg):
        _meta(**changes)


def test_cpu_conformance_quick_passes():
    report = run_conformance(backend="cpu", ops=["get_mla_metadata", "flash_mla_with_kvcache"], quick=True)
    assert report.ok, report.format_table()
