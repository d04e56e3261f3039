"""The Triton varlen attention (flash_attn_varlen_func, kernels/varlen_attention.py) in Triton's
interpreter: the quick conformance on sm90 and sm100 emulation served by the Triton provider;
seeded cases against the fp64 reference (GQA, bottom-right causal with s_q > s_k and s_q < s_k,
several query blocks, partial key tiles, empty sequences, d 192 = 128 + 64, padded head dims, the
d_v 256 tile, fp16, q read in place from a packed qkv), every output element written; rows without
a key; wide heads and strided channels declined with the reason and served by the layout oracle;
the launcher's typed errors."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import varlen_attention  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.core.numerics import calc_diff  # noqa: E402
from portable_kernels.core.registry import registry  # noqa: E402
from portable_kernels.ops.attention.decode import LSE_ABS_TOL  # noqa: E402
from portable_kernels.ops.attention.prefill import (FLASH_ATTN_VARLEN, VarlenInputs,  # noqa: E402
                                                    flash_attn_varlen_func, varlen_reference)
from portable_kernels.testing import run_conformance  # noqa: E402
from portable_kernels.testing.attention_cases import VARLEN_LSE_REL, VARLEN_OUT_ABS, VARLEN_OUT_REL  # noqa: E402
from portable_kernels.testing.generators import poison, randn  # noqa: E402

OP = "flash_attn_varlen_func"


@pytest.fixture(scope="module", params=["sm90", "sm100"])
def report(request):
    return run_conformance(backend="nvidia", arch=request.param, ops=(OP,), quick=True)


def test_every_quick_case_passes(report):
    assert report.ok, report.format_table()


def test_the_triton_provider_serves_every_case(report):
    r = report.ops[OP]
    assert r.passed > 0 and r.providers == {"triton": r.passed}, report.format_table()


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def _operands(lq, lk, h_q, h_kv, d, d_v, seed, dtype=torch.bfloat16):
    cu_q, cu_k = _cu(lq), _cu(lk)
    q = randn(int(cu_q[-1]), h_q, d, seed=seed, dtype=dtype, scale=0.5)
    k = randn(int(cu_k[-1]), h_kv, d, seed=seed + 1, dtype=dtype, scale=0.5)
    v = randn(int(cu_k[-1]), h_kv, d_v, seed=seed + 2, dtype=dtype)
    return q, k, v, cu_q, cu_k


def _check(out, lse, q, k, v, cu_q, cu_k, scale, causal, elementwise=True):
    ref_out, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, scale, causal, dtype=torch.float64)
    assert not out.isnan().any() and not lse.isnan().any()
    assert calc_diff(out.double(), ref_out) < FLASH_ATTN_VARLEN.tolerance.dequantized
    if elementwise:
        torch.testing.assert_close(out.double(), ref_out, atol=VARLEN_OUT_ABS, rtol=VARLEN_OUT_REL)
    torch.testing.assert_close(lse.double(), ref_lse, atol=LSE_ABS_TOL, rtol=VARLEN_LSE_REL)


def _run_kernel(q, k, v, cu_q, cu_k, lq, scale, causal, **kwargs):
    out = poison(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    lse = poison(q.shape[0], q.shape[1], dtype=torch.float32)
    varlen_attention.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), scale, causal, out, lse, **kwargs)
    return out, lse


CASES = {  # (s_q per sequence, s_k per sequence, h_q, h_kv, d, d_v, causal, dtype)
    "d192 gqa causal s_q>s_k and s_q<s_k, two q blocks": ((130, 40, 3), (70, 90, 0), 4, 2, 192, 128, True,
                                                         torch.bfloat16),
    "d192 not causal, empty q sequence": ((9, 0, 66), (20, 5, 65), 2, 1, 192, 128, False, torch.bfloat16),
    "d128 fp16 gqa causal": ((17, 64), (80, 64), 8, 2, 128, 128, True, torch.float16),
    "d96/64 padded channels": ((33, 5), (47, 5), 2, 2, 96, 64, True, torch.bfloat16),
    "d256/256 the 64-row tile": ((70,), (75,), 1, 1, 256, 256, True, torch.bfloat16),
    "d8/24 below the dot's 16": ((6, 11), (9, 11), 3, 1, 8, 24, False, torch.bfloat16),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernel_matches_the_fp64_reference_and_writes_every_output(case):
    lq, lk, h_q, h_kv, d, d_v, causal, dtype = CASES[case]
    q, k, v, cu_q, cu_k = _operands(lq, lk, h_q, h_kv, d, d_v, seed=300 + 10 * list(CASES).index(case), dtype=dtype)
    scale = (d + 50) ** -0.5
    out, lse = _run_kernel(q, k, v, cu_q, cu_k, lq, scale, causal)
    _check(out, lse, q, k, v, cu_q, cu_k, scale, causal)


def test_single_half_p_stays_within_the_contracts_calc_diff():
    """split_p=False (flash-attention's bf16 P): within calc_diff, not the elementwise bounds."""
    lq, lk = (40, 100), (60, 100)
    q, k, v, cu_q, cu_k = _operands(lq, lk, 4, 4, 192, 128, seed=41)
    out, lse = _run_kernel(q, k, v, cu_q, cu_k, lq, 0.08, True, split_p=False)
    split_out, _ = _run_kernel(q, k, v, cu_q, cu_k, lq, 0.08, True)
    ref_out, _ = varlen_reference(q, k, v, cu_q, cu_k, 0.08, True, dtype=torch.float64)
    _check(out, lse, q, k, v, cu_q, cu_k, 0.08, True, elementwise=False)
    assert calc_diff(split_out.double(), ref_out) < calc_diff(out.double(), ref_out)


def test_rows_without_keys_give_zero_out_and_inf_lse():
    lq, lk = (6, 4), (2, 0)  # causal, s_q > s_k: rows 0..3 of sequence 0 see nothing; sequence 1 has no keys
    q, k, v, cu_q, cu_k = _operands(lq, lk, 2, 1, 64, 64, seed=51)
    out, lse = _run_kernel(q, k, v, cu_q, cu_k, lq, 0.1, True)
    blind = torch.tensor([1, 1, 1, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    assert torch.equal(out[blind].float(), torch.zeros(8, 2, 64))
    assert bool((lse[blind] == math.inf).all()) and bool(torch.isfinite(lse[~blind]).all())
    _check(out, lse, q, k, v, cu_q, cu_k, 0.1, True)


def test_q_is_read_in_place_from_a_packed_qkv():
    lq = (20, 37)
    cu = _cu(lq)
    qkv = randn(int(cu[-1]), 4, 3 * 192, seed=61, dtype=torch.bfloat16, scale=0.5)
    q, k, v = qkv[:, :, :192], qkv[:, :, 192:384], qkv[:, :, 384:512]
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, lse = _run_kernel(q, k, v, cu, cu, lq, 0.07, True)
    _check(out, lse, q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, 0.07, True)


def test_public_op_on_nvidia_emulation_runs_the_triton_provider():
    lq, lk = (12, 7), (15, 30)
    q, k, v, cu_q, cu_k = _operands(lq, lk, 4, 2, 192, 128, seed=71)
    q = torch.cat([q, randn(3, 4, 192, seed=72, dtype=torch.bfloat16)])  # rows past cu_seqlens_qo[-1]
    with pk.use_backend("nvidia", arch="sm100"), trace_providers() as ran:
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 30, causal=True)
    assert [p for o, b, p in ran if o == OP and b == "nvidia"] == ["triton"]
    assert torch.equal(out[-3:].float(), torch.zeros(3, 4, 128)) and bool((lse[-3:] == math.inf).all())
    _check(out, lse, q, k, v, cu_q, cu_k, 192 ** -0.5, True)


def _triton_provider():
    return next(p for p in registry().providers(OP, "nvidia") if p.name == "triton")


def _call(q, k, v, cu_q, cu_k) -> VarlenInputs:
    return VarlenInputs(q, k, v, cu_q, cu_k, 8, 8, 0.1, False, torch.empty(q.shape[0], q.shape[1], v.shape[-1],
                                                                          dtype=q.dtype), torch.empty(q.shape[:2]))


def test_wide_heads_are_declined_with_the_reason_and_served_by_the_oracle():
    lq = (5, 8)
    q, k, v, cu_q, cu_k = _operands(lq, lq, 2, 1, 576, 512, seed=81)
    reasons = _triton_provider().not_supported_reasons(_call(q, k, v, cu_q, cu_k))
    assert any("head dim d = 576" in r for r in reasons) and any("d_v = 512" in r for r in reasons)
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 8, 8)
    assert [p for o, b, p in ran if o == OP and b == "nvidia"] == ["layout-reference"]
    _check(out, lse, q, k, v, cu_q, cu_k, 576 ** -0.5, False)


def _channel_stride_2(t: torch.Tensor) -> torch.Tensor:
    return torch.stack((t, t), dim=-1).flatten(-2)[..., ::2]


def test_a_strided_k_is_declined_with_the_reason_and_served_by_the_oracle():
    lq = (5, 8)
    q, k, v, cu_q, cu_k = _operands(lq, lq, 2, 2, 64, 64, seed=91)
    strided = _channel_stride_2(k)
    assert strided.stride(-1) == 2 and torch.equal(strided, k)
    assert any("k's last dim is not contiguous (stride 2)" in r
               for r in _triton_provider().not_supported_reasons(_call(q, strided, v, cu_q, cu_k)))
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        out, lse = flash_attn_varlen_func(q, strided, v, cu_q, cu_k, 8, 8, causal=True)
    assert [p for o, b, p in ran if o == OP and b == "nvidia"] == ["layout-reference"]
    _check(out, lse, q, k, v, cu_q, cu_k, 64 ** -0.5, True)


def test_the_launcher_rejects_what_the_kernel_cannot_read():
    lq = (5, 8)
    q, k, v, cu_q, cu_k = _operands(lq, lq, 4, 2, 64, 64, seed=95)
    out, lse = torch.empty(13, 4, 64, dtype=torch.bfloat16), torch.empty(13, 4)
    launch = varlen_attention.flash_attn_varlen_func
    with pytest.raises(ContractError, match="k"):
        launch(q, _channel_stride_2(k), v, cu_q, cu_k, 8, 0.1, False, out, lse)
    with pytest.raises(ContractError, match="out"):
        launch(q, k, v, cu_q, cu_k, 8, 0.1, False, out.half(), lse)
    with pytest.raises(ContractError, match="k"):
        launch(q, k[:, :1].expand(-1, 3, -1), v[:, :1].expand(-1, 3, -1), cu_q, cu_k, 8, 0.1, False, out, lse)
    with pytest.raises(ContractError, match="d_v = 512"):
        launch(q, k, randn(13, 2, 512, seed=96, dtype=torch.bfloat16), cu_q, cu_k, 8, 0.1, False,
               torch.empty(13, 4, 512, dtype=torch.bfloat16), lse)
    with pytest.raises(ContractError, match="cu_seqlens_kv"):
        launch(q, k, v, cu_q, cu_k[:-1], 8, 0.1, False, out, lse)
    with pytest.raises(ContractError, match="max_seqlen_qo"):
        launch(q, k, v, cu_q, cu_k, -1, 0.1, False, out, lse)
