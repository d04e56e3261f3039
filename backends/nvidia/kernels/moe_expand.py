"""expand_to_fused(_with_sf) in Triton: copy each token (and its per-token scales) bit for bit to
its rows of the expert-major buffer; padding rows (pos_to_expert < 0) become zero.

Programs [0, T·k) copy the row of one (token, slot) whose position is >= 0 (positions past the
buffer are skipped: memory-safe on unchecked device inputs); the programs after them zero the
padding rows, ZERO_ROWS rows each. Data moves as raw bits of its width (fp8, bf16, fp32, ...), scales as fp32 into
any strides (row-major or the TMA-aligned MN-major form).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "expand_to_fused"
BLOCK = 1024
#: rows a zero-filling program covers (padding rows are most rows of a small batch's buffer)
ZERO_ROWS = 16
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@triton.jit
def moe_expand_kernel(x_ptr, sf_ptr, ttp_ptr, pte_ptr, out_ptr, out_sf_ptr, PAIRS, K, P, H, S,
                      stride_x, stride_sf, stride_o, stride_osf_r, stride_osf_c, HAS_SF: tl.constexpr,
                      BLOCK: tl.constexpr, S_POW2: tl.constexpr, ZERO_ROWS: tl.constexpr, ZERO_COLS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    scols = tl.arange(0, S_POW2)
    if pid < PAIRS:
        pos = tl.load(ttp_ptr + pid).to(tl.int64)
        if (pos >= 0) & (pos < P):
            token = (pid // K).to(tl.int64)
            for start in range(0, H, BLOCK):
                c = start + cols
                v = tl.load(x_ptr + token * stride_x + c, mask=c < H)
                tl.store(out_ptr + pos * stride_o + c, v, mask=c < H)
            if HAS_SF:
                v = tl.load(sf_ptr + token * stride_sf + scols, mask=scols < S)
                tl.store(out_sf_ptr + pos * stride_osf_r + scols * stride_osf_c, v, mask=scols < S)
    else:
        rows = (pid - PAIRS) * ZERO_ROWS + tl.arange(0, ZERO_ROWS)
        pad = (rows < P) & (tl.load(pte_ptr + rows, mask=rows < P, other=0) < 0)
        r64 = rows.to(tl.int64)
        zc = tl.arange(0, ZERO_COLS)
        for start in range(0, H, ZERO_COLS):
            c = start + zc
            tl.store(out_ptr + r64[:, None] * stride_o + c[None, :],
                     tl.zeros((ZERO_ROWS, ZERO_COLS), out_ptr.dtype.element_ty), mask=pad[:, None] & (c[None, :] < H))
        if HAS_SF:
            tl.store(out_sf_ptr + r64[:, None] * stride_osf_r + scols[None, :] * stride_osf_c,
                     tl.zeros((ZERO_ROWS, S_POW2), tl.float32), mask=pad[:, None] & (scols[None, :] < S))


@serialized
def expand_to_fused(x: torch.Tensor, x_sf: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                    pos_to_expert: torch.Tensor, out: torch.Tensor, out_sf: torch.Tensor | None) -> None:
    """Write out [P, H] (x's dtype) and out_sf fp32 [P, S] (any strides) from x [T, H], x_sf [T, S]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.element_size() not in _BITS:
        _checks.fail(OP, "x", repr(x), "a 2-D tensor", "pass [T, H] tokens")
    t, h = x.shape
    _checks.tensor(OP, "token_topk_to_pos", token_topk_to_pos, (torch.int32, torch.int64), (t, None), x.device)
    _checks.tensor(OP, "pos_to_expert", pos_to_expert, (torch.int32, torch.int64), (None,), x.device)
    p = pos_to_expert.shape[0]
    _checks.tensor(OP, "out", out, (x.dtype,), (p, h), x.device)
    _checks.contiguous(OP, "out", out)
    _checks.inner_contiguous(OP, "x", x)
    s = 0
    if x_sf is not None:
        _checks.tensor(OP, "x_sf", x_sf, (torch.float32,), (t, None), x.device)
        _checks.inner_contiguous(OP, "x_sf", x_sf)
        s = x_sf.shape[1]
        _checks.tensor(OP, "out_sf", out_sf, (torch.float32,), (p, s), x.device)
    ttp = token_topk_to_pos.contiguous()
    pairs = ttp.numel()
    if pairs + p == 0 or h == 0:
        return
    bits = _BITS[x.element_size()]
    xb, ob = x.view(bits), out.view(bits)
    sf = x_sf if x_sf is not None else x
    osf = out_sf if out_sf is not None else out
    zero_programs = triton.cdiv(p, ZERO_ROWS)
    moe_expand_kernel[(pairs + zero_programs,)](
        xb, sf, ttp, pos_to_expert, ob, osf, pairs, max(ttp.shape[1], 1), p, h, s, xb.stride(0), sf.stride(0),
        ob.stride(0), osf.stride(0), osf.stride(1), HAS_SF=x_sf is not None,
        BLOCK=min(BLOCK, triton.next_power_of_2(h)), S_POW2=triton.next_power_of_2(max(s, 1)), ZERO_ROWS=ZERO_ROWS,
        ZERO_COLS=min(BLOCK // ZERO_ROWS * 4, triton.next_power_of_2(h)))
