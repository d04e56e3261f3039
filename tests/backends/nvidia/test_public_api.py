"""The user's journey on the nvidia backend in emulation, through the public API only: weights
prepared once, activations quantized straight into the consumer's Format by the Triton quantizer
(`prepare_for`, nothing converted in the call), the GEMM on the Triton kernel."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.layouts import SM90, SM100  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402


@pytest.mark.parametrize("arch,fmt", [("sm90", SM90), ("sm100", SM100)])
def test_prepare_for_emits_the_consumers_bytes_and_the_gemm_runs_on_triton(arch, fmt):
    x, w = randn(5, 300, seed=1), randn(130, 300, seed=2, scale=0.05)
    with pk.use_backend("nvidia", arch=arch), trace_providers() as ran:
        a = pk.per_token_cast_to_fp8(x, use_ue8m0=True, prepare_for=pk.fp8_gemm_nt)
        b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(w, use_ue8m0=True))["b"]
        d = torch.empty(5, 130)
        pk.fp8_gemm_nt(a, b, d)
    assert a.format is fmt and b.format is fmt and pk.implicit_conversions() == 0
    assert ("per_token_cast_to_fp8", "nvidia", "triton") in ran and ran[-1] == ("fp8_gemm_nt", "nvidia", "triton")
    # the directly emitted scales are the bytes the Format's own encoder writes
    reference = pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia", arch=arch,
                                  a=pk.per_token_cast_to_fp8(x, use_ue8m0=True))["a"]
    assert a.scale.stride() == reference.scale.stride() and torch.equal(a.scale, reference.scale)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
    assert pk.calc_diff(d, ref) < 1e-12


def test_swiglu_quantizer_feeds_the_grouped_gemm_without_conversions():
    g, n, k = 2, 64, 256
    counts = torch.tensor([3, 70])
    m_indices = pk.layouts.contiguous_m_indices(counts, 128)
    h = randn(m_indices.numel(), 2 * k, seed=3)
    w = randn(g, n, k, seed=4, scale=0.05)
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        a = pk.swiglu_forward_and_per_token_cast(h, pos_to_expert=m_indices, round_sf=True,
                                                 prepare_for=pk.m_grouped_fp8_gemm_nt_contiguous)
        b = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, b=pk.per_block_cast_to_fp8(w))["b"]
        d = torch.full((m_indices.numel(), n), float("nan"))
        pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    assert {provider for _, _, provider in ran} == {"triton"} and pk.implicit_conversions() == 0
    valid = m_indices >= 0
    # padding rows are zeroed by the op (DeepGEMM's ensure_zero_padding=True default); valid rows computed
    assert (d[~valid] == 0).all() and torch.isfinite(d[valid]).all()


def test_topk_and_mla_through_the_public_ops():
    x = randn(3, 500, seed=5)
    with pk.use_backend("nvidia"), trace_providers() as ran:
        values, indices = pk.topk(x, 10, sorted=True)
    assert ran == [("topk", "nvidia", "triton")]
    assert torch.equal(values, x.topk(10).values)
    from portable_kernels.testing.mla_cases import build_paged_cache, random_kv
    paged = build_paged_cache(random_kv((100, 7), 1, 576, seed=6), 64, seed=6)
    q = randn(2, 1, 16, 576, seed=7, dtype=torch.bfloat16)
    with pk.use_backend("nvidia"), trace_providers() as ran:
        meta, splits = pk.get_mla_metadata(paged.cache_seqlens, 16, 1)
        out, lse = pk.flash_mla_with_kvcache(q, paged.k_cache, paged.block_table, paged.cache_seqlens, 512, meta,
                                             splits)
    assert [p for _, _, p in ran] == ["triton", "triton"] and len(meta.tensors) == 1
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
