"""The shapes the varlen attention kernel (varlen_attention.py) takes and its tiles, kept apart from
it so that the provider can decline a call without importing Triton."""

from __future__ import annotations

import torch

#: tl.dot's smallest K and N
MIN_DOT = 16
#: the widest padded head dims whose tiles stay in registers without a spill (docs/nvidia.md)
MAX_HEAD_DIM = 256
MAX_HEAD_DIM_V = 256
#: (largest padded d_v, BLOCK_M, BLOCK_N, warps, stages): one warp group per 64 query rows. d_v 256
#: spills with 64 or 32 keys per tile on sm_90a (24 / 8 B) and sm_100a, so its tile takes 16
TILES = ((128, 128, 64, 8, 2), (256, 64, 16, 4, 2))


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def head_dim_split(d: int) -> tuple[int, int]:
    """(D_MAIN, D_TAIL): power-of-two channel blocks covering d (192 = 128 + 64; D_TAIL 0 when
    D_MAIN covers d); channels past d in either block are masked zeros."""
    main = max(MIN_DOT, 1 << (d.bit_length() - 1))
    rest = d - main
    return main, (0 if rest <= 0 else max(MIN_DOT, _pow2_ceil(rest)))


def padded_dv(d_v: int) -> int:
    """The accumulator's width for d_v value channels: a power of two >= 16."""
    return max(MIN_DOT, _pow2_ceil(d_v))


def tile(d_v: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for values of d_v channels (d_v <= MAX_HEAD_DIM_V)."""
    for limit, block_m, block_n, warps, stages in TILES:
        if padded_dv(d_v) <= limit:
            return block_m, block_n, warps, stages
    raise ValueError(f"d_v {d_v} above {MAX_HEAD_DIM_V}: check unsupported_reasons first")


def unsupported_reasons(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> list[str]:
    """Every reason the kernel cannot read these operands in place (head dims wider than its tiles,
    channels not contiguous); the layout oracle serves such calls."""
    out = []
    d, d_v = q.shape[-1], v.shape[-1]
    main, tail = head_dim_split(d)
    if main + tail > MAX_HEAD_DIM:
        out.append(f"head dim d = {d} pads to {main + tail} > {MAX_HEAD_DIM} channels: the Q and K tiles would "
                   f"not fit in registers")
    if padded_dv(d_v) > MAX_HEAD_DIM_V:
        out.append(f"d_v = {d_v} > {MAX_HEAD_DIM_V}: the output accumulator would not fit in registers")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            out.append(f"{name}'s last dim is not contiguous (stride {t.stride(-1)}): the kernel loads it as "
                       f"vectors; pass {name}.contiguous()")
    return out
