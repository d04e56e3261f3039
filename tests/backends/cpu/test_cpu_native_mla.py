"""The cpu backend's native MLA decode (backends/cpu/providers/mla.py, kernels/mla.cpp): its split plan, results that do not
depend on how the keys are split, a plan reused after sequences grew, and the contract's refusals
before any cache byte is read."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers import mla as nm
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.errors import ContractError
from portable_kernels.ops.attention.decode import HEAD_DIM_V, MlaDecodeInputs, mla_decode_reference
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import build_paged_cache, check_decode, random_indices, random_kv

pytestmark = pytest.mark.skipif(not nm.available(), reason="native MLA needs the built library")


@pytest.fixture(params=["fma", "amx"])
def engine(request):
    """Each engine this CPU runs: FMA everywhere, AMX where the CPU has AMX-BF16."""
    if request.param not in nm.engines():
        pytest.skip(f"the {request.param} engine does not run on this CPU (engines here: {nm.engines()})")
    return request.param


def test_fma_runs_everywhere_and_amx_is_the_default_where_it_runs():
    assert "fma" in nm.engines()
    assert nm.engine() == ("amx" if "amx" in nm.engines() else "fma")


def test_the_plan_covers_every_job_with_an_open_last_split():
    splits, num_splits = nm.mla_split_plan([3000, 0, 700, 10], jobs_per_batch=2, threads=4)
    for job in range(4):
        rows = splits[splits[:, 0] == job]
        assert rows[0, 1] == 0 and rows[-1, 2] == nm.OPEN_END  # from key 0, open at the end
        assert bool((rows[1:, 1] == rows[:-1, 2]).all())       # consecutive ranges
        assert (rows[:, 3] >= 0).all() == (len(rows) > 1)      # partial slots only for split jobs
    assert num_splits.tolist() == [0, int((splits[:, 0] < 2).sum()), splits.shape[0]]
    assert splits.shape[0] > 4  # 3700 keys over 4 threads: the long job is cut


def _paged(lengths, fp8, seed, h_kv=1, d=576):
    sequences = random_kv(lengths, h_kv, d, seed=seed)
    return build_paged_cache(sequences, 64, seed=seed, fp8=fp8)


def _call(paged, q, plan, causal=False, indices=None, engine=None):
    b, s_q, h_q, _ = q.shape
    out = poison(b, s_q, h_q, HEAD_DIM_V, dtype=torch.bfloat16)
    lse = poison(b, h_q, s_q, dtype=torch.float32)
    meta = pk.MlaMetadata("cpu", b, s_q * h_q, 1, h_q, paged.is_fp8, None if indices is None else indices.shape[-1],
                          (plan,), None)
    nm.decode_native(MlaDecodeInputs(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                     q.shape[-1] ** -0.5, causal, paged.is_fp8, indices, meta, None, out, lse), engine)
    return out, lse


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_results_do_not_depend_on_the_split(fp8, causal, engine):
    lengths = [700, 0, 129]
    paged = _paged(lengths, fp8, seed=5)
    q = randn(3, 2, 16, 576, seed=6, dtype=torch.bfloat16)
    one = nm.mla_split_plan(lengths, 1, threads=1)[0]
    many = torch.tensor([[0, 0, 64, 0], [0, 64, 300, 1], [0, 300, nm.OPEN_END, 2], [1, 0, nm.OPEN_END, -1],
                         [2, 0, 100, 3], [2, 100, nm.OPEN_END, 4]], dtype=torch.int64)
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            576 ** -0.5, causal, fp8, None, dtype=torch.float64)
    for plan in (one, many):
        out, lse = _call(paged, q, plan, causal, engine=engine)
        check_decode(out, lse, ref_out, ref_lse)
    assert bool(torch.isinf(lse[1]).all()) and bool((out[1] == 0).all())  # an empty sequence


def test_sparse_decode_with_invalid_indices(engine):
    paged = _paged([300, 5], True, seed=7)
    indices, _ = random_indices(paged, 2, 128, seed=8)
    q = randn(2, 2, 16, 576, seed=9, dtype=torch.bfloat16)
    plan = nm.mla_split_plan([128] * 4, 2, threads=2)[0]
    out, lse = _call(paged, q, plan, indices=indices, engine=engine)
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, None, None, HEAD_DIM_V, 576 ** -0.5, False, True,
                                            indices, dtype=torch.float64)
    check_decode(out, lse, ref_out, ref_lse)


def test_a_plan_reused_after_the_sequences_grew_still_covers_them(engine):
    short = _paged([100], False, seed=10)
    plan = nm.mla_split_plan([100], 1, threads=1)[0]
    grown = _paged([1000], False, seed=10)
    q = randn(1, 1, 16, 576, seed=11, dtype=torch.bfloat16)
    out, lse = _call(grown, q, plan, engine=engine)
    ref_out, ref_lse = mla_decode_reference(q, grown.k_cache, grown.block_table, grown.cache_seqlens, HEAD_DIM_V,
                                            576 ** -0.5, False, False, None, dtype=torch.float64)
    check_decode(out, lse, ref_out, ref_lse)
    assert short.cache_seqlens.item() == 100


@pytest.mark.parametrize("fp8", [False, True])
def test_128_heads_over_chunk_boundaries(fp8, engine):
    """DeepSeek's 128 query heads (row blocks of 6 leave 2), lengths that end mid-chunk, a shuffled table."""
    lengths = [64 * 9 + 13, 63, 1]
    paged = _paged(lengths, fp8, seed=14)
    q = randn(3, 1, 128, 576, seed=15, dtype=torch.bfloat16, scale=0.3)
    out, lse = _call(paged, q, nm.mla_split_plan(lengths, 1, threads=2)[0], engine=engine)
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            576 ** -0.5, False, fp8, None, dtype=torch.float64)
    check_decode(out, lse, ref_out, ref_lse)


def test_an_engine_this_cpu_lacks_is_refused_by_name():
    paged = _paged([10], False, seed=16)
    q = randn(1, 1, 16, 576, seed=17, dtype=torch.bfloat16)
    missing = [name for name in nm.ENGINES if name not in nm.engines()] or ["vector"]
    with pytest.raises(ValueError, match=f"engine='{missing[0]}'"):
        _call(paged, q, nm.mla_split_plan([10], 1, threads=1)[0], engine=missing[0])


def test_public_decode_runs_native_and_refuses_bad_references_first():
    paged = _paged([200, 70], True, seed=12)
    q = randn(2, 1, 16, 576, seed=13, dtype=torch.bfloat16)
    with trace_providers() as ran:
        meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1, 16, True)
        pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, meta, splits,
                                  is_fp8_kvcache=True)
    assert ("flash_mla_with_kvcache", "cpu", "native") in ran and ("get_mla_metadata", "cpu", "native") in ran
    bad = paged.block_table.clone()
    bad[0, 0] = 10 ** 6  # a used entry outside the cache
    with pytest.raises(ContractError, match="block_table"):
        pk.flash_mla_with_kvcache(q, paged.k_cache, bad, paged.cache_seqlens, HEAD_DIM_V, meta, splits,
                                  is_fp8_kvcache=True)


# -- FlashMLA's MODEL1 pages (d = 512, 584 bytes per token, laid out per page) ----------------------------

@pytest.mark.parametrize("block_size", [64, 2, 69])
def test_model1_sparse_results_do_not_depend_on_the_split(block_size):
    paged = _paged([700, 5, 129], True, seed=21, d=512) if block_size == 64 else \
        build_paged_cache(random_kv([700, 5, 129], 1, 512, seed=21), block_size, seed=21, fp8=True)
    assert paged.k_cache.shape[-1] == 584
    indices, _ = random_indices(paged, 2, 600, seed=22)
    q = randn(3, 2, 16, 512, seed=23, dtype=torch.bfloat16)
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, None, None, HEAD_DIM_V, 512 ** -0.5, False, True,
                                            indices, dtype=torch.float64)
    one = nm.mla_split_plan([600] * 6, 2, threads=1)[0]
    many = nm.mla_split_plan([600] * 6, 2, threads=8)[0]
    assert many.shape[0] > one.shape[0]
    for plan in (one, many):
        out, lse = _call(paged, q, plan, indices=indices, engine="fma")
        check_decode(out, lse, ref_out, ref_lse)


def test_model1_dense_decode_reads_pages_through_the_block_table():
    paged = build_paged_cache(random_kv([300, 0, 65], 1, 512, seed=24), 16, seed=24, fp8=True)
    q = randn(3, 2, 16, 512, seed=25, dtype=torch.bfloat16)
    ref = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, 512 ** -0.5,
                               True, True, None, dtype=torch.float64)
    out, lse = _call(paged, q, nm.mla_split_plan([300, 0, 65], 1, threads=4)[0], causal=True)
    check_decode(out, lse, *ref)


def test_model1_pages_are_refused_on_the_amx_engine():
    paged = build_paged_cache(random_kv([40], 1, 512, seed=26), 16, seed=26, fp8=True)
    indices, _ = random_indices(paged, 1, 8, seed=27)
    q = randn(1, 1, 16, 512, seed=28, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="engine='fma'"):
        _call(paged, q, nm.mla_split_plan([8], 1, threads=1)[0], indices=indices, engine="amx")
