"""Custom ops of the grouped GEMMs: the MoE M-grouped GEMMs (contiguous and masked; FP8, FP8 x FP4
and bf16) and the K-grouped GEMMs of the weight gradients.

Each writes `d` in place (`Tensor(d!) d`) and returns nothing; padding rows are zeroed or keep what
`d` held (ensure_zero_padding), as in eager mode. Quantized operands cross as
`boundary.OPERAND_FIELDS`; the K-grouped FP8 operands are plain `(data, scale)` tensor pairs.
Schema, route and implementation come from each public function's signature (`declare.custom_op`).
"""

from __future__ import annotations

from ..ops.gemm import grouped, grouped_fp4, k_grouped
from .declare import custom_op

# ensure_zero_padding was appended to these two published schemas, with its default
custom_op(grouped.m_grouped_fp8_gemm_nt_contiguous, writes=("d",), tail=("ensure_zero_padding",))
custom_op(grouped.m_grouped_bf16_gemm_nt_contiguous, writes=("d",), tail=("ensure_zero_padding",))
custom_op(grouped.m_grouped_fp8_gemm_nt_masked, writes=("d",))
custom_op(grouped.m_grouped_bf16_gemm_nt_masked, writes=("d",))
custom_op(grouped_fp4.m_grouped_fp8_fp4_gemm_nt_contiguous, writes=("d",))
custom_op(grouped_fp4.m_grouped_fp8_fp4_gemm_nt_masked, writes=("d",))
custom_op(k_grouped.k_grouped_fp8_gemm_tn_contiguous, writes=("d",), pairs=("a", "b"))
# its ks_cpu is required in eager mode; the schema keeps the optional int[]? both layouts share
custom_op(k_grouped.k_grouped_fp8_gemm_nt_contiguous, writes=("d",), pairs=("a", "b"), types={"ks_cpu": "int[]?"})
custom_op(k_grouped.k_grouped_bf16_gemm_tn_contiguous, writes=("d",))
