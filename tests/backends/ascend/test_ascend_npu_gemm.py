"""The ascend GEMM / grouped GEMM / cast providers against the documented-semantics stand-in of torch_npu.

These prove the provider code calls npu_quant_matmul, npu_grouped_matmul and npu_dynamic_mx_quant as
their documentation says (argument names, dtypes, scale pair layouts and transposition, group sizes,
group lists) and that the documented math then equals the contract. They do not prove what an NPU
computes (docs/ascend.md).
"""

import pytest
import torch

from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend.vendor import gemm as npu_gemm, grouped as npu_grouped, quant as npu_quant
from portable_kernels.ops.gemm.dense import gemm_reference
from portable_kernels.ops.gemm.grouped import grouped_gemm_contiguous_reference
from portable_kernels.layouts import (ascend_mx_kmajor_encode_from_blocks, contiguous_m_indices, psum_layout,
                                      regranularize_k)
from portable_kernels.core.numerics import calc_diff
from portable_kernels.ops.quant.fp8 import dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import poison, randn

BF16_BOUND = 1e-5
FP32_BOUND = 1e-6


def _operands(m, n, k, ue8m0, seed=0):
    a = per_token_cast_to_fp8(randn(m, k, seed=seed, dtype=torch.bfloat16), use_ue8m0=ue8m0)
    b = per_block_cast_to_fp8(randn(n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5), use_ue8m0=ue8m0)
    return a, b


def _pairs(q, rows, k, block_mn):
    return ascend_mx_kmajor_encode_from_blocks(q.scale, rows, k, block_mn=block_mn, block_k=128)


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (3, 130, 300), (64, 256, 1024), (17, 1, 7)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_mx_gemm_on_950_matches_dequantized_reference(m, n, k, out_dtype):
    npu = make_stand_in("950")
    a, b = _operands(m, n, k, ue8m0=True)
    d = poison(m, n, dtype=out_dtype)
    npu_gemm.mx_fp8_gemm_nt(npu, a.data, _pairs(a, m, k, 1), b.data, _pairs(b, n, k, 128), d, None)
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double())
    assert calc_diff(d, ref) < (FP32_BOUND if out_dtype == torch.float32 else BF16_BOUND)
    assert npu.calls == ["npu_quant_matmul"]


def test_mx_gemm_adds_c_in_fp32_before_rounding():
    npu = make_stand_in("950")
    a, b = _operands(5, 64, 256, ue8m0=True, seed=3)
    c = randn(5, 64, seed=9)
    d = poison(5, 64, dtype=torch.float32)
    npu_gemm.mx_fp8_gemm_nt(npu, a.data, _pairs(a, 5, 256, 1), b.data, _pairs(b, 64, 256, 128), d, c)
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double(), c.double())
    assert calc_diff(d, ref) < FP32_BOUND


def test_mx_scales_in_the_mn_major_form_break_the_documented_transposition_rule():
    # the first ascend format ([ceil(K/64), MN, 2] contiguous) with a K-major weight: CANN refuses
    npu = make_stand_in("950")
    a, b = _operands(4, 256, 256, ue8m0=True)
    mn_major = _pairs(b, 256, 256, 128).transpose(0, 1).contiguous()  # [P, N, 2] contiguous
    with pytest.raises(StandInError, match="transposition"):
        npu.npu_quant_matmul(a.data, b.data.t(), mn_major.view(torch.uint8), pertoken_scale=_pairs(a, 4, 256, 1),
                             scale_dtype=npu.float8_e8m0fnu, pertoken_scale_dtype=npu.float8_e8m0fnu,
                             output_dtype=torch.bfloat16, group_sizes=[1, 1, 32])


@pytest.mark.parametrize("m,n,k", [(3, 130, 300), (64, 256, 1024)])
def test_gb_gemm_on_950_takes_plain_fp32_scales(m, n, k):
    npu = make_stand_in("950")
    a, b = _operands(m, n, k, ue8m0=False, seed=5)
    d = poison(m, n, dtype=torch.float32)
    npu_gemm.gb_fp8_gemm_nt(npu, a.data, a.scale, b.data, b.scale, d, None)
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double())
    assert calc_diff(d, ref) < FP32_BOUND
    assert npu.calls == ["npu_quant_matmul"]


@pytest.mark.parametrize("soc", ["910b", "910c"])
def test_fp8_quant_matmul_is_refused_on_a2_a3(soc):
    npu = make_stand_in(soc)
    a, b = _operands(2, 128, 128, ue8m0=True)
    with pytest.raises(StandInError, match="Ascend 950 only"):
        npu_gemm.mx_fp8_gemm_nt(npu, a.data, _pairs(a, 2, 128, 1), b.data, _pairs(b, 128, 128, 128),
                                poison(2, 128, dtype=torch.bfloat16), None)


def test_quant_matmul_refuses_other_group_sizes():
    npu = make_stand_in("950")
    a, b = _operands(2, 128, 128, ue8m0=False)
    with pytest.raises(StandInError, match="group_sizes"):
        npu.npu_quant_matmul(a.data, b.data.t(), b.scale.t(), pertoken_scale=a.scale, output_dtype=torch.bfloat16,
                             group_sizes=[1, 1, 128])


def test_a2_a3_dequantized_path_is_exact_for_power_of_two_scales():
    a, b = _operands(9, 96, 384, ue8m0=True, seed=11)
    b_bf16 = dequantize_reference(b).to(torch.bfloat16)
    assert torch.equal(b_bf16.float(), dequantize_reference(b))  # e4m3 x 2^e fits bf16
    d = poison(9, 96, dtype=torch.float32)
    npu_gemm.dequantized_fp8_gemm_nt(a.data, a.scale, 128, b_bf16, d, None, a_scales_pow2=True)
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double())
    assert calc_diff(d, ref) < FP32_BOUND


def test_a2_a3_dequantized_path_keeps_fp32_for_arbitrary_scales():
    # bf16 operands would give calc_diff ~2.4e-6 here (measured), over the 1e-6 contract bound
    a, b = _operands(64, 256, 1024, ue8m0=False, seed=12)
    d = poison(64, 256, dtype=torch.float32)
    npu_gemm.dequantized_fp8_gemm_nt(a.data, a.scale, 128, dequantize_reference(b), d, None, a_scales_pow2=False)
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double())
    assert calc_diff(d, ref) < FP32_BOUND


# -- grouped -----------------------------------------------------------------------------------------

def test_contiguous_group_ends_fold_padding_into_the_previous_group():
    ends, valid = npu_grouped.contiguous_group_ends(torch.tensor([-1, 0, 0, -1, 2, -1, -1], dtype=torch.int32), 3)
    assert ends.tolist() == [4, 4, 7]
    assert valid.tolist() == [False, True, True, False, True, False, False]


def test_psum_group_ends_round_each_group_up_and_end_at_m():
    ends, valid = npu_grouped.psum_group_ends(torch.tensor([3, 4, 9], dtype=torch.int32), 4, 12)
    assert ends.tolist() == [4, 4, 12]
    assert valid.nonzero().flatten().tolist() == [0, 1, 2, 4, 5, 6, 7, 8]  # group 1 is empty: [4, 4)


def _grouped_case(counts, k, n, alignment, seed):
    g = len(counts)
    m_indices = contiguous_m_indices(torch.tensor(counts), alignment)
    a = randn(m_indices.numel(), k, seed=seed, dtype=torch.bfloat16)
    a[m_indices < 0] = 0
    b = randn(g, n, k, seed=seed + 1, dtype=torch.bfloat16, scale=k ** -0.5)
    return m_indices, a, b


@pytest.mark.parametrize("soc", ["910b", "950"])
def test_bf16_grouped_contiguous_writes_only_valid_rows(soc):
    npu = make_stand_in(soc)
    m_indices, a, b = _grouped_case([5, 0, 300, 17], 192, 64, 256, seed=21)
    d = poison(m_indices.numel(), 64, dtype=torch.bfloat16)
    ends, valid = npu_grouped.contiguous_group_ends(m_indices, 4)
    npu_grouped.bf16_grouped_gemm(npu, a, b, d, ends, valid)
    ref = grouped_gemm_contiguous_reference(a, b, m_indices)
    assert calc_diff(d[valid], ref[valid]) < BF16_BOUND
    assert bool(d[~valid].isnan().all())  # padding rows untouched
    assert npu.calls[0] == "npu_grouped_matmul"


def test_bf16_grouped_psum_form_matches_contiguous_reference():
    npu = make_stand_in("910c")
    counts = torch.tensor([3, 0, 70])
    psum = psum_layout(counts, 32)
    m_indices = contiguous_m_indices(counts, 32)
    total = m_indices.numel()
    a = randn(total, 64, seed=31, dtype=torch.bfloat16)
    b = randn(3, 48, 64, seed=32, dtype=torch.bfloat16)
    d = poison(total, 48, dtype=torch.bfloat16)
    ends, valid = npu_grouped.psum_group_ends(psum, 32, total)
    assert torch.equal(valid, m_indices >= 0)
    npu_grouped.bf16_grouped_gemm(npu, a, b, d, ends, valid)
    assert calc_diff(d[valid], grouped_gemm_contiguous_reference(a, b, m_indices)[valid]) < BF16_BOUND


def test_bf16_grouped_masked_form():
    npu = make_stand_in("910b")
    g, max_m, k, n = 3, 40, 96, 32
    a = randn(g, max_m, k, seed=41, dtype=torch.bfloat16)
    b = randn(g, n, k, seed=42, dtype=torch.bfloat16)
    masked_m = torch.tensor([40, 0, 7], dtype=torch.int32)
    ends, valid = npu_grouped.masked_group_ends(masked_m, max_m)
    d = poison(g * max_m, n, dtype=torch.bfloat16)
    npu_grouped.bf16_grouped_gemm(npu, a.view(g * max_m, k), b, d, ends, valid)
    ref = torch.bmm(a.double(), b.double().transpose(1, 2)).view(g * max_m, n)
    assert calc_diff(d[valid], ref[valid]) < BF16_BOUND and bool(d[~valid].isnan().all())


def test_grouped_matmul_refuses_more_than_1024_groups():
    npu = make_stand_in("910b")
    a = randn(2, 16, seed=1, dtype=torch.bfloat16)
    b = randn(1025, 8, 16, seed=2, dtype=torch.bfloat16)  # [G, N, K]
    ends = torch.full((1025,), 2, dtype=torch.int64)
    with pytest.raises(StandInError, match="1024"):
        npu_grouped.bf16_grouped_gemm(npu, a, b, poison(2, 8, dtype=torch.bfloat16), ends,
                                      torch.ones(2, dtype=torch.bool))


def test_mx_grouped_on_950_matches_reference():
    npu = make_stand_in("950")
    counts = [7, 0, 40]
    m_indices = contiguous_m_indices(torch.tensor(counts), 16)
    m, k, n = m_indices.numel(), 320, 64
    a = per_token_cast_to_fp8(randn(m, k, seed=51, dtype=torch.bfloat16), use_ue8m0=True)
    b = per_block_cast_to_fp8(randn(3, n, k, seed=52, dtype=torch.bfloat16, scale=k ** -0.5), use_ue8m0=True)
    sfa = ascend_mx_kmajor_encode_from_blocks(a.scale, m, k, block_mn=1)
    sfb = ascend_mx_kmajor_encode_from_blocks(b.scale, n, k, block_mn=128)
    ends, valid = npu_grouped.contiguous_group_ends(m_indices, 3)
    d = poison(m, n, dtype=torch.bfloat16)
    npu_grouped.mx_grouped_gemm(npu, a.data, sfa, b.data, sfb, d, ends, valid)
    ref = grouped_gemm_contiguous_reference(dequantize_reference(a), dequantize_reference(b), m_indices)
    assert calc_diff(d[valid], ref[valid]) < BF16_BOUND and bool(d[~valid].isnan().all())


# -- casts -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gran_k", [32, 128])
def test_mx_cast_equals_the_contract_cast_bit_for_bit(gran_k):
    npu = make_stand_in("950")
    x = randn(6, 300, seed=61, dtype=torch.bfloat16)
    x[1] = 0  # an all-zero row: amax floor 1e-4 -> scale 2^-22
    x[2, :40] = 1e-6  # a tiny block under the floor
    data, scale = npu_quant.mx_cast_fp32_scales(npu, x, gran_k)
    ref = per_token_cast_to_fp8(x, gran_k=gran_k, use_ue8m0=True)
    assert torch.equal(data.view(torch.uint8), ref.data.view(torch.uint8))
    assert torch.equal(scale, ref.scale)


def test_mx_cast_pairs_are_the_mx_gemm_input():
    npu = make_stand_in("950")
    x = randn(4, 200, seed=62, dtype=torch.bfloat16)
    _, pairs = npu_quant.mx_cast_pairs(npu, x, 32)
    ref = per_token_cast_to_fp8(x, gran_k=128, use_ue8m0=True)
    ref32 = per_token_cast_to_fp8(x, gran_k=32, use_ue8m0=True)
    assert pairs.shape == (4, 4, 2)  # (m, ceil(k/64), 2)
    assert torch.equal(pairs.view(torch.uint8), ascend_mx_kmajor_encode_from_blocks(ref32.scale, 4, 200, 1, 32)
                       .view(torch.uint8))
    assert ref.scale.shape == (4, 2) and regranularize_k(ref.scale, 200, 128, 32).shape == (4, 7)


def test_without_max_low_bound_tiny_blocks_get_another_scale():
    # why the cast provider needs a torch_npu with max_low_bound: scale_alg 1 alone has no amax floor
    npu = make_stand_in("950", with_max_low_bound=False)
    x = torch.full((1, 32), 1e-6, dtype=torch.bfloat16)
    _, pairs = npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn, scale_alg=1)
    floor_code = int(per_token_cast_to_fp8(x, gran_k=32, use_ue8m0=True).scale.view(torch.int32)[0, 0]) >> 23
    assert int(pairs.view(torch.uint8)[0, 0, 0]) < floor_code
    with pytest.raises(TypeError, match="max_low_bound"):
        npu_quant.mx_cast_pairs(npu, x, 32)


def test_mx_cast_is_refused_on_a2_a3():
    with pytest.raises(StandInError, match="Ascend 950 only"):
        npu_quant.mx_cast_pairs(make_stand_in("910b"), randn(2, 64, seed=1), 32)
