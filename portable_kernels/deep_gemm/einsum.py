"""DeepGEMM's `einsum` and `fp8_einsum` with its signatures: the hard-coded Einstein sums DeepGEMM
provides (MLA's per-head absorption products and their weight gradient), each composed of the
portable GEMM ops, so every backend runs them on its own GEMM providers.

    einsum(expr, a, b, d, c=None, use_cublaslt=False)          bf16 a, b; d bf16 or fp32
        "bmk,bnk->mn"   d = c + sum_b a[b]·b[b]ᵀ   -> bf16_gemm_nt over K = (b, k)
        "bhr,hdr->bhd"  d[:, h] = a[:, h]·b[h]ᵀ     -> m_grouped_bf16_gemm_nt_masked over heads
        "bhd,hdr->bhr"  d[:, h] = a[:, h]·b[h]      -> the same with b[h] transposed
    fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128))     (fp8, fp32 scales) pairs
        "bhr,hdr->bhd"  a per token (1, 128) over r, b per (128, 128) block over (d, r)
                        -> m_grouped_fp8_gemm_nt_masked over heads
        "bhd,hdr->bhr"  a per token over d, b per (128, 128) block over (d, r), used transposed
        "bhd,bhr->hdr"  d = c + per head a[:, h]ᵀ·b[:, h]; recipe (1, 1, 128): per-channel scales,
                        one per 128 rows of b  -> k_grouped_fp8_gemm_tn_contiguous, a group per head

Differs from DeepGEMM: the operands are copied into the grouped GEMMs' head-major order (one copy
of a and of the output per call; DeepGEMM's kernels read the strided views); `use_cublaslt` is
accepted and selects nothing (the backend's providers decide); "bhd,hdr->bhr" and "bhd,bhr->hdr"
in FP8 run on every backend (DeepGEMM: SM100 only); a `c` of the masked forms is added after the
GEMM. Any other expression is refused, as DeepGEMM does.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.alignment import get_m_alignment_for_contiguous_layout
from ..core.checks import check_tensor, fail as _fail
from ..core.tensors import describe
from ..ops.gemm import dense as pk_dense
from ..ops.gemm import grouped as pk_grouped
from ..ops.gemm import k_grouped as pk_k

__all__ = ["einsum", "fp8_einsum"]

BF16_EXPRS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr")
FP8_EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")
SCALE_BLOCK = 128


def _check(op: str, arg: str, t: Any, dtypes: tuple[torch.dtype, ...], dims: int) -> torch.Tensor:
    check_tensor(op, arg, t, dtypes, (None,) * dims, fix=f"pass {arg} as the expression names it")
    return t


def _check_out(op: str, d: Any, shape: tuple[int, ...], c: Any, allow_c: bool, expr: str) -> None:
    _check(op, "d", d, (torch.bfloat16, torch.float32), len(shape))
    if tuple(d.shape) != shape:
        _fail(op, "d", f"of shape {tuple(d.shape)}", f"{list(shape)} for {expr!r}", "allocate d with that shape")
    if c is None:
        return
    if not allow_c:
        _fail(op, "c", describe(c), f"None for {expr!r} (as DeepGEMM)", "add the accumulator yourself after the call")
    if not isinstance(c, torch.Tensor) or c.dtype != d.dtype or tuple(c.shape) != shape:
        _fail(op, "c", describe(c), f"None or a {str(d.dtype)[6:]} tensor {list(shape)} (d's dtype and shape)",
              "pass the accumulator like d (it may be d itself)")


def _heads(op: str, x: torch.Tensor, w: torch.Tensor, d: torch.Tensor, transpose_w: bool) -> None:
    """d[:, h] = x[:, h] · w'[h]ᵀ for bf16 x [B, H, K] and w [H, N, K] (w' = w, or w [H, K, N] transposed)."""
    batch, heads, k = x.shape
    rhs = w.transpose(1, 2) if transpose_w else w
    out = torch.empty(heads, batch, rhs.shape[1], dtype=d.dtype, device=d.device)
    masked = torch.full((heads,), batch, dtype=torch.int32, device=x.device)
    pk_grouped.m_grouped_bf16_gemm_nt_masked(x.transpose(0, 1).contiguous(), rhs.contiguous(), out, masked,
                                             max(batch, 1))
    d.copy_(out.transpose(0, 1))


def einsum(expr: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
           use_cublaslt: bool = False) -> None:
    """DeepGEMM `einsum` (module docstring): bf16 a and b, d bf16 or fp32 written in place."""
    op = "einsum"
    if expr not in BF16_EXPRS:
        _fail(op, "expr", repr(expr), f"one of {BF16_EXPRS}", "DeepGEMM hard-codes these expressions")
    if not isinstance(use_cublaslt, bool):
        _fail(op, "use_cublaslt", repr(use_cublaslt), "a bool", "pass True or False")
    a, b = _check(op, "a", a, (torch.bfloat16,), 3), _check(op, "b", b, (torch.bfloat16,), 3)
    if expr == "bmk,bnk->mn":
        if use_cublaslt:
            _fail(op, "use_cublaslt", "True", f"False for {expr!r} (as DeepGEMM)", "drop use_cublaslt")
        s, m, k = a.shape
        if b.shape[0] != s or b.shape[2] != k:
            _fail(op, "b", f"of shape {tuple(b.shape)}", f"[{s}, n, {k}] like a {tuple(a.shape)}", "pass b [b, n, k]")
        _check_out(op, d, (m, b.shape[1]), c, True, expr)
        # the batch sum is one GEMM over K = (b, k): both operands laid out [rows, b·k]
        lhs = a.permute(1, 0, 2).reshape(m, s * k)
        rhs = b.permute(1, 0, 2).reshape(b.shape[1], s * k)
        pk_dense.bf16_gemm_nt(lhs, rhs, d, c)
        return
    batch, heads, k = a.shape
    contract_dim = 2 if expr == "bhr,hdr->bhd" else 1
    if b.shape[0] != heads or b.shape[contract_dim] != k:
        want = f"[{heads}, n, {k}]" if contract_dim == 2 else f"[{heads}, {k}, n]"
        _fail(op, "b", f"of shape {tuple(b.shape)}", f"{want} for {expr!r}", "pass the per-head weights")
    n = b.shape[1] if contract_dim == 2 else b.shape[2]
    _check_out(op, d, (batch, heads, n), c, False, expr)
    if batch:
        _heads(op, a, b, d, transpose_w=contract_dim == 1)


def _pair(op: str, arg: str, t: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(t, (tuple, list)) or len(t) != 2:
        _fail(op, arg, describe(t), "a pair (float8_e4m3fn values, fp32 scales)",
              "quantize with deep_gemm.utils.per_token_cast_to_fp8 / per_block_cast_to_fp8 / per_channel_cast_to_fp8")
    values, scales = t
    _check(op, arg, values, (torch.float8_e4m3fn,), 3)
    _check(op, arg, scales, (torch.float32,), 3)
    return values, scales


def _scales(op: str, arg: str, scales: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(scales.shape) != shape:
        _fail(op, arg, f"scales of shape {tuple(scales.shape)}", f"{list(shape)}",
              "quantize with the granularity the expression takes (module docstring)")


def fp8_einsum(expr: str, a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
               recipe: tuple[int, int, int] = (1, 128, 128)) -> None:
    """DeepGEMM `fp8_einsum` (module docstring): a and b (fp8, fp32 scales) pairs, d written in place."""
    op = "fp8_einsum"
    if expr not in FP8_EXPRS:
        _fail(op, "expr", repr(expr), f"one of {FP8_EXPRS}", "DeepGEMM hard-codes these expressions")
    want_recipe = (1, 1, 128) if expr == "bhd,bhr->hdr" else (1, 128, 128)
    if tuple(recipe) != want_recipe:
        _fail(op, "recipe", repr(recipe), f"{want_recipe} for {expr!r}", f"pass recipe={want_recipe}")
    (av, asf), (bv, bsf) = _pair(op, "a", a), _pair(op, "b", b)
    cdiv = lambda x: -(-x // SCALE_BLOCK)  # noqa: E731
    if expr == "bhd,bhr->hdr":
        _k_grouped(op, av, asf, bv, bsf, d, c, expr)
        return
    batch, heads, k = av.shape
    _scales(op, "a", asf, (batch, heads, cdiv(k)))
    contract_dim = 2 if expr == "bhr,hdr->bhd" else 1
    if bv.shape[0] != heads or bv.shape[contract_dim] != k:
        want = f"[{heads}, n, {k}]" if contract_dim == 2 else f"[{heads}, {k}, n]"
        _fail(op, "b", f"of shape {tuple(bv.shape)}", f"{want} for {expr!r}", "pass the per-head weights")
    _scales(op, "b", bsf, (heads, cdiv(bv.shape[1]), cdiv(bv.shape[2])))
    if contract_dim == 1:  # b[h] is [K, N]: the GEMM reads [N, K], blocks transpose with it
        bv, bsf = bv.transpose(1, 2), bsf.transpose(1, 2)
    n = bv.shape[1]
    _check_out(op, d, (batch, heads, n), c, True, expr)
    if batch == 0:
        return
    out = torch.empty(heads, batch, n, dtype=torch.float32 if c is not None else d.dtype, device=d.device)
    masked = torch.full((heads,), batch, dtype=torch.int32, device=av.device)
    lhs = (av.transpose(0, 1).contiguous(), asf.transpose(0, 1).contiguous())
    pk_grouped.m_grouped_fp8_gemm_nt_masked(lhs, (bv.contiguous(), bsf.contiguous()), out, masked, batch)
    if c is not None:
        out = out + c.transpose(0, 1).float()
    d.copy_(out.transpose(0, 1))


def _k_grouped(op: str, av: torch.Tensor, asf: torch.Tensor, bv: torch.Tensor, bsf: torch.Tensor, d: torch.Tensor,
               c: torch.Tensor | None, expr: str) -> None:
    """"bhd,bhr->hdr": per head h, d[h] = c[h] + a[:, h]ᵀ·b[:, h] over the batch, a group per head
    of the k-grouped GEMM (each head's batch rows padded with zero rows to the contiguous alignment)."""
    batch, heads, m = av.shape
    if bv.shape[0] != batch or bv.shape[1] != heads:
        _fail(op, "b", f"of shape {tuple(bv.shape)}", f"[{batch}, {heads}, r] like a", "pass b [b, h, r]")
    n = bv.shape[2]
    if batch % SCALE_BLOCK:
        _fail(op, "a", f"a batch of {batch} rows", f"a multiple of {SCALE_BLOCK} (one scale per 128 rows of the "
              "batch in each head)", "pad the batch with zero rows")
    blocks = batch // SCALE_BLOCK
    _scales(op, "a", asf, (blocks, heads, m))
    _scales(op, "b", bsf, (blocks, heads, n))
    if d.dtype != torch.float32:
        _fail(op, "d", describe(d), "fp32 [h, d, r] (the weight-gradient accumulator)", "pass an fp32 d")
    _check_out(op, d, (heads, m, n), c, True, expr)
    if c is not None and c.dtype != torch.float32:
        _fail(op, "c", describe(c), "fp32 like d", "pass an fp32 c")
    align = get_m_alignment_for_contiguous_layout(av.device)
    rows = -(-batch // align) * align  # each head's K rows, padded to the layout's alignment

    def grouped(values: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        width = values.shape[2]
        v = torch.zeros(heads, rows, width, dtype=torch.uint8, device=values.device)
        v[:, :batch] = values.view(torch.uint8).permute(1, 0, 2)
        s = torch.ones(heads, rows // SCALE_BLOCK, width, dtype=torch.float32, device=values.device)
        s[:, :blocks] = scales.permute(1, 0, 2)
        return v.view(torch.float8_e4m3fn).reshape(heads * rows, width), s.reshape(heads * rows // SCALE_BLOCK, width)

    ks = [rows] * heads
    layout = torch.full((heads,), rows, dtype=torch.int32, device=av.device)
    pk_k.k_grouped_fp8_gemm_tn_contiguous(grouped(av, asf), grouped(bv, bsf), d, ks, layout, c, (1, 1, SCALE_BLOCK))
