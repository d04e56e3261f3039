"""deep_gemm.einsum / fp8_einsum: every expression DeepGEMM hard-codes, against the sums in double
(FP8: of the dequantized operands), on cpu and on nvidia sm100 / ascend 950 emulation, with the
operand forms DeepGEMM's own test_einsum builds (a strided weight view, c = d aliasing, UE8M0
scales), and the refusals."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
import portable_kernels.deep_gemm as deep_gemm
from portable_kernels import ContractError
from portable_kernels.deep_gemm.utils import per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import randn

BACKENDS = [("cpu", {}), ("nvidia", {"arch": "sm100"}), ("ascend", {"soc": "950"})]


def _dq_token(q):
    v, s = q
    return v.float() * s.repeat_interleave(128, dim=-1)[..., : v.shape[-1]]


@pytest.mark.parametrize("backend,opts", BACKENDS)
def test_bf16_expressions_match_the_sums(backend, opts):
    a3, b3 = randn(3, 40, 64, seed=1, dtype=torch.bfloat16), randn(3, 24, 64, seed=2, dtype=torch.bfloat16)
    x, w = randn(5, 4, 96, seed=3, dtype=torch.bfloat16), randn(4, 32, 96 + 16, seed=4, dtype=torch.bfloat16)
    w = w[:, :, :96]  # DeepGEMM's test passes a strided view of a wider weight
    w2 = randn(4, 96, 48, seed=5, dtype=torch.bfloat16)
    with pk.use_backend(backend, **opts):
        d = randn(40, 24, seed=6)
        want = d.double() + torch.einsum("bmk,bnk->mn", a3.double(), b3.double())
        deep_gemm.einsum("bmk,bnk->mn", a3, b3, d, c=d)
        assert pk.calc_diff(d, want) < 1e-12
        z = torch.empty(5, 4, 32, dtype=torch.bfloat16)
        deep_gemm.einsum("bhr,hdr->bhd", x, w, z)
        assert pk.calc_diff(z, torch.einsum("bhr,hdr->bhd", x.double(), w.double())) < 1e-5
        z2 = torch.empty(5, 4, 48, dtype=torch.bfloat16)
        deep_gemm.einsum("bhd,hdr->bhr", x, w2, z2)
        assert pk.calc_diff(z2, torch.einsum("bhd,hdr->bhr", x.double(), w2.double())) < 1e-5


@pytest.mark.parametrize("backend,opts", BACKENDS)
def test_fp8_expressions_match_the_dequantized_sums(backend, opts):
    b, h, r, d = 6, 2, 256, 128
    x = randn(b, h, r, seed=11)
    y = randn(h, d, r, seed=12)
    xq = per_token_cast_to_fp8(x.view(-1, r), use_ue8m0=True)
    xq = (xq[0].view(b, h, r), xq[1].view(b, h, r // 128))
    yq = [per_block_cast_to_fp8(y[i], use_ue8m0=True) for i in range(h)]
    yq = (torch.stack([q[0] for q in yq]), torch.stack([q[1] for q in yq]))
    y_dq = yq[0].float() * yq[1].repeat_interleave(128, 1).repeat_interleave(128, 2)
    with pk.use_backend(backend, **opts):
        z = torch.empty(b, h, d, dtype=torch.bfloat16)
        deep_gemm.fp8_einsum("bhr,hdr->bhd", xq, yq, z)
        assert pk.calc_diff(z, torch.einsum("bhr,hdr->bhd", _dq_token(xq).double(), y_dq.double())) < 1e-5
        # "bhd,hdr->bhr": the same weights read transposed (d = 128 contracted, r = 256 out)
        xd = per_token_cast_to_fp8(randn(b * h, d, seed=13), use_ue8m0=True)
        xd = (xd[0].view(b, h, d), xd[1].view(b, h, 1))
        z2 = torch.empty(b, h, r, dtype=torch.bfloat16)
        deep_gemm.fp8_einsum("bhd,hdr->bhr", xd, yq, z2)
        assert pk.calc_diff(z2, torch.einsum("bhd,hdr->bhr", _dq_token(xd).double(), y_dq.double())) < 1e-5


@pytest.mark.parametrize("backend,opts", BACKENDS)
def test_fp8_weight_gradient_expression(backend, opts):
    b, h, d, r = 256, 2, 64, 48
    x, y = randn(b, h, d, seed=21), randn(b, h, r, seed=22)
    xq, yq = per_channel_cast_to_fp8(x.view(b, -1), use_ue8m0=True), per_channel_cast_to_fp8(y.view(b, -1), use_ue8m0=True)
    xq = (xq[0].view(b, h, d), xq[1].view(b // 128, h, d))
    yq = (yq[0].view(b, h, r), yq[1].view(b // 128, h, r))
    x_dq = xq[0].float() * xq[1].repeat_interleave(128, 0)
    y_dq = yq[0].float() * yq[1].repeat_interleave(128, 0)
    z0 = randn(h, d, r, seed=23) * 10
    with pk.use_backend(backend, **opts):
        z = z0.clone()
        deep_gemm.fp8_einsum("bhd,bhr->hdr", xq, yq, z, z, recipe=(1, 1, 128))
    want = z0.double() + torch.einsum("bhd,bhr->hdr", x_dq.double(), y_dq.double())
    assert pk.calc_diff(z, want) < 1e-10


def test_refusals_name_the_argument():
    a = randn(2, 3, 64, seed=31, dtype=torch.bfloat16)
    w = randn(3, 8, 64, seed=32, dtype=torch.bfloat16)
    z = torch.empty(2, 3, 8, dtype=torch.bfloat16)
    cases = {
        "expr": lambda: deep_gemm.einsum("bhr,hrd->bhd", a, w, z),
        "c": lambda: deep_gemm.einsum("bhr,hdr->bhd", a, w, z, c=z),
        "use_cublaslt": lambda: deep_gemm.einsum("bmk,bnk->mn", a, w[:2], torch.empty(3, 8), use_cublaslt=True),
        "b": lambda: deep_gemm.einsum("bhr,hdr->bhd", a, w[:, :, :32], z),
        "d": lambda: deep_gemm.einsum("bhr,hdr->bhd", a, w, torch.empty(2, 3, 9)),
        "recipe": lambda: deep_gemm.fp8_einsum("bhr,hdr->bhd", (a.to(torch.float8_e4m3fn), torch.ones(2, 3, 1)),
                                               (w.to(torch.float8_e4m3fn), torch.ones(3, 1, 1)), z, recipe=(1, 1, 128)),
    }
    for arg, call in cases.items():
        with pytest.raises(ContractError, match=f"'{arg}'"):
            call()
    with pytest.raises(ContractError, match="multiple of 128"):
        deep_gemm.fp8_einsum("bhd,bhr->hdr", (torch.zeros(100, 2, 8, dtype=torch.float8_e4m3fn), torch.ones(1, 2, 8)),
                             (torch.zeros(100, 2, 4, dtype=torch.float8_e4m3fn), torch.ones(1, 2, 4)),
                             torch.empty(2, 8, 4), recipe=(1, 1, 128))
