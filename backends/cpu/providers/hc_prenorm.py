"""The cpu provider of tf32_hc_prenorm_gemm: torch's own fp32 matmul (the BLAS torch ships) over
blocks of rows, the squared norm from the same fp32 block — what a user would write, without
widening all of `a` at once (DeepGEMM's shapes reach M = 8192 x K = 28672: 0.9 GB in fp32).

On CPU the products are fp32, not TF32: closer to the exact sums than the contract asks.
"""

from __future__ import annotations

import torch

from .._names import BACKEND

PROVIDER = "torch-blas"
#: rows widened to fp32 at a time (bounds the temporary at ROW_BLOCK x K x 4 bytes)
ROW_BLOCK = 256


def hc_prenorm_blas(call) -> None:
    """HcPrenormInputs: d = a · bᵀ and sqr_sum = Σ a² (per K split when num_splits is set)."""
    from portable_kernels.ops.gemm.hc_prenorm import split_ranges
    a, b = call.a, call.b
    m, k = a.shape
    splits = split_ranges(k, call.num_splits) if call.num_splits is not None else [(0, k)]
    d = call.d if call.num_splits is not None else call.d.unsqueeze(0)
    sqr = call.sqr_sum if call.num_splits is not None else call.sqr_sum.unsqueeze(0)
    for r0 in range(0, m, ROW_BLOCK):
        r1 = min(m, r0 + ROW_BLOCK)
        block = a[r0:r1].float()
        for s, (lo, hi) in enumerate(splits):
            if hi <= lo:
                d[s, r0:r1].zero_()
                sqr[s, r0:r1].zero_()
                continue
            part = block[:, lo:hi]
            torch.matmul(part, b[:, lo:hi].T, out=d[s, r0:r1])
            torch.sum(part.square(), dim=-1, out=sqr[s, r0:r1])


def register(registry) -> None:
    from portable_kernels.ops.gemm.hc_prenorm import HC_PRENORM
    registry.kernel(HC_PRENORM.name, BACKEND, PROVIDER, priority=10, devices=("cpu",),
                    doc=f"torch fp32 matmul (oneDNN / MKL) over blocks of {ROW_BLOCK} rows widened once; "
                        "fp32 products (the contract allows TF32)")(hc_prenorm_blas)
