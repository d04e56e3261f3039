"""The Triton GEMM kernels against the dequantized fp64 reference, in the interpreter."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels.backends.nvidia.kernels import bf16_gemm, fp8_fp4_gemm, fp8_gemm  # noqa: E402
from portable_kernels.ops.quant.fp4 import quantize_fp4_reference  # noqa: E402
from portable_kernels.layouts import E2M1_VALUES, pack_e2m1  # noqa: E402
from portable_kernels.core.tensors import QuantTensor  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.core.numerics import calc_diff  # noqa: E402
from portable_kernels.testing.generators import poison, randn  # noqa: E402

from nvidia_operands import FORMS, dequantized, quantized, storage  # noqa: E402

# M=1, K not a multiple of 128, N not a multiple of any tile, a tiny K, and several tiles
SHAPES = [(1, 130, 300), (37, 70, 128), (70, 1, 7), (130, 200, 384)]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp8_gemm_reads_each_scale_form(form, m, n, k):
    ue8m0 = form == "sm100"
    qa = quantized((m, k), (1, 128), ue8m0, seed=m + k)
    qb = quantized((n, k), (128, 128), ue8m0, seed=n + k, scale=k ** -0.5)
    sfa, ga = storage(qa, form)
    sfb, gb = storage(qb, form)
    c = randn(m, n, seed=3)
    d = poison(m, n, dtype=torch.float32)
    fp8_gemm.fp8_gemm_nt(qa.data, sfa, qb.data, sfb, d, c, gran_a=ga, gran_b=gb)
    ref = dequantized(qa) @ dequantized(qb).T + c.double()
    assert calc_diff(d, ref) < 1e-9


@pytest.mark.parametrize("config", fp8_gemm.CONFIGS, ids=lambda c: "x".join(map(str, c.kwargs.values())))
def test_fp8_gemm_every_config_bf16_out(config):
    m, n, k = 20, 150, 260
    qa = quantized((m, k), (1, 128), False, seed=1)
    qb = quantized((n, k), (1, 128), False, seed=2)  # per-row weight scales (1x128)
    sfa, ga = storage(qa, "sm90")
    sfb, gb = storage(qb, "sm90")
    d = poison(m, n, dtype=torch.bfloat16)
    fp8_gemm.fp8_gemm_nt(qa.data, sfa, qb.data, sfb, d, gran_a=ga, gran_b=gb, config=config)
    ref = dequantized(qa) @ dequantized(qb).T
    assert torch.isfinite(d.float()).all()
    assert calc_diff(d, ref) < 1e-5


def test_fp8_gemm_bf16_output_is_rounded_to_nearest_even():
    m, n, k = 8, 16, 128
    qa = quantized((m, k), (1, 128), False, seed=4)
    qb = quantized((n, k), (128, 128), False, seed=5)
    d32 = torch.empty(m, n)
    d16 = torch.empty(m, n, dtype=torch.bfloat16)
    for d in (d32, d16):
        fp8_gemm.fp8_gemm_nt(qa.data, qa.scale, qb.data, qb.scale, d, gran_a=(1, 128), gran_b=(128, 128))
    assert torch.equal(d16, d32.to(torch.bfloat16))


def test_fp8_gemm_empty_m_writes_nothing():
    qb = quantized((16, 128), (128, 128), False, seed=6)
    a = torch.empty(0, 128, dtype=torch.float8_e4m3fn)
    fp8_gemm.fp8_gemm_nt(a, torch.empty(0, 1), qb.data, qb.scale, torch.empty(0, 16))


def test_fp8_gemm_refuses_mismatched_scales():
    qa = quantized((4, 256), (1, 128), False, seed=7)
    qb = quantized((16, 256), (128, 128), False, seed=8)
    with pytest.raises(ContractError, match="sfa"):
        fp8_gemm.fp8_gemm_nt(qa.data, qa.scale[:, :1], qb.data, qb.scale, torch.empty(4, 16))
    with pytest.raises(ContractError, match="gran_a"):
        fp8_gemm.fp8_gemm_nt(qa.data, qa.scale, qb.data, qb.scale, torch.empty(4, 16), gran_a=(1, 100),
                             gran_b=(128, 100))


@pytest.mark.parametrize("m,n,k", SHAPES[:2] + [(5, 33, 64)])
@pytest.mark.parametrize("config", bf16_gemm.CONFIGS[-2:], ids=lambda c: "x".join(map(str, c.kwargs.values())))
def test_bf16_gemm(m, n, k, config):
    a = randn(m, k, seed=m, dtype=torch.bfloat16)
    b = randn(n, k, seed=n, dtype=torch.bfloat16)
    c = randn(m, n, seed=1)
    d = poison(m, n, dtype=torch.float32)
    bf16_gemm.bf16_gemm_nt(a, b, d, c, config=config)
    assert calc_diff(d, a.double() @ b.double().T + c.double()) < 1e-9


def test_bf16_gemm_autotuned_path_bf16_out():
    a = randn(3, 100, seed=1, dtype=torch.bfloat16)
    b = randn(9, 100, seed=2, dtype=torch.bfloat16)
    d = poison(3, 9, dtype=torch.bfloat16)
    bf16_gemm.bf16_gemm_nt(a, b, d)
    assert calc_diff(d, a.double() @ b.double().T) < 1e-5


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
@pytest.mark.parametrize("config", bf16_gemm.CONFIGS[-2:], ids=lambda c: "x".join(map(str, c.kwargs.values())))
def test_bf16_gemm_reads_stored_transposes(layout, config):
    """The nn/tn/tt operands: A and/or B stored [K, MN] and passed as their .mT views (MN-major)."""
    m, n, k = 37, 70, 200
    a_t, b_t = layout[0] == "t", layout[1] == "n"
    a = randn(k, m, seed=21, dtype=torch.bfloat16).mT if a_t else randn(m, k, seed=21, dtype=torch.bfloat16)
    b = randn(k, n, seed=22, dtype=torch.bfloat16).mT if b_t else randn(n, k, seed=22, dtype=torch.bfloat16)
    assert (a.stride(0) == 1) == a_t and (b.stride(0) == 1) == b_t
    c = randn(m, n, seed=23)
    d = poison(m, n, dtype=torch.float32)
    bf16_gemm.bf16_gemm_nt(a, b, d, c, config=config)
    assert calc_diff(d, a.double() @ b.double().T + c.double()) < 1e-9


def test_bf16_gemm_reads_any_strides():
    """Neither stride 1 (every other row and column of larger tensors)."""
    a = randn(40, 300, seed=24, dtype=torch.bfloat16)[::2, ::3]
    b = randn(300, 66, seed=25, dtype=torch.bfloat16).mT[::2, ::3]
    d = poison(20, 33, dtype=torch.bfloat16)
    bf16_gemm.bf16_gemm_nt(a, b, d)
    assert calc_diff(d, a.double() @ b.double().T) < 1e-5


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("gran_a,gran_b", [(128, 32), (32, 32), (128, 128)])
def test_fp8_fp4_gemm(form, gran_a, gran_b):
    m, n, k = 19, 70, 200
    ue8m0 = form == "sm100"
    qa = quantized((m, k), (1, gran_a), ue8m0, seed=11)
    w = randn(n, k, seed=12)
    packed, sfb = quantize_fp4_reference(w, gran_b, use_ue8m0=True)
    qb = QuantTensor(packed, sfb, (1, gran_b), True, "e2m1")
    sfa, ga = storage(qa, form)
    sb, gb = storage(qb, form)
    c = randn(m, n, seed=13)
    d = poison(m, n, dtype=torch.float32)
    fp8_fp4_gemm.fp8_fp4_gemm_nt(qa.data, sfa, qb.data, sb, d, c, gran_a=ga, gran_b=gb)
    assert calc_diff(d, dequantized(qa) @ dequantized(qb).T + c.double()) < 1e-9


def test_e2m1_decode_matches_the_layout_table():
    codes = torch.arange(16, dtype=torch.uint8)
    packed = pack_e2m1(codes.repeat(2))[None, :]  # one row, K = 32
    d = torch.empty(1, 1)
    got = torch.zeros(32)
    for j in range(32):  # read back each code as the product with a one-hot row of A
        a = torch.zeros(1, 32)
        a[0, j] = 1.0
        fp8_fp4_gemm.fp8_fp4_gemm_nt(a.to(torch.float8_e4m3fn), torch.ones(1, 1), packed, torch.ones(1, 1), d,
                                     gran_a=(1, 32), gran_b=(1, 32))
        got[j] = d[0, 0]
    assert torch.equal(got, torch.tensor(E2M1_VALUES * 2, dtype=torch.float32))


def test_untuned_launches_pick_a_config_by_size():
    from portable_kernels.backends.nvidia.kernels._launch import pick_config
    assert pick_config(fp8_gemm.CONFIGS, 1).kwargs["BLOCK_M"] == 16
    assert pick_config(fp8_gemm.CONFIGS, 40).kwargs["BLOCK_M"] == 64
    assert pick_config(fp8_gemm.CONFIGS, 4096) is fp8_gemm.CONFIGS[0]
