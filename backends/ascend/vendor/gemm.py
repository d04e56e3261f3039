"""GEMM providers over torch_npu (docs/ascend.md, *GEMM*): D = C + A·Bᵀ.

- Ascend 950, power-of-two scales: `npu_quant_matmul` in MX mode (group_sizes [1, 1, 32]) on K-major
  UE8M0 pairs `[MN, ceil(K/64), 2]` (the weight's handed over as its transposed view).
- Ascend 950, arbitrary fp32 scales: `npu_quant_matmul` in G-B mode (group_sizes [1, 128, 128]) on
  DeepGEMM's plain scales, no re-quantization.
- Atlas A2/A3 (no FP8): the weight was dequantized once at ingest, to bf16 where that is exact
  (power-of-two scales) and to fp32 otherwise; the activation is dequantized here, and torch_npu's
  matmul runs in bf16 when both operands are exact in bf16, else in fp32.
- `bf16_gemm_nt`: torch_npu's matmul.

Functions of plain tensors and the torch_npu module (`npu`); contract checks happen before them.
`npu_quant_matmul` has no [M, N] accumulator input, so C is added after the call, in fp32.
"""

from __future__ import annotations

from typing import Any

import torch

#: npu_quant_matmul group_sizes [group_m, group_n, group_k] of the two FP8 block modes (aclnnQuantMatmulV5)
MX_GROUP_SIZES = [1, 1, 32]
GB_GROUP_SIZES = [1, 128, 128]


def _finish(out: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
    d.copy_(out if c is None else out.float() + c.float())


def _out_dtype(d: torch.Tensor, c: torch.Tensor | None) -> torch.dtype:
    """With an accumulator the product stays fp32 until C is added (one rounding into d)."""
    return torch.float32 if c is not None else d.dtype


def mx_fp8_gemm_nt(npu: Any, a: torch.Tensor, sfa_pairs: torch.Tensor, b: torch.Tensor, sfb_pairs: torch.Tensor,
                   d: torch.Tensor, c: torch.Tensor | None) -> None:
    """a e4m3 [M, K], b e4m3 [N, K]; scales UE8M0 K-major pairs [M | N, ceil(K/64), 2] (uint8 or e8m0)."""
    if d.numel() == 0:
        return
    out = npu.npu_quant_matmul(
        a, b.t(), sfb_pairs.view(torch.uint8).transpose(0, 1),
        pertoken_scale=sfa_pairs.view(torch.uint8), scale_dtype=npu.float8_e8m0fnu,
        pertoken_scale_dtype=npu.float8_e8m0fnu, output_dtype=_out_dtype(d, c), group_sizes=MX_GROUP_SIZES)
    _finish(out, d, c)


def gb_fp8_gemm_nt(npu: Any, a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                   d: torch.Tensor, c: torch.Tensor | None) -> None:
    """a e4m3 [M, K] with fp32 sfa [M, ceil(K/128)]; b e4m3 [N, K] with fp32 sfb [ceil(N/128), ceil(K/128)]."""
    if d.numel() == 0:
        return
    out = npu.npu_quant_matmul(a, b.t(), sfb.t(), pertoken_scale=sfa, output_dtype=_out_dtype(d, c),
                               group_sizes=GB_GROUP_SIZES)
    _finish(out, d, c)


def dequantize_rows(data: torch.Tensor, scale: torch.Tensor, gran_k: int) -> torch.Tensor:
    """bf16 values of FP8 data with per-(1, gran_k) fp32 scales [rows, ceil(K/gran_k)]: exact when the
    scales are powers of two (an e4m3 value times 2^e fits bf16's 8-bit significand)."""
    k = data.shape[-1]
    return (data.float() * scale.repeat_interleave(gran_k, dim=-1)[..., :k]).to(torch.bfloat16)


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None) -> None:
    """a bf16 [M, K], b bf16 [N, K] through torch_npu's matmul (aclnnMatmul on an NPU)."""
    if d.numel() == 0:
        return
    if c is None and d.dtype == torch.bfloat16:
        torch.matmul(a, b.t(), out=d)
        return
    _finish(torch.matmul(a.float(), b.float().t()), d, c)


def dequantized_fp8_gemm_nt(a: torch.Tensor, sfa: torch.Tensor, gran_k: int, b_values: torch.Tensor,
                            d: torch.Tensor, c: torch.Tensor | None, a_scales_pow2: bool) -> None:
    """Atlas A2/A3 (no FP8): the weight was dequantized once at ingest (`b_values`: bf16 when that is
    exact, i.e. power-of-two scales, else fp32); the FP8 activation is dequantized here. The product
    runs in bf16 when both operands are exact in bf16, else in fp32 — never on rounded operands."""
    if d.numel() == 0:
        return
    if b_values.dtype == torch.bfloat16 and a_scales_pow2:
        bf16_gemm_nt(dequantize_rows(a, sfa, gran_k), b_values, d, c)
        return
    k = a.shape[-1]
    a32 = a.float() * sfa.repeat_interleave(gran_k, dim=-1)[..., :k]
    _finish(torch.matmul(a32, b_values.float().t()), d, c)
