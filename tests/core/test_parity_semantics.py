"""The semantic-layer pieces the drop-in modules stand on: quantized results that behave like their
(data, scale) pair, DeepGEMM's packed int32 scales in raw pairs, per-channel casts, the nn/tn/tt and
K-grouped contracts' checks, and the settable contiguous alignment."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.alignment import padding_rows
from portable_kernels.layouts import contiguous_m_indices, psum_layout, sm100_ue8m0_encode
from portable_kernels.testing.generators import randn


@pytest.fixture(autouse=True)
def _reset_alignment():
    yield
    pk.set_mk_alignment_for_contiguous_layout(None)


def test_quant_tensor_behaves_like_its_pair():
    q = pk.per_token_cast_to_fp8(randn(4, 256, seed=1))
    data, scale = q
    assert len(q) == 2 and q[0] is q.data is data and q[1] is q.scale is scale and q[-1] is q.scale
    assert (q[0].T, q[1].T)[0].shape == (256, 4)
    with pytest.raises(IndexError):
        q[2]
    with pytest.raises(TypeError):
        q["data"]


def test_prepared_tensor_behaves_like_the_pair_of_its_stored_bytes():
    q = pk.per_token_cast_to_fp8(randn(4, 512, seed=2), use_ue8m0=True)
    p = pk.prepare_inputs("fp8_gemm_nt", backend="nvidia", arch="sm100", a=q)["a"]
    data, scale = p
    assert len(p) == 2 and p[0] is p.data and scale is p.scale and scale.dtype == torch.int32


def test_raw_pair_with_packed_int32_scales_is_decoded_exactly():
    x, w = randn(8, 512, seed=3), randn(32, 512, seed=4)
    a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_token_cast_to_fp8(w, use_ue8m0=True)
    d1, d2 = torch.empty(8, 32), torch.empty(8, 32)
    pk.fp8_gemm_nt(a, b, d1)
    k_major = pk.layouts.ue8m0_exponents(a.scale).view(torch.int32)      # DeepGEMM's casts' packed form
    pk.fp8_gemm_nt((a.data, k_major), (b.data, sm100_ue8m0_encode(b.scale)), d2)
    assert torch.equal(d1, d2)
    prepared = pk.prepare_inputs("fp8_gemm_nt", a=(a.data, k_major))["a"]
    assert torch.equal(prepared.scale, a.scale)


def test_packed_scales_with_an_impossible_word_count_are_refused():
    a = pk.per_token_cast_to_fp8(randn(8, 512, seed=5), use_ue8m0=True)
    with pytest.raises(pk.ContractError, match="'a'"):
        pk.fp8_gemm_nt((a.data, torch.zeros(8, 3, dtype=torch.int32)), a, torch.empty(8, 8))


def test_per_channel_cast_scales_gran_k_rows_of_each_column():
    x = randn(300, 64, seed=6)
    q = pk.per_channel_cast_to_fp8(x, gran_k=128)
    assert q.granularity == (128, 1) and q.scale.shape == (3, 64)
    assert pk.calc_diff(pk.dequantize(q), x) < 1e-3
    with pytest.raises(pk.ContractError, match="convention"):
        pk.per_channel_cast_to_fp8(x, convention="tile")


def test_transposed_gemm_prepared_nt_views_convert_nothing():
    x, w = randn(16, 256, seed=7), randn(64, 256, seed=8)
    a, b = pk.per_token_cast_to_fp8(x), pk.per_block_cast_to_fp8(w)
    stored_b = (b.data.T.contiguous(), b.scale.T.contiguous())      # B stored [K, N] for the nn form
    prepared = pk.prepare_inputs("fp8_gemm_nn", a=a, b=(stored_b[0].mT, stored_b[1].mT))
    pk.reset_implicit_conversions()
    d, ref = torch.empty(16, 64), torch.empty(16, 64)
    pk.fp8_gemm_nn(prepared["a"], prepared["b"], d)
    assert pk.implicit_conversions() == 0
    pk.fp8_gemm_nt(a, b, ref)
    assert pk.calc_diff(d, ref) < 1e-6  # the nt GEMM may run another provider (another summation order)


def test_transposed_gemm_refuses_fp4_in_a_transposed_slot():
    a = pk.per_token_cast_to_fp8(randn(4, 64, seed=9))
    b = pk.per_token_cast_to_fp4(randn(64, 32, seed=10))
    with pytest.raises(pk.ContractError, match="'b'"):
        pk.fp8_gemm_nn(a, b, torch.empty(4, 32))


def _k_grouped_args(ks, m=8, n=16):
    total = sum(ks)
    a = (torch.zeros(total, m, dtype=torch.float8_e4m3fn), torch.ones(sum(-(-k // 128) for k in ks), m))
    b = (torch.zeros(total, n, dtype=torch.float8_e4m3fn), torch.ones(sum(-(-k // 128) for k in ks), n))
    return a, b, torch.empty(len(ks), m, n), torch.tensor(ks, dtype=torch.int32)


@pytest.mark.parametrize("case,arg", [("k not aligned", "ks_cpu"), ("layout differs", "grouped_layout"),
                                      ("psum in nt", "use_psum_layout"), ("no ks", "ks_cpu"),
                                      ("psum too short", "grouped_layout")])
def test_k_grouped_layout_errors_are_typed(case, arg):
    a, b, d, layout = _k_grouped_args([128, 256])
    with pytest.raises(pk.ContractError, match=f"'{arg}'"):
        if case == "k not aligned":
            a, b, d, layout = _k_grouped_args([100, 256])
            pk.k_grouped_fp8_gemm_tn_contiguous(a, b, d, [100, 256], layout)
        elif case == "layout differs":
            pk.k_grouped_fp8_gemm_tn_contiguous(a, b, d, [128, 256], layout.flip(0))
        elif case == "psum in nt":
            pk.k_grouped_fp8_gemm_nt_contiguous((a[0].flatten(), a[1].T), (b[0].flatten(), b[1].T), d, [128, 256],
                                                layout, use_psum_layout=True)
        elif case == "no ks":
            pk.k_grouped_fp8_gemm_tn_contiguous(a, b, d, None, layout)
        else:
            pk.k_grouped_fp8_gemm_tn_contiguous(a, b, d, None, torch.tensor([100, 110], dtype=torch.int32),
                                                use_psum_layout=True)


def test_padding_rows_of_both_contiguous_forms_need_no_host_read():
    counts = torch.tensor([3, 0, 5])
    m_indices = contiguous_m_indices(counts, 4)
    psum = psum_layout(counts, 4)
    assert torch.equal(padding_rows(m_indices, False, 4, 12), m_indices < 0)
    assert torch.equal(padding_rows(psum, True, 4, 14), torch.cat((m_indices < 0, torch.ones(2, dtype=torch.bool))))


def test_the_settable_alignment_drives_layout_checks_and_defaults():
    assert pk.get_m_alignment_for_contiguous_layout() == 128
    pk.set_mk_alignment_for_contiguous_layout(224)
    assert pk.get_mk_alignment_for_contiguous_layout() == 224
    with pk.use_backend("ascend"):
        assert pk.get_m_alignment_for_contiguous_layout() == 224   # the setting wins over the backend's 256
    counts = torch.tensor([200, 40])
    psum = psum_layout(counts, 224)                                # group 1 starts at 224, not 256
    a = randn(448, 64, seed=11, dtype=torch.bfloat16)
    b = randn(2, 8, 64, seed=12, dtype=torch.bfloat16)
    d = torch.full((448, 8), float("nan"))
    pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, psum, use_psum_layout=True)
    ref = torch.cat((a[:200].float() @ b[0].float().T, a[224:264].float() @ b[1].float().T))
    assert pk.calc_diff(torch.cat((d[:200], d[224:264])), ref) < 1e-5
    assert not torch.cat((d[200:224], d[264:])).any()
    pk.set_mk_alignment_for_contiguous_layout(None)
    m_indices = contiguous_m_indices(counts, 224)
    with pytest.raises(pk.ContractError, match="m_indices"):       # built with 224, read with 128
        pk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices)
