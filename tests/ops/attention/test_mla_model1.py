"""flash_mla_with_kvcache over FlashMLA's MODEL1 pages (d_qk = d_v = 512, 584 bytes per token): the
contract's reference against an oracle written from the dequantized cache, the providers each
backend picks for it (the cache never converted), and the typed refusals."""

from __future__ import annotations

import math

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.layouts import FLASHMLA_MODEL1_FP8_KV, dequantize_model1_kv_cache, pack_model1_kv_cache
from portable_kernels.ops.attention.decode import (HEAD_DIM_V, MlaDecodeInputs, flash_mla_with_kvcache_kernel,
                                                   mla_decode_reference)
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import build_paged_cache, check_decode, random_indices, random_kv

OP = "flash_mla_with_kvcache"


def _case(seed: int, lengths=(150, 0, 40), block_size=16):
    paged = build_paged_cache(random_kv(lengths, 1, 512, seed=seed), block_size, seed=seed, fp8=True)
    indices, _ = random_indices(paged, 2, 48, seed=seed + 1)
    q = randn(len(lengths), 2, 16, 512, seed=seed + 2, dtype=torch.bfloat16)
    return paged, indices, q


def _oracle(q, cache, indices):
    """Sparse attention written from the dequantized pages (fp64): V is all 512 channels."""
    flat = dequantize_model1_kv_cache(cache, torch.float32).view(-1, 512).double()
    kv = flat[indices.clamp_min(0).long()].masked_fill((indices < 0).unsqueeze(-1), 0.0)  # slot 0 may be NaN
    logits = torch.einsum("bqhd,bqkd->bqhk", q.double(), kv) * 512 ** -0.5
    logits = logits.masked_fill((indices < 0).unsqueeze(2), -math.inf)
    lse = logits.logsumexp(-1)
    out = torch.einsum("bqhk,bqkd->bqhd", torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0), kv)
    return out, lse.masked_fill(torch.isneginf(lse), math.inf).transpose(1, 2)


def _decode(q, cache, indices, **kwargs):
    b, s_q, h_q, _ = q.shape
    meta, splits = pk.get_mla_metadata(torch.zeros(b, dtype=torch.int32), s_q * h_q, 1, h_q, True, indices.shape[-1])
    return pk.flash_mla_with_kvcache(q, cache, None, None, HEAD_DIM_V, meta, splits, is_fp8_kvcache=True,
                                     indices=indices, **kwargs)


def test_reference_reads_the_pages_as_the_oracle_does():
    paged, indices, q = _case(seed=1)
    out, lse = mla_decode_reference(q, paged.k_cache, None, None, HEAD_DIM_V, 512 ** -0.5, False, True, indices,
                                    dtype=torch.float64)
    want_out, want_lse = _oracle(q, paged.k_cache, indices)
    assert pk.calc_diff(out, want_out) < 1e-12
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    assert float((lse - want_lse).nan_to_num(0.0).abs().max()) < 1e-9


def test_the_reference_kernel_writes_poisoned_outputs_within_the_bounds():
    paged, indices, q = _case(seed=2)
    out = poison(3, 2, 16, 512, dtype=torch.bfloat16)
    lse = poison(3, 16, 2, dtype=torch.float32)
    meta = pk.MlaMetadata("cpu", 3, 32, 1, 16, True, 48)
    flash_mla_with_kvcache_kernel(MlaDecodeInputs(q, paged.k_cache, None, None, HEAD_DIM_V, 512 ** -0.5, False, True,
                                                  indices, meta, None, out, lse, FLASHMLA_MODEL1_FP8_KV))
    check_decode(out, lse, *_oracle(q, paged.k_cache, indices))


def test_cpu_decode_runs_native_on_the_pages_as_given():
    paged, indices, q = _case(seed=3, lengths=(300, 7), block_size=64)
    with trace_providers() as ran, pk.count_implicit_conversions() as n:
        out, lse = _decode(q, paged.k_cache.view(torch.float8_e4m3fn), indices)
    assert ("flash_mla_with_kvcache", "cpu", "native") in ran and n.count == 0
    check_decode(out, lse, *_oracle(q, paged.k_cache, indices))


@pytest.mark.parametrize("backend,options", [("ascend", {"soc": "950"}), ("ascend", {"soc": "910b"}),
                                             ("nvidia", {"arch": "sm100"})])
def test_other_backends_keep_the_pages_and_run_their_oracle(backend, options):
    paged, indices, q = _case(seed=4)
    with pk.use_backend(backend, **options):
        cache = pk.prepare_inputs(OP, k_cache=paged.k_cache)["k_cache"]
        assert cache.format is FLASHMLA_MODEL1_FP8_KV                      # no other order: the same bytes
        assert cache.data.data_ptr() == paged.k_cache.data_ptr()
        with trace_providers() as ran, pk.count_implicit_conversions() as n:
            out, lse = _decode(q, cache, indices)
    assert (OP, backend, "layout-reference") in ran and n.count == 0
    check_decode(out, lse, *_oracle(q, paged.k_cache, indices))


def test_dense_decode_over_model1_pages_matches_the_reference():
    paged = build_paged_cache(random_kv((70, 3), 1, 512, seed=5), 2, seed=5, fp8=True)
    q = randn(2, 1, 8, 512, seed=6, dtype=torch.bfloat16)
    meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 8, 1, 8, True)
    out, lse = pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta,
                                         splits, is_fp8_kvcache=True)
    ref = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, 512 ** -0.5,
                               False, True, None, dtype=torch.float64)
    check_decode(out, lse, *ref)


def test_a_wrong_token_size_is_refused_naming_both_layouts():
    _, indices, q = _case(seed=7)
    cache = torch.zeros(12, 16, 1, 600, dtype=torch.uint8)
    with pytest.raises(pk.ContractError, match=r"k_cache.*656.*584"):
        _decode(q, cache, indices)


def test_q_of_head_dim_576_with_model1_pages_is_refused():
    paged, indices, _ = _case(seed=8)
    q = randn(3, 2, 16, 576, seed=9, dtype=torch.bfloat16)
    with pytest.raises(pk.ContractError, match=r"q.*512 for the MODEL1 cache"):
        _decode(q, paged.k_cache, indices)


def test_a_v32_cache_with_q_of_head_dim_512_is_refused():
    v32 = build_paged_cache(random_kv((40,), 1, 576, seed=10), 16, seed=10, fp8=True)
    indices, _ = random_indices(v32, 1, 8, seed=11)
    q = randn(1, 1, 16, 512, seed=12, dtype=torch.bfloat16)
    with pytest.raises(pk.ContractError, match=r"q.*576 for the FP8 cache"):
        _decode(q, v32.k_cache, indices)


def test_pages_whose_tokens_are_not_contiguous_are_refused():
    k = randn(4, 16, 2, 512, seed=13, dtype=torch.bfloat16)
    both = torch.stack([pack_model1_kv_cache(k[:, :, h:h + 1]) for h in range(2)], dim=2).squeeze(3)
    split = both[:, :, :1]                                  # two caches interleaved: stride(1) = 2·584
    _, indices, q = _case(seed=14, lengths=(30, 0, 5))
    with pytest.raises(pk.ContractError, match=r"k_cache.*stride\(1\) = 584"):
        _decode(q, split, indices)


def test_write_kv_cache_refuses_model1_pages_with_the_fix():
    paged, _, _ = _case(seed=15)
    kv = randn(2, 576, seed=16, dtype=torch.bfloat16)
    with pytest.raises(pk.ContractError, match="quantize_k_cache"):
        pk.write_kv_cache(paged.k_cache, torch.tensor([0, 1]), torch.tensor([0, 0]), kv)
