"""FP8 cast provider over `npu_dynamic_mx_quant` (Ascend 950; docs/ascend.md, *Casts*).

`per_token_cast_to_fp8(x, gran_k, use_ue8m0=True)` is exactly
`npu_dynamic_mx_quant(x, axis=-1, dst_type=float8_e4m3fn, block_size=gran_k, scale_alg=1,
max_low_bound=1e-4)`: scale_alg 1 computes S = amax / 448 and rounds its exponent up (our
`ceil_to_ue8m0(amax / 448)`), and `max_low_bound` clamps amax to >= 1e-4 as the contract does
(aclnnDynamicMxQuantV3; in torch_npu after 26.1.0). The scales come back as UE8M0 pairs
`[M, ceil(ceil(K/gran_k)/2), 2]`; the provider returns them as fp32 `[M, ceil(K/gran_k)]` (the plain
form) or keeps the pairs when the consumer takes them (gran_k = 32, the MX GEMM's input).
"""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.layouts import SCALE_AMAX_FLOOR, ue8m0_to_fp32

#: npu_dynamic_mx_quant's scale_alg whose scale is ceil_pow2(amax / dst_max) (aclnnDynamicMxQuant "场景2")
SCALE_ALG_CEIL = 1
#: the UE8M0 code of a NaN scale (what a block holding NaN/Inf gets)
E8M0_NAN = 0xFF
#: block_size limits (aclnnDynamicMxQuant: a multiple of 32, > 0, <= 1024)
MX_BLOCK_MULTIPLE, MX_BLOCK_MAX = 32, 1024


def mx_cast_pairs(npu: Any, x: torch.Tensor, gran_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 [..., K], UE8M0 pairs uint8 [..., ceil(ceil(K/gran_k)/2), 2]) of x per (1, gran_k)."""
    return npu.npu_dynamic_mx_quant(x, axis=-1, dst_type=torch.float8_e4m3fn, block_size=gran_k,
                                    scale_alg=SCALE_ALG_CEIL, max_low_bound=SCALE_AMAX_FLOOR)


def pairs_to_fp32(pairs: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """fp32 scales [..., num_blocks] from UE8M0 pairs [..., ceil(num_blocks/2), 2] (the pad byte dropped)."""
    codes = pairs.view(torch.uint8).flatten(-2)[..., :num_blocks].contiguous()
    return ue8m0_to_fp32(codes)


def mx_cast_fp32_scales(npu: Any, x: torch.Tensor, gran_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 [..., K], fp32 power-of-two scales [..., ceil(K/gran_k)]) — the contract's plain form."""
    data, pairs = mx_cast_pairs(npu, x, gran_k)
    return data, pairs_to_fp32(pairs, -(-x.shape[-1] // gran_k))
