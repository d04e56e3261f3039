"""The Triton K-grouped GEMM kernel in Triton's interpreter: the session's quick conformance of the
three K-grouped ops served by Triton for every case on sm90 and sm100, the nt form without K sizes
on the host (scalar row loads), a device layout past the operands' rows cut at the last row, and
arguments refused before launch naming the argument."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from portable_kernels import calc_diff  # noqa: E402
from portable_kernels.backends.nvidia.kernels import k_grouped  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402

OPS = ["k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous"]


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("op", OPS)
def test_quick_conformance_is_served_by_triton(conformance_report, arch, op):
    r = conformance_report("nvidia", arch=arch).ops[op]
    assert r.ok and r.passed == r.cases > 0 and r.providers == {"triton": r.passed}, r


def _flat_nt(x: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Each group's rows of x [sum_K, MN] stored as its [MN, K_g] block, one after another."""
    out, start = [], 0
    for k in ks:
        out.append(x[start:start + k].T.contiguous().flatten())
        start += k
    return torch.cat(out)


def test_nt_form_without_host_sizes_matches_the_tn_form():
    ks = [40, 88]  # not multiples of 16: only the nt form without `ks` may take them
    a, b = randn(128, 24, seed=1, dtype=torch.bfloat16), randn(128, 40, seed=2, dtype=torch.bfloat16)
    qa, qb = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    layout = torch.tensor(ks, dtype=torch.int32)
    sfa, sfb = torch.rand(2, 24) + 0.5, torch.rand(2, 40) + 0.5  # one 128-row block per group
    d_nt, d_tn = torch.empty(2, 24, 40), torch.empty(2, 24, 40)
    k_grouped.k_grouped_gemm(_flat_nt(qa, ks), _flat_nt(qb, ks), d_nt, layout, layout="nt", sfa=sfa.T, sfb=sfb.T)
    k_grouped.k_grouped_gemm(qa, qb, d_tn, layout, layout="tn", sfa=sfa, sfb=sfb)
    want = torch.stack([(qa[s:s + k].double() * sfa[g].double()).T @ (qb[s:s + k].double() * sfb[g].double())
                        for g, (s, k) in enumerate(((0, 40), (40, 88)))])
    assert torch.equal(d_nt, d_tn)
    assert calc_diff(d_tn, want) < 1e-10  # fp32 accumulation


def test_a_layout_past_the_rows_is_cut_at_the_last_row():
    a, b = randn(64, 8, seed=3, dtype=torch.bfloat16), randn(64, 16, seed=4, dtype=torch.bfloat16)
    d = torch.empty(2, 8, 16)
    k_grouped.k_grouped_gemm(a, b, d, torch.tensor([32, 1000], dtype=torch.int32), use_psum_layout=True, alignment=32)
    want = torch.stack([a[:32].double().T @ b[:32].double(), a[32:].double().T @ b[32:].double()])
    assert calc_diff(d, want) < 1e-10


def _call(**changes):
    args = dict(a=torch.zeros(64, 8, dtype=torch.bfloat16), b=torch.zeros(64, 16, dtype=torch.bfloat16),
                d=torch.empty(1, 8, 16), grouped_layout=torch.tensor([64], dtype=torch.int32))
    args.update(changes)
    return lambda: k_grouped.k_grouped_gemm(**args)


@pytest.mark.parametrize("arg,call", [
    ("d", _call(d=torch.empty(1, 8, 16, dtype=torch.bfloat16))),
    ("d", _call(d=torch.empty(1, 16, 8).mT)),
    ("c", _call(c=torch.empty(2, 8, 16))),
    ("grouped_layout", _call(grouped_layout=torch.tensor([64], dtype=torch.int64))),
    ("a", _call(a=torch.zeros(8, 64, dtype=torch.bfloat16).T)),
    ("b", _call(b=torch.zeros(32, 16, dtype=torch.bfloat16))),
    ("layout", _call(layout="nt")),
    ("alignment", _call(alignment=0)),
    ("ks", _call(ks=(64, 0))),
    ("sfb", _call(a=torch.zeros(64, 8, dtype=torch.float8_e4m3fn), b=torch.zeros(64, 16, dtype=torch.float8_e4m3fn),
                  sfa=torch.ones(1, 8))),
    ("gran_k", _call(a=torch.zeros(64, 8, dtype=torch.float8_e4m3fn), b=torch.zeros(64, 16, dtype=torch.float8_e4m3fn),
                     sfa=torch.ones(1, 8), sfb=torch.ones(1, 16), gran_k=100)),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_arguments_are_refused_before_launch(arg, call):
    with pytest.raises(ContractError, match=f"'{arg}'"):
        call()
