"""FRACTAL_NZ at ingest (issue 24 item 2): which weights the ascend backend stores NZ, per chip and op
(backends/ascend/__init__.py NZ_AT_INGEST, with the pages cited there), the one npu_format_cast at
prepare time, and providers that pass the prepared weight on without a cast. The stand-in stands for
the NPU (it records the cast and the format the ops receive); it does not prove what an NPU computes."""

import pytest
import torch

import portable_kernels as pk
from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend import NZ_AT_INGEST, AscendBackend
from portable_kernels.backends.ascend.vendor import gemm as npu_gemm, grouped as npu_grouped, runtime
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.numerics import calc_diff
from portable_kernels.layouts import (ASCEND_BF16_VALUES, ASCEND_BF16_VALUES_NZ, ASCEND_FP32_VALUES, ASCEND_MX_KMAJOR,
                                      NPU_FORMAT_FRACTAL_NZ, contiguous_m_indices, nz_storage)
from portable_kernels.ops.gemm.dense import gemm_reference
from portable_kernels.ops.quant.fp8 import dequantize_reference, per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import poison, randn

BOUND = 1e-5


def _weights(n, k, seed=0, groups=None, ue8m0=True):
    shape = (n, k) if groups is None else (groups, n, k)
    return per_block_cast_to_fp8(randn(*shape, seed=seed, dtype=torch.bfloat16, scale=k ** -0.5), use_ue8m0=ue8m0)


def _activations(m, k, seed=1, ue8m0=True):
    return per_token_cast_to_fp8(randn(m, k, seed=seed, dtype=torch.bfloat16), use_ue8m0=ue8m0)


@pytest.mark.parametrize("soc", ["910b", "910c"])
@pytest.mark.parametrize("op", sorted(op for op, _ in NZ_AT_INGEST))
def test_a2a3_bf16_weights_of_the_nz_ops_are_recorded_nz(soc, op):
    groups = None if op == "fp8_gemm_nt" else 2
    with pk.use_backend("ascend", soc=soc):
        b = pk.prepare_inputs(op, b=_weights(256, 256, groups=groups))["b"]
    assert b.format is ASCEND_BF16_VALUES_NZ and "nz" in b.format.name


@pytest.mark.parametrize("soc,scales,want", [("950", "ue8m0", ASCEND_MX_KMAJOR), ("910b", "fp32", ASCEND_FP32_VALUES)])
def test_the_950_and_fp32_values_stay_nd(soc, scales, want):
    # 950: aclnnQuantMatmulV5 "x2仅支持ND格式"; its MX grouped matmul has no FP8 NZ weight; fp32 values: not cast
    backend = AscendBackend()
    for op, arg in sorted(NZ_AT_INGEST):
        assert backend.format_for(op, pk.core.contract.get_contract(op).quant_arg(arg),
                                  {"soc": soc, "scales": scales}) is want


def test_activations_and_other_ops_keep_their_formats():
    backend = AscendBackend()
    contract = pk.core.contract.get_contract("fp8_gemm_nt")
    assert backend.format_for("fp8_gemm_nt", contract.quant_arg("a"), {"soc": "910b"}) is pk.PLAIN
    assert ASCEND_BF16_VALUES_NZ in backend.formats() and ASCEND_BF16_VALUES in backend.formats()


def test_emulation_keeps_the_nd_bytes_and_casts_nothing():
    b = _weights(128, 384, seed=2)
    with pk.use_backend("ascend", soc="910b"):
        nz = pk.prepare_inputs("fp8_gemm_nt", b=b)["b"]
    assert torch.equal(nz.data, ASCEND_BF16_VALUES.encode(b).data)
    assert nz.data.is_contiguous() and tuple(nz.data.shape) == (128, 384)


def test_nz_storage_worked_example():
    # N = 2, K = 3 bf16 values -> one 16 x 16 tile: rows 0, 1 = [a b c 0 ...], [d e f 0 ...], rows 2..15 zero
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.bfloat16)
    tiles = nz_storage(values)
    assert tuple(tiles.shape) == (1, 1, 16, 16)
    assert tiles[0, 0, 0, :3].tolist() == [1.0, 2.0, 3.0] and tiles[0, 0, 1, :3].tolist() == [4.0, 5.0, 6.0]
    assert bool((tiles[0, 0, 0, 3:] == 0).all()) and bool((tiles[0, 0, 2:] == 0).all())


def test_a_weight_tile_lands_where_matmul_weight_nz_reads_it():
    # aclnnMatmulWeightNz, B transposed: (k1, n1, n0, k0) with n0 = k0 = 16 -> element (n, k) at
    # [k // 16, n // 16, n % 16, k % 16]
    values = randn(40, 50, seed=3, dtype=torch.bfloat16)
    tiles = nz_storage(values)
    assert tuple(tiles.shape) == (4, 3, 16, 16)
    for n, k in ((0, 0), (17, 33), (39, 49)):
        assert tiles[k // 16, n // 16, n % 16, k % 16] == values[n, k]


def test_prepare_casts_once_and_the_gemm_passes_the_nz_weight_on():
    a, b = _activations(9, 512), _weights(256, 512, seed=4)
    npu = make_stand_in("910b")
    with runtime.use_stand_in(npu), pk.use_backend("ascend", soc="910b"):
        prepared = pk.prepare_inputs("fp8_gemm_nt", a=a, b=b)
        assert npu.calls == ["npu_format_cast"] and npu.get_npu_format(prepared["b"].data) == NPU_FORMAT_FRACTAL_NZ
        d = poison(9, 256, dtype=torch.bfloat16)
        with pk.count_implicit_conversions() as n, trace_providers() as ran:
            pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
    assert n.count == 0 and ran[-1] == ("fp8_gemm_nt", "ascend", "torch_npu-dequantized")
    assert npu.calls == ["npu_format_cast"]  # none in the call
    ref = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double())
    assert calc_diff(d, ref) < BOUND


def test_the_gemm_hands_the_prepared_tensor_itself_to_the_matmul(monkeypatch):
    seen = []
    real = npu_gemm.bf16_gemm_nt
    monkeypatch.setattr(npu_gemm, "bf16_gemm_nt", lambda a, b, d, c: (seen.append(b), real(a, b, d, c)))
    a, b = _activations(4, 256), _weights(128, 256, seed=5)
    npu = make_stand_in("910c")
    with runtime.use_stand_in(npu), pk.use_backend("ascend", soc="910c"):
        prepared = pk.prepare_inputs("fp8_gemm_nt", a=a, b=b)
        pk.fp8_gemm_nt(prepared["a"], prepared["b"], torch.empty(4, 128, dtype=torch.bfloat16))
    assert len(seen) == 1 and seen[0] is prepared["b"].data


def test_grouped_gemm_reaches_npu_grouped_matmul_with_the_nz_weight():
    g, n, k = 3, 128, 256
    counts = torch.tensor([5, 0, 9])
    m_indices = contiguous_m_indices(counts, 256)
    a, b = _activations(m_indices.shape[0], k, seed=6), _weights(n, k, seed=7, groups=g)
    npu = make_stand_in("910b")
    with runtime.use_stand_in(npu), pk.use_backend("ascend", soc="910b"):
        prepared = pk.prepare_inputs("m_grouped_fp8_gemm_nt_contiguous", a=a, b=b)
        d = torch.zeros(m_indices.shape[0], n, dtype=torch.bfloat16)
        with pk.count_implicit_conversions() as conv, trace_providers() as ran:
            pk.m_grouped_fp8_gemm_nt_contiguous(prepared["a"], prepared["b"], d, m_indices)
    assert conv.count == 0 and ran[-1] == ("m_grouped_fp8_gemm_nt_contiguous", "ascend", "torch_npu-dequantized")
    assert npu.calls.count("npu_format_cast") == 1
    assert "npu_grouped_matmul[weight FRACTAL_NZ: aclnnGroupedMatmulWeightNz]" in npu.calls
    ref = torch.zeros(m_indices.shape[0], n, dtype=torch.float64)
    av, bv = dequantize_reference(a).double(), dequantize_reference(b).double()
    for row, group in enumerate(m_indices.tolist()):
        if group >= 0:
            ref[row] = av[row] @ bv[group].T
    valid = m_indices >= 0
    assert calc_diff(d[valid], ref[valid]) < BOUND


def test_stand_in_takes_a_bf16_nz_weight_on_a2a3_grouped():
    npu = make_stand_in("910b")
    w = npu.npu_format_cast(randn(2, 64, 32, seed=8, dtype=torch.bfloat16), NPU_FORMAT_FRACTAL_NZ)
    x = randn(8, 32, seed=9, dtype=torch.bfloat16)
    out = npu.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=torch.tensor([4, 8]), split_item=3,
                                 group_type=0, group_list_type=npu_grouped.CUMULATIVE, output_dtype=torch.bfloat16)[0]
    assert tuple(out.shape) == (8, 64)


def test_stand_in_refuses_an_fp8_nz_weight_on_950_grouped():
    npu = make_stand_in("950")
    w = npu.npu_format_cast(torch.zeros(2, 64, 64).to(torch.float8_e4m3fn), NPU_FORMAT_FRACTAL_NZ)
    x = torch.zeros(8, 64).to(torch.float8_e4m3fn)
    with pytest.raises(StandInError, match="FRACTAL_NZ"):
        npu.npu_grouped_matmul([x], [w.transpose(1, 2)], group_list=torch.tensor([4, 8]), split_item=3,
                               group_type=0, group_list_type=npu_grouped.CUMULATIVE, output_dtype=torch.bfloat16)


def test_stand_in_refuses_an_nz_x2_in_the_950_quant_matmul():
    npu = make_stand_in("950")
    x2 = npu.npu_format_cast(torch.zeros(64, 64).to(torch.float8_e4m3fn), NPU_FORMAT_FRACTAL_NZ)
    with pytest.raises(StandInError, match="ND"):
        npu.npu_quant_matmul(torch.zeros(4, 64).to(torch.float8_e4m3fn), x2.t(), torch.ones(1),
                             output_dtype=torch.bfloat16)
