"""The vendor providers' call building, checked on CPU: torch._grouped_mm runs (torch's CPU
fallback); torch._scaled_mm's block scaling cannot run on CPU, so its arguments go through a model
of torch's documented checks and math; DeepGEMM, FlashMLA and DeepSelect are replaced by stand-ins
that compute the contract math from exactly the arguments they are handed."""

from __future__ import annotations

import types

import pytest
import torch

from portable_kernels.backends.nvidia.vendor import deep_gemm, deep_select, flash_mla, grouped_mm, scaled_mm
from portable_kernels.ops.gemm.grouped import grouped_gemm_contiguous_reference, grouped_gemm_masked_reference
from portable_kernels.layouts import contiguous_m_indices, psum_layout, sm100_ue8m0_decode, sm90_sfa_encode
from portable_kernels.ops.attention.decode import HEAD_DIM_V, mla_decode_reference
from portable_kernels.core.numerics import calc_diff
from portable_kernels.ops.quant.fp8 import dequantize_reference, quantize_blocks_reference
from portable_kernels.core.tensors import QuantTensor
from portable_kernels.testing.generators import poison, randn
from portable_kernels.testing.mla_cases import build_paged_cache, random_kv
from portable_kernels.ops.topk import topk_reference

NEEDS_TRITON = False


def _q(shape, gran, seed):
    data, sf = quantize_blocks_reference(randn(*shape, seed=seed), gran[0], gran[1], False)
    return QuantTensor(data, sf, gran)


# -- torch._scaled_mm ------------------------------------------------------------------------------

def _torch_scaled_mm_model(call: scaled_mm.ScaledMmCall) -> torch.Tensor:
    """torch._scaled_mm's blockwise rules (ScaledBlas.cpp) and math, for CPU tensors."""
    a, b, sa, sb = call.mat_a, call.mat_b, call.scale_a, call.scale_b
    m, k = a.shape
    n = b.shape[1]
    kb = -(-k // 128)
    assert k % 16 == 0 and n % 16 == 0 and b.shape[0] == k
    assert b.stride(0) == 1, "mat_b must be column-major"
    assert sa.shape == (m, kb) and sa.dtype == torch.float32 and (sa.stride(0) == 1 or m == 1)
    assert kb == 1 or sa.stride(1) == m, "BlockWise 1x128 scale_a strides must be (1, M)"
    sbt = sb.T
    if call.b_block == (128, 128):
        assert sbt.shape == (-(-n // 128), kb) and (kb == 1 or sbt.stride(1) == 1) and sbt.stride(0) == kb
        rows = sbt.repeat_interleave(128, 0)[:n]
    else:
        assert sbt.shape == (n, kb) and sbt.stride(0) == 1 and (kb == 1 or sbt.stride(1) == n)
        rows = sbt
    da = a.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    db = b.T.double() * rows.double().repeat_interleave(128, 1)[:, :k]
    return (da @ db.T).to(call.out_dtype)


@pytest.mark.parametrize("gran_b", [(128, 128), (1, 128)])
@pytest.mark.parametrize("m", [4, 8, 132])
def test_scaled_mm_arguments_are_views_of_sm90_bytes(m, gran_b):
    n, k = 256, 512
    qa, qb = _q((m, k), (1, 128), 1), _q((n, k), gran_b, 2)
    sfa = sm90_sfa_encode(qa.scale)
    sfb = qb.scale.contiguous() if gran_b[0] == 128 else sm90_sfa_encode(qb.scale)
    assert scaled_mm.reasons(m, n, k, sfa, sfb, (1, 128), gran_b, torch.bfloat16) == []
    call = scaled_mm.call_arguments(qa.data, sfa, qb.data, sfb, gran_b, torch.float32)
    for got, source in ((call.mat_a, qa.data), (call.mat_b, qb.data), (call.scale_a, sfa), (call.scale_b, sfb)):
        assert got.data_ptr() == source.data_ptr()  # views, no per-call copy
    ref = dequantize_reference(qa).double() @ dequantize_reference(qb).double().T
    assert calc_diff(_torch_scaled_mm_model(call), ref) < 1e-12


def test_scaled_mm_declines_what_cublaslt_cannot_take():
    sfa = sm90_sfa_encode(torch.ones(6, 4))
    reasons = scaled_mm.reasons(6, 100, 500, sfa, torch.ones(1, 4), (1, 128), (128, 128), torch.bfloat16)
    text = " ".join(reasons)
    assert "M = 6" in text and "K = 500" in text and "ceil(K/128)" not in text
    assert scaled_mm.reasons(4, 256, 384, sfa[:4], torch.ones(2, 3), (1, 128), (128, 128), torch.bfloat16)
    assert scaled_mm.device_reasons(torch.device("cpu"))


# -- torch._grouped_mm ---------------------------------------------------------------------------------

@pytest.mark.parametrize("psum", [False, True])
def test_grouped_mm_contiguous_writes_only_valid_rows(psum):
    counts, alignment, n, k = torch.tensor([5, 0, 70, 1]), 64, 32, 48
    m_indices = contiguous_m_indices(counts, alignment)
    layout = psum_layout(counts, alignment) if psum else m_indices
    m = m_indices.numel()
    a = randn(m, k, seed=1, dtype=torch.bfloat16)
    b = randn(4, n, k, seed=2, dtype=torch.bfloat16)
    d = poison(m, n, dtype=torch.bfloat16)
    assert grouped_mm.reasons(k, n, d.dtype) == []
    grouped_mm.run(grouped_mm.contiguous_call(a, b, layout, psum, alignment), d)
    valid = m_indices >= 0
    assert torch.isnan(d[~valid].float()).all()
    assert calc_diff(d[valid], grouped_gemm_contiguous_reference(a.double(), b.double(), m_indices)[valid]) < 1e-5


def test_grouped_mm_masked():
    a = randn(3, 20, 32, seed=3, dtype=torch.bfloat16)
    b = randn(3, 16, 32, seed=4, dtype=torch.bfloat16)
    masked_m = torch.tensor([0, 20, 7], dtype=torch.int32)
    d = poison(3, 20, 16, dtype=torch.bfloat16)
    grouped_mm.run(grouped_mm.masked_call(a, b, masked_m), d)
    rows = torch.arange(20)[None, :] < masked_m[:, None]
    assert torch.isnan(d[~rows].float()).all()
    assert calc_diff(d[rows], grouped_gemm_masked_reference(a.double(), b.double())[rows]) < 1e-5


def test_grouped_mm_declines_fp32_output_and_unaligned_dims():
    assert len(grouped_mm.reasons(30, 20, torch.float32)) == 2


# -- DeepGEMM, FlashMLA, DeepSelect stand-ins ----------------------------------------------------------------

def _decode_scales(sf: torch.Tensor, rows: int, k: int, gran: tuple[int, int]) -> torch.Tensor:
    if sf.dtype == torch.int32:
        return sm100_ue8m0_decode(sf, -(-k // gran[1])).contiguous()
    return sf.contiguous()


def _fake_deep_gemm(calls: list) -> types.SimpleNamespace:
    def fp8_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, disable_ue8m0_cast=False):
        calls.append(("fp8_gemm_nt", recipe, disable_ue8m0_cast))
        gm, gn, gk = recipe
        (ad, sa), (bd, sb) = a, b
        k = ad.shape[1]
        ga = (gm, gk) if sa.dtype == torch.float32 else (1, gk)
        gb = (gn, gk) if sb.dtype == torch.float32 else (1, gk)
        da = dequantize_reference(QuantTensor(ad, _decode_scales(sa, ad.shape[0], k, ga), ga))
        db = dequantize_reference(QuantTensor(bd, _decode_scales(sb, bd.shape[0], k, gb), gb))
        d.copy_(da @ db.T + (0 if c is None else c))

    def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m):
        calls.append(("masked", expected_m))
        rows = torch.arange(a.shape[1])[None, :] < masked_m[:, None]
        d[rows] = grouped_gemm_masked_reference(a, b)[rows].to(d.dtype)

    return types.SimpleNamespace(fp8_gemm_nt=fp8_gemm_nt, m_grouped_bf16_gemm_nt_masked=m_grouped_bf16_gemm_nt_masked)


@pytest.mark.parametrize("form", ["sm90", "sm100"])
def test_deep_gemm_call_passes_our_bytes_and_never_recasts(form):
    from portable_kernels.layouts import sm100_ue8m0_encode, sm100_ue8m0_encode_from_blocks
    m, n, k = 5, 256, 384
    ue8m0 = form == "sm100"
    qa = QuantTensor(*quantize_blocks_reference(randn(m, k, seed=1), 1, 128, ue8m0), (1, 128))
    qb = QuantTensor(*quantize_blocks_reference(randn(n, k, seed=2), 128, 128, ue8m0), (128, 128))
    if ue8m0:
        sfa, sfb, gb = sm100_ue8m0_encode(qa.scale), sm100_ue8m0_encode_from_blocks(qb.scale, n), (1, 128)
    else:
        sfa, sfb, gb = sm90_sfa_encode(qa.scale), qb.scale, (128, 128)
    calls: list = []
    d, c = torch.empty(m, n), randn(m, n, seed=3)
    deep_gemm.fp8_gemm_nt(qa.data, sfa, qb.data, sfb, d, c, (1, 128), gb).run(_fake_deep_gemm(calls))
    assert calls == [("fp8_gemm_nt", (1, gb[0], 128), True)]
    ref = dequantize_reference(qa).double() @ dequantize_reference(qb).double().T + c.double()
    assert calc_diff(d, ref) < 1e-12


def test_deep_gemm_grouped_calls_keep_padding_rows():
    call = deep_gemm.m_grouped_contiguous("a", "b", "d", "layout", True, 64)
    assert call.function == "m_grouped_bf16_gemm_nt_contiguous"
    assert call.kwargs == {"use_psum_layout": True, "ensure_zero_padding": False, "expected_m_for_psum_layout": 64}
    assert deep_gemm.grouped_reasons(torch.float32) and not deep_gemm.grouped_reasons(torch.bfloat16)
    a, b = randn(2, 8, 32, seed=1), randn(2, 16, 32, seed=2)
    d = poison(2, 8, 16, dtype=torch.float32)
    calls: list = []
    deep_gemm.m_grouped_masked(a, b, d, torch.tensor([3, 0]), 4).run(_fake_deep_gemm(calls))
    assert calls == [("masked", 4)] and torch.isnan(d[0, 3:]).all() and torch.isnan(d[1]).all()


def test_flash_mla_call_fills_the_contract_buffers():
    paged = build_paged_cache(random_kv((70, 5), 1, 576, seed=1), 64, seed=1)
    q = randn(2, 1, 16, 576, seed=2, dtype=torch.bfloat16)
    seen = {}

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits, **kw):
        seen.update(kw, sched=sched, num_splits=num_splits)
        o, s = mla_decode_reference(q, k_cache, block_table, cache_seqlens, head_dim_v, kw["softmax_scale"],
                                    kw["causal"], kw["is_fp8_kvcache"], kw["indices"])
        return o.to(torch.bfloat16), s

    lib = types.SimpleNamespace(get_mla_metadata=lambda: ("fresh-schedule", None),
                                flash_mla_with_kvcache=flash_mla_with_kvcache)
    out, lse = poison(2, 1, 16, HEAD_DIM_V, dtype=torch.bfloat16), poison(2, 16, 1, dtype=torch.float32)
    assert flash_mla.reasons(paged.k_cache, 1) == []
    flash_mla.decode_call(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V, 0.05, False, False,
                          None).run(out, lse, lib)
    assert seen["sched"] == "fresh-schedule" and seen["num_splits"] is None
    ref_out, ref_lse = mla_decode_reference(q, paged.k_cache, paged.block_table, paged.cache_seqlens, HEAD_DIM_V,
                                            0.05)
    assert calc_diff(out, ref_out) < 1e-5 and torch.equal(lse, ref_lse)
    assert flash_mla.reasons(torch.empty(3, 16, 2, 576), 2)


def test_deep_select_keywords_and_declines():
    x = randn(3, 100, seed=1)
    kwargs = deep_select.topk_kwargs(5, None, True, False, torch.int32, -1, -2.0, True)
    lib = types.SimpleNamespace(topk=lambda input, **kw: topk_reference(
        input, kw["topk"], kw["end"], kw["sorted"], kw["sorted_index"], kw["indices_type"],
        kw["idx_oob_fill_value"], kw["value_oob_fill_value"], kw["return_value"]))
    values, indices = deep_select.run(x, kwargs, lib)
    assert torch.equal(values, x.gather(1, indices.long())) and kwargs["abort_when_nan_found"]
    assert deep_select.reasons(x.bfloat16(), sorted=True, stride_bytes=32)
    assert deep_select.reasons(x[:, :50], sorted=False, stride_bytes=256)
    assert not deep_select.reasons(x, sorted=True, stride_bytes=16)
