"""torch._scaled_mm with DeepSeek-style block scales (cuBLASLt >= 12.9, Hopper only).

What torch checks (aten/src/ATen/native/cuda/ScaledBlas.cpp, `torch._scaled_mm`):
- mat_a fp8 [M, K] row-major, mat_b fp8 [K, N] column-major (our B [N, K] transposed as a view);
  K and N multiples of 16 (mat1.size(1) % 16, mat2 sizes % 16).
- scale_a "BlockWise 1x128": fp32 [M, ceil(K/128)] with strides (1, M) exactly (outer-dim-major,
  no padding); a dim of size 1 may carry any stride.
- scale_b, checked transposed against B [N, K]: "BlockWise 128x128" is fp32 [ceil(N/128),
  ceil(K/128)] row-major (so scale_b = SFB.T, a view of the sm90 SFB), and "BlockWise 1x128" for
  per-row weights is [N, ceil(K/128)] with strides (1, N).
- DeepSeek scaling runs on compute capability 9.x only.
Our sm90 SFA is MN-major with the row count padded to align(M, 4): its strides are (1, M) exactly
when M % 4 == 0, so the call needs no copy then; for other M this provider declines (a Format
variant that also pads A's rows to 4 would remove that; see docs/ops.md). torch's newer
`_scaled_mm_v2` path asks the 128x128 scales of a 16-byte aligned K-block count, so ceil(K/128)
% 4 == 0 is required here too (all DeepSeek-V3 shapes satisfy it).
cuBLASLt has no C input: with c the product goes to an fp32 buffer, then d = product + c rounds once.
"""

from __future__ import annotations

import attrs
import torch

from portable_kernels.layouts.constants import FP8_BLOCK_K

#: torch's alignment rule for K and N of fp8 matmuls
DIM_MULTIPLE = 16
#: rows of A whose sm90 SFA has exactly the strides cuBLASLt takes
M_MULTIPLE = 4
#: 128x128 scale tensors with 16-byte aligned rows
K_BLOCKS_MULTIPLE = 4


@attrs.frozen
class ScaledMmCall:
    """The arguments of one torch._scaled_mm call (views of the prepared operands, no copies)."""

    mat_a: torch.Tensor
    mat_b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out_dtype: torch.dtype
    b_block: tuple[int, int]


def reasons(m: int, n: int, k: int, sfa: torch.Tensor, sfb: torch.Tensor, gran_a: tuple[int, int],
            gran_b: tuple[int, int], d_dtype: torch.dtype) -> list[str]:
    """Why this provider cannot take the call (empty: it can). Shape rules only; see `device_reasons`."""
    out = []
    if sfa.dtype != torch.float32 or sfb.dtype != torch.float32:
        out.append("cuBLASLt block scaling takes fp32 scales (the sm90 format), not packed UE8M0 words")
    if tuple(gran_a) != (1, FP8_BLOCK_K) or tuple(gran_b) not in ((FP8_BLOCK_K, FP8_BLOCK_K), (1, FP8_BLOCK_K)):
        out.append(f"granularities a {gran_a}, b {gran_b}: cuBLASLt takes a (1, 128) with b (128, 128) or (1, 128)")
    if k % DIM_MULTIPLE or n % DIM_MULTIPLE:
        out.append(f"K = {k} and N = {n} must be multiples of {DIM_MULTIPLE}")
    if m % M_MULTIPLE:
        out.append(f"M = {m} is not a multiple of {M_MULTIPLE}: the sm90 SFA strides are (1, align(M, 4)), "
                   "cuBLASLt wants (1, M)")
    if -(-k // FP8_BLOCK_K) % K_BLOCKS_MULTIPLE:
        out.append(f"ceil(K/128) = {-(-k // FP8_BLOCK_K)} is not a multiple of {K_BLOCKS_MULTIPLE}")
    if d_dtype not in (torch.bfloat16, torch.float32):
        out.append(f"d of dtype {d_dtype}")
    return out


def device_reasons(device: torch.device) -> list[str]:
    """Why torch cannot run DeepSeek-style scaling on `device` (empty: it can try)."""
    if device.type != "cuda":
        return [f"torch._scaled_mm block scaling runs on cuda tensors, not {device.type}"]
    if not hasattr(torch, "_scaled_mm"):
        return ["this torch has no _scaled_mm"]
    major, _ = torch.cuda.get_device_capability(device)
    if major != 9:
        return [f"DeepSeek-style (1x128, 128x128) scaling is Hopper-only in torch (capability {major}.x here)"]
    return []


def call_arguments(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                   gran_b: tuple[int, int], out_dtype: torch.dtype) -> ScaledMmCall:
    """The _scaled_mm arguments for sm90 operands: a [M, K], sfa [M, kb] (strides (1, M) when
    M % 4 == 0), b [N, K], sfb [nb, kb] (128x128) or [N, kb] MN-major (1x128). Only views."""
    m = a.shape[0]
    if sfa.shape[1] > 1 and sfa.stride() != (1, m):
        raise ValueError(f"scaled_mm: sfa strides {sfa.stride()} are not (1, {m}); `reasons` declines this call")
    return ScaledMmCall(a, b.T, sfa, sfb.T, out_dtype, tuple(gran_b))


def run(call: ScaledMmCall, d: torch.Tensor, c: torch.Tensor | None) -> None:
    """Launch on the GPU and write d (= product, or product + c rounded once)."""
    if c is None and call.out_dtype == d.dtype:
        torch._scaled_mm(call.mat_a, call.mat_b, call.scale_a, call.scale_b, out_dtype=d.dtype, out=d)
        return
    product = torch._scaled_mm(call.mat_a, call.mat_b, call.scale_a, call.scale_b, out_dtype=torch.float32)
    if c is not None:
        product += c
    d.copy_(product)
