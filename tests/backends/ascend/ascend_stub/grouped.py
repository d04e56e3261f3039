"""Stand-in for `npu_grouped_matmul`, the single-x / single-3-D-weight / single-y form (group_type 0).

Sources: torch_npu `npu_grouped_matmul` (master 517f2e7 / 26.1.0 docs: group_list rules,
group_list_type 0 = cumsum / 1 = counts, split_item 2|3 for a single y, x not transposed, bf16 x bf16
-> bf16 and fp32 x fp32 -> fp32 on A2/A3) and aclnnGroupedMatmulV5 (ops-transformer e033f88, 约束说明),
which the torch_npu call runs:
- Atlas A2/A3: at most 1024 groups, last dims (x's K, the weight's last dim) < InnerLimit 65536;
- Ascend 950 (no torch_npu page): no group-count or inner-dim bound stated; MX (FP8 x and weight,
  e8m0 `per_token_scale` (M, ceil(K/64), 2) and `scale` (g, N, ceil(K/64), 2) for a transposed weight)
  with BFLOAT16 / FLOAT16 / FLOAT32 out;
- group_list_type 0: non-negative, non-decreasing; the last value <= M ("末值 ≤ x 第一维"; the torch_npu
  page asks for = M): rows past it are "not updated" (未指定部分不参与更新), returned NaN here.
"""

from __future__ import annotations

import torch

from ._common import (FLOAT8_E8M0FNU, FP8_DTYPES, cdiv, contiguous_pairs, e8m0_bytes, e8m0_values, require,
                      transposed_last_two, transposed_pairs)

MAX_GROUPS_A2A3 = 1024
INNER_LIMIT_A2A3 = 65536


#: torch_npu's ACL_FORMAT_FRACTAL_NZ
FRACTAL_NZ = 29


class GroupedMatmul:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                 per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                 activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                 tuning_config=None, output_dtype=None, x_dtype=None, weight_dtype=None, scale_dtype=None,
                 per_token_scale_dtype=None):
        self.owner.record("npu_grouped_matmul")
        require(isinstance(x, list) and isinstance(weight, list), "npu_grouped_matmul: x and weight are lists")
        require(len(x) == 1 and len(weight) == 1, "stand-in: only the single-single-single form is implemented")
        require(bias is None and offset is None and antiquant_scale is None and antiquant_offset is None
                and activation_input is None and act_type == 0 and x_dtype is None and weight_dtype is None,
                "stand-in: bias, offsets, antiquant, activation and x_dtype/weight_dtype are not implemented")
        require(split_item in (2, 3), "npu_grouped_matmul: a single output tensor needs split_item 2 or 3")
        require(group_type == 0, "npu_grouped_matmul: single-single-single needs group_type 0 (m-axis grouping)")
        a, w = x[0], weight[0]
        require(a.dim() == 2 and w.dim() == 3, "npu_grouped_matmul: single-single-single needs x 2-D, weight 3-D")
        require(not transposed_last_two(a) and a.is_contiguous(),
                "npu_grouped_matmul: x does not support transposition")
        m, k = a.shape
        g, kw, n = w.shape
        require(kw == k, f"npu_grouped_matmul: weight must be [g, k, n] with k = {k}, got {tuple(w.shape)}")
        w_t = transposed_last_two(w)
        require(w_t or w.is_contiguous(), "npu_grouped_matmul: weight must be contiguous or a transposed view")
        if self.owner.chip == "a2a3":
            require(k < INNER_LIMIT_A2A3 and (k if w_t else n) < INNER_LIMIT_A2A3,
                    f"npu_grouped_matmul: Atlas A2/A3 last dimensions must be < InnerLimit {INNER_LIMIT_A2A3}")
        counts = self._counts(group_list, group_list_type, g, m)
        if self.owner.get_npu_format(w) == FRACTAL_NZ:
            self._check_nz_weight(a, w)
        if a.dtype in (torch.bfloat16, torch.float32):
            require(w.dtype == a.dtype and scale is None and per_token_scale is None,
                    "npu_grouped_matmul: the non-quantized form takes a weight of x's dtype and no scales")
            require(output_dtype in (None, a.dtype), "npu_grouped_matmul: non-quantized output has x's dtype "
                                                     "(float32 only for a single x / weight / y)")
            if self.owner.chip == "950":
                self.owner.record("npu_grouped_matmul[bf16 on 950: aclnnGroupedMatmulV5, no torch_npu page]")
            da, dw = a.double(), w.double()
        else:
            require(a.dtype in FP8_DTYPES and w.dtype in FP8_DTYPES, f"npu_grouped_matmul: unsupported x {a.dtype}")
            require(self.owner.chip == "950", "npu_grouped_matmul: FP8 inputs need Ascend 950")
            da, dw = self._mx_dequantized(a, w, scale, per_token_scale, scale_dtype, per_token_scale_dtype, w_t)
            require(output_dtype in (torch.bfloat16, torch.float16, torch.float32),
                    "npu_grouped_matmul MX: output bf16, fp16 or fp32 (aclnnGroupedMatmulV5, 950 动态量化（MX）)")
        out = torch.full((m, n), float("nan"), dtype=torch.float64)  # rows past the last group: not updated
        start = 0
        for group, count in enumerate(counts.tolist()):
            out[start:start + count] = da[start:start + count] @ dw[group]
            start += count
        return [out.to(output_dtype or a.dtype)]

    def _check_nz_weight(self, a, w) -> None:
        """A FRACTAL_NZ weight routes to aclnnGroupedMatmulWeightNz (op-plugin GroupedMatmulKernelNpuOpApi.cpp);
        its 约束说明: A2/A3 非量化 x / weight FLOAT16 or BFLOAT16 (the int8 / int4 quantized forms are not
        modelled here); Ascend 950 weight FLOAT16 / BFLOAT16 / FLOAT4_E2M1 / INT4 only (no FP8, no FLOAT32)."""
        self.owner.record("npu_grouped_matmul[weight FRACTAL_NZ: aclnnGroupedMatmulWeightNz]")
        require(w.dtype in (torch.bfloat16, torch.float16) and a.dtype == w.dtype,
                f"npu_grouped_matmul: a FRACTAL_NZ weight takes FLOAT16 / BFLOAT16 x and weight here "
                f"(aclnnGroupedMatmulWeightNz 约束说明; {'Ascend 950: no FP8 / FLOAT32 weight' if self.owner.chip == '950' else 'A2/A3 非量化'}), "
                f"got x {a.dtype}, weight {w.dtype}")

    def _counts(self, group_list, group_list_type, g, m) -> torch.Tensor:
        require(isinstance(group_list, torch.Tensor) and group_list.dtype == torch.int64 and group_list.dim() == 1,
                "npu_grouped_matmul: group_list must be a 1-D int64 tensor")
        require(group_list.shape[0] == g, "npu_grouped_matmul: group_list length must equal the weight's group count")
        if self.owner.chip == "a2a3":
            require(g <= MAX_GROUPS_A2A3, f"npu_grouped_matmul: Atlas A2/A3 take at most {MAX_GROUPS_A2A3} groups")
        require(group_list_type in (0, 1), "npu_grouped_matmul: group_list_type 0 (cumsum) or 1 (counts)")
        gl = group_list.long()
        if group_list_type == 0:
            require(bool((gl >= 0).all()) and bool((gl[1:] >= gl[:-1]).all()),
                    "npu_grouped_matmul: group_list_type 0 needs a non-negative non-decreasing cumsum")
            require(g == 0 or int(gl[-1]) <= m, "npu_grouped_matmul: the last cumsum value must be <= x's rows")
            return torch.diff(gl, prepend=gl.new_zeros(1))
        require(g > 1 and bool((gl >= 0).all()), "npu_grouped_matmul: group_list_type 1 needs non-negative counts, "
                "length not 1")
        require(int(gl.sum()) <= m, "npu_grouped_matmul: the counts must sum to <= x's rows")
        return gl

    def _mx_dequantized(self, a, w, scale, per_token_scale, scale_dtype, per_token_scale_dtype, w_t):
        require(scale_dtype == FLOAT8_E8M0FNU and per_token_scale_dtype == FLOAT8_E8M0FNU,
                "npu_grouped_matmul MX: scale_dtype and per_token_scale_dtype are torch_npu.float8_e8m0fnu")
        require(isinstance(scale, list) and isinstance(per_token_scale, list)
                and len(scale) == len(per_token_scale) == 1,
                "npu_grouped_matmul MX: scale and per_token_scale are one-element lists")
        m, k = a.shape
        g, _, n = w.shape
        p = cdiv(k, 64)
        s1, s2 = e8m0_bytes("per_token_scale", per_token_scale[0]), e8m0_bytes("scale", scale[0])
        require(tuple(s1.shape) == (m, p, 2) and contiguous_pairs(s1),
                f"npu_grouped_matmul MX: per_token_scale must be (m, ceil(k/64), 2) = ({m}, {p}, 2) contiguous")
        require(tuple(s2.shape) == (g, p, n, 2), f"npu_grouped_matmul MX: scale must be (g, ceil(k/64), n, 2) = "
                f"({g}, {p}, {n}, 2), got {tuple(s2.shape)}")
        if p > 1 and n > 1:
            require(transposed_pairs(s2) if w_t else contiguous_pairs(s2),
                    "npu_grouped_matmul MX: weight and scale must share their transposition")
        sa = e8m0_values(s1.reshape(m, 2 * p)).repeat_interleave(32, -1)[:, :k]
        sb = e8m0_values(s2.permute(0, 2, 1, 3).reshape(g, n, 2 * p)).repeat_interleave(32, -1)[..., :k]
        return a.double() * sa, w.double() * sb.transpose(1, 2)
