"""The Triton sparse MLA prefill (flash_mla_sparse_fwd, kernels/mla_sparse_prefill.py) in Triton's
interpreter: the quick conformance on sm90 and sm100 emulation served by the Triton provider; seeded
cases against the fp64 reference (-1 and out-of-range indices, topk_length, attn_sink with a +inf
head, h_q 64 / 128 / padded, topk not a multiple of the key tile, d 512, fp16), every output element
written; strided operands declined with the reason and served by the layout oracle; the launcher's
typed errors."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import mla_sparse_prefill  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.core.numerics import calc_diff  # noqa: E402
from portable_kernels.core.registry import registry  # noqa: E402
from portable_kernels.ops.attention.decode import LSE_ABS_TOL, LSE_REL_TOL, OUT_ABS_TOL, OUT_REL_TOL  # noqa: E402
from portable_kernels.ops.attention.prefill import (FLASH_MLA_SPARSE_FWD, SparsePrefillInputs,  # noqa: E402
                                                    flash_mla_sparse_fwd, sparse_prefill_reference)
from portable_kernels.testing import run_conformance  # noqa: E402
from portable_kernels.testing.generators import generator, poison, randn  # noqa: E402

OP = "flash_mla_sparse_fwd"


@pytest.fixture(scope="module", params=["sm90", "sm100"])
def report(request):
    return run_conformance(backend="nvidia", arch=request.param, ops=(OP,), quick=True)


def test_every_quick_case_passes(report):
    assert report.ok, report.format_table()


def test_the_triton_provider_serves_every_case(report):
    r = report.ops[OP]
    assert r.passed > 0 and r.providers == {"triton": r.passed}, report.format_table()


def _operands(s_q, h_q, d, s_kv, topk, sink, limit, seed, dtype=torch.bfloat16):
    """q, kv (NaN in every row no index selects), indices (-1, >= s_kv, a lonely first token),
    attn_sink (a +inf head), topk_length."""
    g = generator(seed)
    q = randn(s_q, h_q, d, seed=seed, dtype=dtype)
    kv = randn(s_kv, 1, d, seed=seed + 1, dtype=dtype)
    idx = torch.randint(-1, s_kv + 3, (s_q, 1, topk), generator=g, dtype=torch.int32)
    idx[0] = -1
    chosen = torch.zeros(s_kv, dtype=torch.bool)
    chosen[idx[(idx >= 0) & (idx < s_kv)].long()] = True
    kv[~chosen] = float("nan")
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=g) * 2
        attn_sink[-1] = math.inf
    lengths = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32) if limit else None
    if limit:
        lengths[-1] = 0
    return q, kv, idx, attn_sink, lengths


def _check(got, q, kv, idx, attn_sink, lengths):
    out, max_logits, lse = got
    ref_out, ref_max, ref_lse = sparse_prefill_reference(q, kv, idx, q.shape[-1] ** -0.5, 512, attn_sink, lengths,
                                                         dtype=torch.float64)
    assert not out.isnan().any() and not max_logits.isnan().any() and not lse.isnan().any()
    assert calc_diff(out.double(), ref_out) < FLASH_MLA_SPARSE_FWD.tolerance.dequantized
    torch.testing.assert_close(out.double(), ref_out, atol=OUT_ABS_TOL, rtol=OUT_REL_TOL)
    torch.testing.assert_close(lse.double(), ref_lse, atol=LSE_ABS_TOL, rtol=LSE_REL_TOL)
    torch.testing.assert_close(max_logits.double(), ref_max, atol=LSE_ABS_TOL, rtol=LSE_REL_TOL)


CASES = {  # (s_q, h_q, d, s_kv, topk, sink, topk_length, dtype)
    "h64 topk45 sink length": (2, 64, 576, 90, 45, True, True, torch.bfloat16),      # 32-index tiles, 2nd partial
    "h128 topk100 length": (2, 128, 576, 300, 100, False, True, torch.bfloat16),      # 64-index tiles, 2nd partial
    "h128 d512 fp16 sink": (2, 128, 512, 60, 70, True, False, torch.float16),
    "h8 padded tile": (3, 8, 576, 20, 7, False, False, torch.bfloat16),
    "h130 two head tiles": (1, 130, 576, 40, 33, True, False, torch.bfloat16),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_kernel_matches_the_fp64_reference_and_writes_every_output(case):
    s_q, h_q, d, s_kv, topk, sink, limit, dtype = CASES[case]
    q, kv, idx, attn_sink, lengths = _operands(s_q, h_q, d, s_kv, topk, sink, limit, seed=100 + list(CASES).index(case),
                                               dtype=dtype)
    out, max_logits, lse = poison(s_q, h_q, 512, dtype=dtype), poison(s_q, h_q, dtype=torch.float32), \
        poison(s_q, h_q, dtype=torch.float32)
    mla_sparse_prefill.flash_mla_sparse_fwd(q, kv, idx, d ** -0.5, attn_sink, lengths, out, max_logits, lse)
    _check((out, max_logits, lse), q, kv, idx, attn_sink, lengths)


def test_rows_without_keys_give_zero_out_inf_lse_and_neg_inf_max():
    q, kv, idx, attn_sink, _ = _operands(3, 16, 576, 30, 20, True, False, seed=21)
    idx[1] = 30  # out of range: no key either (row 0 is all -1)
    lengths = torch.tensor([20, 20, 0], dtype=torch.int32)  # row 2: none by topk_length
    out, max_logits, lse = poison(3, 16, 512, dtype=torch.bfloat16), poison(3, 16, dtype=torch.float32), \
        poison(3, 16, dtype=torch.float32)
    mla_sparse_prefill.flash_mla_sparse_fwd(q, kv, idx, 0.05, attn_sink, lengths, out, max_logits, lse)
    assert torch.equal(out.float(), torch.zeros(3, 16, 512))
    assert bool((lse == math.inf).all()) and bool((max_logits == -math.inf).all())


def test_public_op_on_nvidia_emulation_runs_the_triton_provider():
    q, kv, idx, attn_sink, lengths = _operands(4, 64, 576, 80, 40, True, True, seed=7)
    with pk.use_backend("nvidia", arch="sm100"), trace_providers() as ran:
        got = flash_mla_sparse_fwd(q, kv, idx, 576 ** -0.5, 512, attn_sink, lengths)
    assert [p for o, b, p in ran if o == OP and b == "nvidia"] == ["triton"]
    _check(got, q, kv, idx, attn_sink, lengths)


def _triton_provider():
    return next(p for p in registry().providers(OP, "nvidia") if p.name == "triton")


def _channel_stride_2(kv: torch.Tensor) -> torch.Tensor:
    """kv's values in a view whose channels lie 2 elements apart."""
    return torch.stack((kv, kv), dim=-1).flatten(-2)[..., ::2]


def test_a_strided_kv_is_declined_with_the_reason_and_served_by_the_oracle():
    q, kv, idx, _, _ = _operands(2, 16, 512, 24, 9, False, False, seed=3)
    strided = _channel_stride_2(kv)
    assert strided.stride(-1) == 2 and torch.equal(strided.nan_to_num(), kv.nan_to_num())
    call = SparsePrefillInputs(q, strided, idx, 0.05, 512, None, None, torch.empty(2, 16, 512, dtype=torch.bfloat16),
                               torch.empty(2, 16), torch.empty(2, 16))
    assert any("kv's last dim is not contiguous (stride 2)" in r for r in _triton_provider().not_supported_reasons(call))
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        got = flash_mla_sparse_fwd(q, strided, idx, 512 ** -0.5, 512)
    assert [p for o, b, p in ran if o == OP and b == "nvidia"] == ["layout-reference"]
    _check(got, q, kv, idx, None, None)


def test_the_launcher_rejects_what_the_kernel_cannot_read():
    q, kv, idx, _, _ = _operands(2, 16, 576, 24, 9, False, False, seed=4)
    out, stats = torch.empty(2, 16, 512, dtype=torch.bfloat16), torch.empty(2, 16)
    with pytest.raises(ContractError, match="kv"):
        mla_sparse_prefill.flash_mla_sparse_fwd(q, _channel_stride_2(kv), idx, 0.05, None, None, out,
                                                stats, stats.clone())
    with pytest.raises(ContractError, match="out"):
        mla_sparse_prefill.flash_mla_sparse_fwd(q, kv, idx, 0.05, None, None, out.half(), stats, stats.clone())
    with pytest.raises(ContractError, match="q"):
        mla_sparse_prefill.flash_mla_sparse_fwd(q[..., :100], kv, idx, 0.05, None, None, out, stats, stats.clone())
