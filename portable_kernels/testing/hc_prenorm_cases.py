"""Conformance cases for tf32_hc_prenorm_gemm: DeepGEMM's test shapes scaled down (N = 24, K in
the thousands, M from 1 row to several row tiles), with and without K splits — splits that leave
K's tail short and splits past K, which must come back as exact zeros. Outputs start as NaN; d and
sqr_sum are compared with calc_diff against the sums in double of the same bf16 / fp32 inputs."""

from __future__ import annotations

import functools

import torch

from ..core.numerics import calc_diff
from ..ops.gemm.hc_prenorm import TF32_TOLERANCE, hc_prenorm_reference, split_ranges, tf32_hc_prenorm_gemm
from .core import Case, CaseFailure, conformance_cases
from .generators import poison, randn

#: (M, N, K, num_splits)
QUICK = ((13, 24, 7168, None), (137, 24, 1536, 16), (1, 1, 7, None), (70, 40, 1000, 3), (4, 24, 10, 16))
FULL = QUICK + ((600, 24, 7680, None), (257, 24, 28672 // 4, 16), (64, 256, 512, 2))


def _case(m: int, n: int, k: int, splits: int | None, seed: int, device: torch.device) -> float:
    a = randn(m, k, seed=seed, dtype=torch.bfloat16)
    b = randn(n, k, seed=seed + 1)
    lead = () if splits is None else (splits,)
    d = poison(*lead, m, n, dtype=torch.float32, device=device)
    s = poison(*lead, m, dtype=torch.float32, device=device)
    tf32_hc_prenorm_gemm(a.to(device), b.to(device), d, s, num_splits=splits)
    want_d, want_s = hc_prenorm_reference(a.double(), b.double(), splits)
    got_d, got_s = d.cpu().double(), s.cpu().double()
    if bool(torch.isnan(got_d).any() or torch.isnan(got_s).any()):
        raise CaseFailure("an output element was left unwritten (NaN from the poisoned buffer)")
    if splits is not None:
        for i, (lo, hi) in enumerate(split_ranges(k, splits)):
            if hi <= lo and (bool(got_d[i].any()) or bool(got_s[i].any())):
                raise CaseFailure(f"split {i} covers no K column and must be exact zeros")
    error = max(calc_diff(got_d, want_d), calc_diff(got_s, want_s))
    if error > TF32_TOLERANCE:
        raise CaseFailure(f"calc_diff {error:.3g} > {TF32_TOLERANCE:g} against the sums in double")
    return error


@conformance_cases("tf32_hc_prenorm_gemm")
def hc_prenorm_cases(quick: bool) -> list[Case]:
    return [Case("tf32_hc_prenorm_gemm", f"M={m} N={n} K={k} splits={s}", 7600 + i,
                 functools.partial(_case, m, n, k, s, 7600 + i)) for i, (m, n, k, s) in enumerate(QUICK if quick else FULL)]
