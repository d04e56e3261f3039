"""`tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)` — DeepGEMM's hyper-connection prenorm
GEMM (the mHC mixing of DeepSeek's newer models): one pass over the bf16 activations gives both
the small projection and the squared norm the RMSNorm after it needs.

Contract: a bf16 [M, K] (K-major), b fp32 [N, K] (K-major, N small: 24 in DeepGEMM's tests),
    d[m, n] = sum_k a[m, k] · b[n, k]        sqr_sum[m] = sum_k a[m, k]²
written into d fp32 [M, N] and sqr_sum fp32 [M]. With num_splits = S >= 1, d is [S, M, N] and
sqr_sum [S, M]: split s holds the same sums over its own range of K — the s-th of S consecutive
ranges of ceil(K / S) columns (ranges past K are empty and hold zeros) — so that d.sum(0) and
sqr_sum.sum(0) are the totals (how DeepGEMM's callers reduce them). The products run in TF32 on a
GPU (the op's name: a's bf16 values are exact in TF32, b is rounded to it), so the tolerance is
TF32's: calc_diff <= 1e-6 against the sums in double.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_int, check_tensor, contiguous, fail
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.providers import Inputs
from ...core.tensors import describe

#: calc_diff bound of TF32 products (b rounded to 10 mantissa bits) against the sums in double
TF32_TOLERANCE = 1e-6


def split_ranges(k: int, num_splits: int) -> list[tuple[int, int]]:
    """The K range [lo, hi) of each split: S consecutive ranges of ceil(K / S) columns, clipped to K."""
    chunk = -(-k // num_splits)
    return [(min(s * chunk, k), min((s + 1) * chunk, k)) for s in range(num_splits)]


def hc_prenorm_reference(a: torch.Tensor, b: torch.Tensor, num_splits: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, sqr_sum) in fp32 (fp64 for fp64 inputs): [M, N] and [M], or [S, M, N] and [S, M] per split."""
    dtype = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    a, b = a.to(dtype), b.to(dtype)
    if num_splits is None:
        return a @ b.T, a.square().sum(-1)
    parts = [(a[:, lo:hi] @ b[:, lo:hi].T, a[:, lo:hi].square().sum(-1)) for lo, hi in split_ranges(a.shape[1],
                                                                                                       num_splits)]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


@attrs.frozen
class HcPrenormInputs(Inputs):
    """One tf32_hc_prenorm_gemm call (validated): a bf16 [M, K], b fp32 [N, K], d fp32 [M, N] or
    [S, M, N] and sqr_sum fp32 [M] or [S, M] to write, num_splits None or S."""

    a: torch.Tensor
    b: torch.Tensor
    d: torch.Tensor
    sqr_sum: torch.Tensor
    num_splits: int | None
    device_field = "a"

    def dims(self) -> dict[str, int]:
        m, k = self.a.shape
        return {"M": m, "N": self.b.shape[0], "K": k, "S": self.num_splits or 0}


def hc_prenorm_kernel(call: HcPrenormInputs) -> None:
    """Reference kernel: the contract's sums in fp32, written into d and sqr_sum."""
    d, s = hc_prenorm_reference(call.a, call.b, call.num_splits)
    call.d.copy_(d)
    call.sqr_sum.copy_(s)


HC_PRENORM = register_contract(OpContract("tf32_hc_prenorm_gemm", hc_prenorm_reference,
                                          Tolerance(dequantized=TF32_TOLERANCE), kernel=hc_prenorm_kernel))


def _fail(arg: str, given: Any, expected: str, fix: str) -> None:
    fail(HC_PRENORM.name, arg, given, expected, fix)


def _check_out(arg: str, t: Any, shape: tuple[int, ...], device: torch.device) -> None:
    """An fp32 contiguous output of `shape` on a's device."""
    dims = ", ".join(map(str, shape))
    check_tensor(HC_PRENORM.name, arg, t, (torch.float32,), shape, device,
                 f"allocate {arg} = torch.empty({dims}, dtype=torch.float32)")
    contiguous(HC_PRENORM.name, arg, t)


@public_op(HC_PRENORM)
def tf32_hc_prenorm_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                         num_splits: int | None = None) -> None:
    """d = a · bᵀ and sqr_sum = Σ_k a² per row, written in place (DeepGEMM `tf32_hc_prenorm_gemm`).

    a: bf16 [M, K] with stride(1) == 1; b: fp32 [N, K] with stride(1) == 1; d: fp32 [M, N]
    contiguous; sqr_sum: fp32 [M] contiguous. num_splits: None, or S >= 1 with d [S, M, N] and
    sqr_sum [S, M] holding the partial sums of S consecutive K ranges (sum over dim 0 for the totals).
    """
    if is_compiling():
        return compiled_call("tf32_hc_prenorm_gemm", a, b, d, sqr_sum, num_splits)
    if not isinstance(a, torch.Tensor) or a.dtype != torch.bfloat16 or a.dim() != 2:
        _fail("a", describe(a), "a 2-D bfloat16 tensor [M, K]", "pass the activations as bf16 [M, K]")
    if a.shape[1] and a.stride(1) != 1:
        _fail("a", f"strides {a.stride()}", "K-major (stride(1) == 1)", "pass a.contiguous()")
    m, k = a.shape
    if not isinstance(b, torch.Tensor) or b.dtype != torch.float32 or b.dim() != 2 or b.shape[1] != k:
        _fail("b", describe(b), f"a 2-D float32 tensor [N, K = {k}]", "pass the mixing weights as fp32 [N, K]")
    if b.shape[1] and b.stride(1) != 1:
        _fail("b", f"strides {b.stride()}", "K-major (stride(1) == 1)", "pass b.contiguous()")
    n = b.shape[0]
    if n == 0 or k == 0:
        _fail("b", f"of shape {tuple(b.shape)}", "N >= 1 and K >= 1 (as DeepGEMM)", "pass a non-empty weight")
    if b.device != a.device:
        _fail("b", f"on {b.device}", f"on {a.device} like a", "move b to a's device")
    if num_splits is not None:
        check_int(HC_PRENORM.name, "num_splits", num_splits, 1, fix="pass None or a split count >= 1")
    lead = () if num_splits is None else (int(num_splits),)
    _check_out("d", d, (*lead, m, n), a.device)
    _check_out("sqr_sum", sqr_sum, (*lead, m), a.device)
    if m == 0:
        return
    run(HC_PRENORM, HcPrenormInputs(a, b, d, sqr_sum, None if num_splits is None else int(num_splits)))


__all__ = ["tf32_hc_prenorm_gemm", "hc_prenorm_reference", "split_ranges", "HC_PRENORM", "HcPrenormInputs"]
