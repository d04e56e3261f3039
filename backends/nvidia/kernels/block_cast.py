"""block_cast (TileKernels' FP8 / FP4 cast with one scale per (bm x bk) block) in Triton, the
contract's bytes: amax clamped to >= clamp_min, sf = amax / max and q = x · (max / amax) (both
IEEE `div_rn`, the product rounded once); with round_sf sf is rounded up to a power of two and
q = x · (1 / sf); with given scales q = x · (1 / sf). e4m3: clamp to ±448, round to nearest even;
e2m1: ties to the even code, saturating at 6, sign kept, two codes per byte (even element low).

A program holds a [rows, CB blocks, W] tile: per token (bm = 1) ROWS rows of CB k-blocks, else
one block-row of bm rows; W is bk padded to a power of two (e2m1 splits it into element pairs
after the load), so narrow blocks (per channel, bk = 1) still fill a tile. e2m1 with bk = 1 (per channel)
takes each pair of one-column blocks as one tile entry (two scales, one byte); e2m1 with another
odd bk is left to the caller (a pair would straddle two blocks). Where the contract refuses values
(e2m1 codes of NaN / Inf, power-of-two scales of NaN / Inf blocks) the program sets its flag in
`bad` and the caller raises; a NaN block's scale is NaN, as torch's amax gives.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from portable_kernels.layouts.constants import FP4_E2M1_MAX, FP8_E4M3_MAX

from . import _checks
from ._common import INTERPRET, ceil_ue8m0, e4m3_codes, serialized
from .cast_fp4 import e2m1_codes

OP = "block_cast"
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: largest block edge (rows or columns) one program holds
MAX_BLOCK = 128
#: rows per program for per-token blocks (more, larger programs in the interpreter, as cast_fp8)
TOKEN_ROWS = 64 if INTERPRET else 16
#: a tile's width in elements along K at least: narrow blocks are batched up to it
MIN_WIDTH = 64


@triton.jit
def _amax(x):
    """(max |x| per (row, block) over the tile's last axis, whether it holds NaN) as [R, CB] tensors."""
    return tl.max(tl.abs(x), axis=2), tl.max((x != x).to(tl.int32), axis=2)


@triton.jit
def _scale(amax, nan, smask, floor, TOP: tl.constexpr, ROUND: tl.constexpr, PER_TOKEN: tl.constexpr):
    """(sf, the factor q = x · factor, refused) per (row, block) from the block amax and NaN flags."""
    if not PER_TOKEN:  # one block-row: every row of the tile shares each block's scale
        amax = tl.zeros_like(amax) + tl.max(tl.where(smask, amax, 0.0), axis=0)[None, :]
        nan = tl.zeros_like(nan) + tl.max(tl.where(smask, nan, 0), axis=0)[None, :]
    amax = tl.where(nan > 0, float("nan"), tl.maximum(amax, floor))
    if ROUND:
        bad = tl.where((amax == float("inf")) | (amax != amax), 1, 0)
        sf = tl.where(bad > 0, float("nan"), ceil_ue8m0(tl.math.div_rn(amax, TOP)))
        inv = tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), sf)
    else:
        bad = tl.zeros(amax.shape, tl.int32)
        sf = tl.math.div_rn(amax, TOP)
        inv = tl.math.div_rn(tl.full(amax.shape, TOP, tl.float32), amax)
    return sf, inv, bad


@triton.jit
def _given(ptr, sf_rows, blocks, stride_gm, stride_gk, smask):
    """(the given scales, 1 / sf) at (row, block)."""
    sf = tl.load(ptr + sf_rows[:, None].to(tl.int64) * stride_gm + blocks[None, :] * stride_gk, mask=smask, other=1.0)
    return sf, tl.math.div_rn(tl.full(sf.shape, 1.0, tl.float32), sf)


@triton.jit
def _store_scales(ptr, sf, sf_rows, blocks, SFK, smask, lane, PER_TOKEN: tl.constexpr):
    if not PER_TOKEN:  # the block-row's scales once, from the tile's first row
        smask = smask & (lane[:, None] == 0)
    tl.store(ptr + sf_rows[:, None].to(tl.int64) * SFK + blocks[None, :], sf, mask=smask)


@triton.jit
def block_cast_kernel(x_ptr, q_ptr, sf_ptr, given_ptr, bad_ptr, M, K, SFM, SFK, stride_xm, stride_xk,
                      stride_q, stride_gm, stride_gk, floor, BM: tl.constexpr, BK: tl.constexpr,
                      UNIT_K: tl.constexpr, TOP: tl.constexpr, FP4: tl.constexpr,
                      SPLIT: tl.constexpr, ROUND: tl.constexpr, GIVEN: tl.constexpr, PER_TOKEN: tl.constexpr,
                      R: tl.constexpr, CB: tl.constexpr, W: tl.constexpr, INTERPRET: tl.constexpr):
    """SPLIT (e2m1 with bk = 1): index j of the CB axis is the pair of one-column blocks 2j, 2j + 1.
    The block edges are compile-time constants and UNIT_K says x's columns are contiguous, so the
    compiler sees each block's columns as one contiguous run (vector loads)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    lane = tl.arange(0, R)
    if PER_TOKEN:
        rows = pid_r * R + lane
        rmask = rows < M
        sf_rows = rows
    else:
        rows = pid_r * BM + lane
        rmask = (lane < BM) & (rows < M)
        sf_rows = tl.zeros((R,), tl.int32) + pid_r
    j = pid_c * CB + tl.arange(0, CB)
    o = tl.arange(0, W)
    if SPLIT:  # W = 2: the two one-column blocks of a pair, loaded together and split after the load
        blocks = 2 * j
        col = blocks[None, :, None] + o[None, None, :]
        inside = o[None, None, :] < 2
    elif FP4:  # W = 2 · (pairs per block): the block's elements, split into pairs after the load
        blocks = j
        col = blocks[None, :, None] * BK + o[None, None, :]
        inside = o[None, None, :] < BK
    else:
        blocks = j
        col = blocks[None, :, None] * BK + o[None, None, :]
        inside = o[None, None, :] < BK
    bmask = blocks < SFK
    mask = rmask[:, None, None] & bmask[None, :, None] & inside & (col < K)
    if UNIT_K:
        at = x_ptr + rows[:, None, None].to(tl.int64) * stride_xm + col
    else:
        at = x_ptr + rows[:, None, None].to(tl.int64) * stride_xm + col.to(tl.int64) * stride_xk
    lo = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    smask = rmask[:, None] & bmask[None, :]
    if FP4:  # (even, odd) elements of each pair; the pair's mask and column from the even element
        lo, hi = tl.split(tl.reshape(lo, (R, CB, W // 2, 2)))
        mask = tl.split(tl.reshape(mask, (R, CB, W // 2, 2)))[0]
        col = tl.split(tl.reshape(col + 0 * rows[:, None, None], (R, CB, W // 2, 2)))[0]
        if SPLIT:  # lo and hi lie in blocks of their own
            if GIVEN:
                sf_hi, inv_hi = _given(given_ptr, sf_rows, blocks + 1, stride_gm, stride_gk, smask)
                bad = tl.zeros((R, CB), tl.int32)
            else:
                amax, nan = _amax(hi)
                sf_hi, inv_hi, bad = _scale(amax, nan, smask, floor, TOP, ROUND, PER_TOKEN)
                _store_scales(sf_ptr, sf_hi, sf_rows, blocks + 1, SFK, smask, lane, PER_TOKEN)
            if GIVEN:
                sf, inv = _given(given_ptr, sf_rows, blocks, stride_gm, stride_gk, smask)
            else:
                amax, nan = _amax(lo)
                sf, inv, bad_lo = _scale(amax, nan, smask, floor, TOP, ROUND, PER_TOKEN)
                bad = tl.maximum(bad, bad_lo)
                _store_scales(sf_ptr, sf, sf_rows, blocks, SFK, smask, lane, PER_TOKEN)
        else:
            if GIVEN:
                sf, inv = _given(given_ptr, sf_rows, blocks, stride_gm, stride_gk, smask)
                bad = tl.zeros((R, CB), tl.int32)
            else:
                amax_lo, nan_lo = _amax(lo)
                amax_hi, nan_hi = _amax(hi)
                sf, inv, bad = _scale(tl.maximum(amax_lo, amax_hi), tl.maximum(nan_lo, nan_hi), smask, floor, TOP,
                                      ROUND, PER_TOKEN)
                _store_scales(sf_ptr, sf, sf_rows, blocks, SFK, smask, lane, PER_TOKEN)
            inv_hi = inv
        q_lo = lo * inv[:, :, None]
        q_hi = hi * inv_hi[:, :, None]
        finite = (tl.abs(q_lo) < float("inf")) & (tl.abs(q_hi) < float("inf"))
        bad = tl.maximum(bad, tl.max(tl.where(mask & ~finite, 1, 0), axis=2))
        codes = (e2m1_codes(q_lo) | (e2m1_codes(q_hi) << 4)).to(tl.uint8)
        tl.store(q_ptr + rows[:, None, None].to(tl.int64) * stride_q + (col // 2), codes, mask=mask)
    else:
        if GIVEN:
            sf, inv = _given(given_ptr, sf_rows, blocks, stride_gm, stride_gk, smask)
            bad = tl.zeros((R, CB), tl.int32)
        else:
            amax, nan = _amax(lo)
            sf, inv, bad = _scale(amax, nan, smask, floor, TOP, ROUND, PER_TOKEN)
            _store_scales(sf_ptr, sf, sf_rows, blocks, SFK, smask, lane, PER_TOKEN)
        q = tl.clamp(lo * inv[:, :, None], -TOP, TOP, propagate_nan=tl.PropagateNan.ALL)
        tl.store(q_ptr + rows[:, None, None].to(tl.int64) * stride_q + col, e4m3_codes(q, INTERPRET), mask=mask)
    flag = tl.max(tl.max(tl.where(smask, bad, 0), axis=1), axis=0)
    tl.store(bad_ptr + pid_r * tl.num_programs(1) + pid_c, flag)


def supports(block: tuple[int, int], element: str) -> bool:
    """Whether the kernel takes this block: edges at most MAX_BLOCK, and (e2m1) bk even (a pair of
    elements in one block) or 1 (a pair of one-column blocks)."""
    bm, bk = block
    return bm <= MAX_BLOCK and bk <= MAX_BLOCK and (element == "e4m3" or bk % 2 == 0 or bk == 1)


@serialized
def block_cast(x: torch.Tensor, block: tuple[int, int], element: str, round_sf: bool, clamp_min: float,
               sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """x bf16/fp16/fp32 [M, K] (any strides) -> (e4m3 [M, K] or uint8 [M, K/2] packed e2m1, fp32 scales
    [ceil(M/bm), ceil(K/bk)], refused) where `refused` is a device bool tensor: a value the contract
    refuses (NaN / Inf codes for e2m1, or scales of NaN / Inf blocks with round_sf) was met."""
    _checks.tensor(OP, "x", x, INPUT_DTYPES, (None, None))
    if element not in ("e4m3", "e2m1"):
        _checks.fail(OP, "element", repr(element), "'e4m3' or 'e2m1'", "pass the contract's element")
    if not (isinstance(block, tuple) and len(block) == 2 and all(isinstance(v, int) and v >= 1 for v in block)):
        _checks.fail(OP, "block", repr(block), "a pair of ints >= 1", "pass e.g. (1, 128)")
    if not supports(block, element):
        _checks.fail(OP, "block", repr(block), f"edges <= {MAX_BLOCK} (for e2m1 bk even or 1)",
                     "use the layout-reference provider for wider blocks")
    m, k = x.shape
    fp4 = element == "e2m1"
    if fp4 and k % 2:
        _checks.fail(OP, "x", f"K = {k}", "an even K for e2m1", "pad K")
    bm, bk = block
    sfm, sfk = -(-m // bm), -(-k // bk)
    if sf is not None:
        _checks.tensor(OP, "sf", sf, (torch.float32,), (sfm, sfk), x.device)
    device = x.device
    data = torch.empty(m, k // 2 if fp4 else k, dtype=torch.uint8 if fp4 else torch.float8_e4m3fn, device=device)
    scales = sf.contiguous() if sf is not None else torch.empty(sfm, sfk, dtype=torch.float32, device=device)
    if m == 0 or k == 0:
        return data, scales, torch.zeros((), dtype=torch.bool, device=device)
    split = fp4 and bk == 1
    width = 2 if split else triton.next_power_of_2(bk)
    cb = max(1, MIN_WIDTH // width)
    per_token = bm == 1
    r = TOKEN_ROWS if per_token else triton.next_power_of_2(bm)
    grid = (triton.cdiv(m, r) if per_token else sfm, triton.cdiv(-(-sfk // 2) if split else sfk, cb))
    bad = torch.empty(grid, dtype=torch.int32, device=device)
    given = sf if sf is not None else scales
    block_cast_kernel[grid](
        x, data.view(torch.uint8), scales, given, bad, m, k, sfm, sfk, x.stride(0), x.stride(1),
        data.stride(0), given.stride(0), given.stride(1), float(clamp_min), BM=bm, BK=bk, UNIT_K=x.stride(1) == 1,
        TOP=FP4_E2M1_MAX if fp4 else FP8_E4M3_MAX, FP4=fp4, SPLIT=split, ROUND=bool(round_sf) and sf is None,
        GIVEN=sf is not None, PER_TOKEN=per_token, R=r, CB=cb, W=width, INTERPRET=INTERPRET,
        num_warps=8 if r * cb * width >= 8192 else 4)
    return data, scales, bad.any()
