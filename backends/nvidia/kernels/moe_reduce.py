"""reduce_fused in Triton: each token's weighted sum of its expert rows, back in token order.

out[t] = Σ_slots x[pos] · weight (· x_sf[pos]) over the token's slots with pos >= 0, accumulated in
fp32 in slot order, each term one fma (the reference's order and rounding); rows no slot points to are never read. Outputs: x's
dtype (bf16 rounded to nearest even, or fp32), or e4m3 after multiplying by sf and clamping to ±448.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP8_E4M3_MAX

from . import _checks
from ._common import INTERPRET, e4m3_codes, serialized, to_out

OP = "reduce_fused"
BLOCK = 512


@triton.jit
def moe_reduce_kernel(x_ptr, xsf_ptr, w_ptr, ttp_ptr, sf_ptr, out_ptr, P, H, stride_x, stride_w, stride_t, stride_o,
                      K: tl.constexpr, HAS_W: tl.constexpr, HAS_XSF: tl.constexpr, HAS_SF: tl.constexpr,
                      OUT_KIND: tl.constexpr, FP8_MAX: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    acc = tl.zeros((BLOCK,), tl.float32)
    for k in tl.static_range(K):
        pos = tl.load(ttp_ptr + token * stride_t + k).to(tl.int64)
        valid = (pos >= 0) & (pos < P)
        scale = 1.0
        if HAS_W:
            scale = tl.load(w_ptr + token * stride_w + k)
        if HAS_XSF:
            scale = scale * tl.load(xsf_ptr + pos, mask=valid, other=0.0)
        # the slot's validity as a vector (the interpreter cannot mix scalar and vector masks)
        take = cmask & ((pos + tl.zeros((BLOCK,), tl.int64)) >= 0) & ((pos + tl.zeros((BLOCK,), tl.int64)) < P)
        row = tl.load(x_ptr + pos * stride_x + cols, mask=take, other=0.0).to(tl.float32)
        acc = tl.where(take, tl.fma(row, scale, acc), acc)  # one rounding per term, as TileKernels
    if OUT_KIND == 2:
        if HAS_SF:
            acc = acc * tl.load(sf_ptr)
        acc = tl.clamp(acc, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        tl.store(out_ptr + token * stride_o + cols, e4m3_codes(acc, INTERPRET), mask=cmask)
    else:
        tl.store(out_ptr + token * stride_o + cols, to_out(acc, OUT_KIND == 1, INTERPRET), mask=cmask)


@serialized
def reduce_fused(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
                 token_topk_to_pos: torch.Tensor, sf: torch.Tensor | None, fp8: bool, out: torch.Tensor) -> None:
    """out [T, H] (x's dtype, or e4m3 with fp8) from x bf16/fp32 [P, H] and the mapping [T, k]."""
    _checks.tensor(OP, "x", x, (torch.bfloat16, torch.float32), (None, None))
    p, h = x.shape
    device = x.device
    _checks.inner_contiguous(OP, "x", x)
    _checks.tensor(OP, "token_topk_to_pos", token_topk_to_pos, (torch.int32, torch.int64), (None, None), device)
    t, k = token_topk_to_pos.shape
    if x_sf is not None:
        _checks.tensor(OP, "x_sf", x_sf, (torch.float32,), (p,), device)
        _checks.contiguous(OP, "x_sf", x_sf)
    if topk_weights is not None:
        _checks.tensor(OP, "topk_weights", topk_weights, (torch.float32,), (t, k), device)
    if sf is not None:
        _checks.tensor(OP, "sf", sf, (torch.float32,), (1,), device)
    out_dtype = torch.float8_e4m3fn if fp8 else x.dtype
    _checks.tensor(OP, "out", out, (out_dtype,), (t, h), device)
    _checks.contiguous(OP, "out", out)
    if t == 0 or h == 0:
        return
    ttp = token_topk_to_pos.contiguous()
    w = topk_weights.contiguous() if topk_weights is not None else x
    kind = 2 if fp8 else (1 if x.dtype == torch.bfloat16 else 0)
    target = out.view(torch.uint8) if fp8 else out
    moe_reduce_kernel[(t, triton.cdiv(h, BLOCK))](
        x, x_sf if x_sf is not None else x, w, ttp, sf if sf is not None else x, target, p, h, x.stride(0),
        w.stride(0), ttp.stride(0), target.stride(0), K=k, HAS_W=topk_weights is not None, HAS_XSF=x_sf is not None,
        HAS_SF=sf is not None, OUT_KIND=kind, FP8_MAX=FP8_E4M3_MAX, BLOCK=BLOCK, INTERPRET=INTERPRET)
