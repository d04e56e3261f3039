"""Stand-ins for `npu_quant_matmul` (MX and G-B modes) and `npu_dynamic_mx_quant`.

Sources: aclnnQuantMatmulV5 (ops-nn master e5c3fa9: MX / G-B formulas, shape table, "x and xScale
must share their transposition", group sizes [1,1,32] / [1,128,128]); torch_npu
`npu_quant_matmul` (schema and meta function, op-plugin master 517f2e7: `scale` = x2Scale,
`pertoken_scale` = x1Scale, transposition read from strides); aclnnDynamicMxQuant / V3
(scale_alg 0 and 1, max_low_bound, mxscale shape).
"""

from __future__ import annotations

import torch

from ._common import (FLOAT4_E2M1FN_X2, FLOAT8_E8M0FNU, FP8_DTYPES, StandInError, cdiv, contiguous_pairs,
                      e8m0_bytes, e8m0_values, require, transposed_last_two, transposed_pairs)

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MX_GROUP = [1, 1, 32]
GB_GROUP = [1, 128, 128]
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}
_TORCH_NPU_DST = {292: torch.float8_e4m3fn, 291: torch.float8_e5m2}


def _expand_k(values: torch.Tensor, k: int, block: int) -> torch.Tensor:
    """[rows, ceil(k/block)] -> [rows, k] (each value repeated over its block of K)."""
    return values.repeat_interleave(block, dim=-1)[..., :k]


class QuantMatmul:
    """torch_npu.npu_quant_matmul restricted to what the providers use: 2-D FP8 on Ascend 950 in MX
    (`group_sizes=[1, 1, 32]`, e8m0 pair scales) and G-B (`group_sizes=[1, 128, 128]`, fp32) modes."""

    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None,
                 x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None, group_sizes=None,
                 y_scale=None):
        self.owner.record("npu_quant_matmul")
        require(offset is None and y_scale is None and x1_dtype is None,
                "npu_quant_matmul: offset / y_scale / x1_dtype are not part of the FP8 MX and G-B modes")
        require(x2_dtype != FLOAT4_E2M1FN_X2, "stand-in: the FP4 (A8W4) mode is not implemented")
        require(x1.dtype in FP8_DTYPES and x2.dtype in FP8_DTYPES,
                f"npu_quant_matmul: this stand-in covers FLOAT8 x1/x2, got {x1.dtype} / {x2.dtype}")
        require(self.owner.chip == "950",
                "npu_quant_matmul: FLOAT8_E4M3FN / FLOAT8_E5M2 x1, x2 are Ascend 950 only (aclnnQuantMatmulV5: "
                "A2/A3 support INT8/INT4/INT32)")
        require(x1.dim() == 2 and x2.dim() == 2, "stand-in: only 2-D x1 and x2 are implemented")
        require(not transposed_last_two(x1) and x1.is_contiguous(),
                "npu_quant_matmul: x1 must be (m, k) row-major (MX / G-B: transposeX1 false)")
        m, k = x1.shape
        require(x2.shape[0] == k, f"npu_quant_matmul: x2 must be (k, n) with k = {k}, got {tuple(x2.shape)}")
        n = x2.shape[1]
        require(self.owner.get_npu_format(x2) != 29,
                "npu_quant_matmul: FLOAT8 x2 must be ND (aclnnQuantMatmulV5 参数说明, Ascend 950PR/950DT: x2仅支持ND格式)")
        x2_t = transposed_last_two(x2)
        require(x2_t or x2.is_contiguous(), "npu_quant_matmul: x2 must be contiguous (k, n) or a transposed (n, k)")
        # no K / N bound: aclnnQuantMatmulV5's Ascend 950 constraints state none (the 65535 of the torch_npu
        # page belongs to a page listing Atlas A2/A3/推理 only, and this stand-in covers the 950's FP8 modes)
        require(output_dtype in OUT_DTYPES, f"npu_quant_matmul: FP8 output_dtype must be one of {OUT_DTYPES}")
        require(isinstance(group_sizes, (list, tuple)) and len(group_sizes) == 3,
                "npu_quant_matmul: group_sizes must be [group_m, group_n, group_k]")
        if list(group_sizes) == MX_GROUP:
            out = self._mx(x1, x2, scale, pertoken_scale, scale_dtype, pertoken_scale_dtype, x2_t, m, n, k)
        elif list(group_sizes) == GB_GROUP:
            require(bias is None, "npu_quant_matmul: G-B mode supports bias only for INT8 inputs")
            out = self._gb(x1, x2, scale, pertoken_scale, scale_dtype, pertoken_scale_dtype, x2_t, m, n, k)
        else:
            raise StandInError(f"npu_quant_matmul: group_sizes {list(group_sizes)} is neither MX {MX_GROUP} nor "
                               f"G-B {GB_GROUP} (the only FP8 block combinations aclnnQuantMatmulV5 lists)")
        if bias is not None:
            require(bias.dtype == torch.float32 and tuple(bias.shape) == (n,),
                    "npu_quant_matmul: MX bias must be float32 (n,)")
            out = out + bias.double()
        return out.to(output_dtype)

    def _mx(self, x1, x2, scale, pertoken_scale, scale_dtype, pertoken_scale_dtype, x2_t, m, n, k):
        require(scale_dtype == FLOAT8_E8M0FNU and pertoken_scale_dtype == FLOAT8_E8M0FNU,
                "npu_quant_matmul MX: scale_dtype and pertoken_scale_dtype must be torch_npu.float8_e8m0fnu")
        p = cdiv(k, 64)
        s1 = e8m0_bytes("pertoken_scale", pertoken_scale)
        s2 = e8m0_bytes("scale", scale)
        require(tuple(s1.shape) == (m, p, 2) and contiguous_pairs(s1),
                f"npu_quant_matmul MX: x1 not transposed -> x1Scale (m, ceil(k/64), 2) = ({m}, {p}, 2) contiguous, "
                f"got {tuple(s1.shape)} strides {s1.stride()}")
        require(tuple(s2.shape) == (p, n, 2),
                f"npu_quant_matmul MX: x2Scale must be (ceil(k/64), n, 2) = ({p}, {n}, 2), got {tuple(s2.shape)}")
        if p > 1 and n > 1:
            ok = transposed_pairs(s2) if x2_t else contiguous_pairs(s2)
            require(ok, "npu_quant_matmul MX: x2 and x2Scale must share their transposition (x2 transposed -> "
                        f"scale stored (n, ceil(k/64), 2)), got x2 transposed={x2_t}, scale strides {s2.stride()}")
        a = e8m0_values(s1.reshape(m, 2 * p))                     # [m, 2p] per block of 32
        b = e8m0_values(s2.permute(1, 0, 2).reshape(n, 2 * p))    # [n, 2p]
        da = x1.double() * _expand_k(a, k, 32)
        db = x2.double().T * _expand_k(b, k, 32)                  # [n, k]
        return da @ db.T

    def _gb(self, x1, x2, scale, pertoken_scale, scale_dtype, pertoken_scale_dtype, x2_t, m, n, k):
        require(scale_dtype in (None, torch.float32) and pertoken_scale_dtype in (None, torch.float32),
                "npu_quant_matmul G-B: scales are FLOAT32")
        kb, nb = cdiv(k, 128), cdiv(n, 128)
        require(isinstance(pertoken_scale, torch.Tensor) and pertoken_scale.dtype == torch.float32
                and tuple(pertoken_scale.shape) == (m, kb) and pertoken_scale.is_contiguous(),
                f"npu_quant_matmul G-B: x1Scale must be float32 (m, ceil(k/128)) = ({m}, {kb}) contiguous")
        require(isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and tuple(scale.shape) == (kb, nb),
                f"npu_quant_matmul G-B: x2Scale must be float32 (ceil(k/128), ceil(n/128)) = ({kb}, {nb}), "
                f"got {tuple(getattr(scale, 'shape', ()))}")
        if kb > 1 and nb > 1:
            require(transposed_last_two(scale) == x2_t and (x2_t or scale.is_contiguous()),
                    "npu_quant_matmul G-B: x2 and x2Scale must share their transposition")
        a = _expand_k(pertoken_scale.double(), k, 128)                                   # [m, k]
        b = _expand_k(scale.double().T.repeat_interleave(128, dim=0)[:n], k, 128)        # [n, k]
        return (x1.double() * a) @ (x2.double().T * b).T


class DynamicMxQuant:
    """torch_npu.npu_dynamic_mx_quant for FP8 outputs along the last axis (aclnnDynamicMxQuant / V3)."""

    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, input, *, axis=-1, round_mode="rint", dst_type=FLOAT4_E2M1FN_X2, block_size=32, scale_alg=0,
                 dst_type_max=0.0, max_low_bound=0.0):
        self.owner.record("npu_dynamic_mx_quant")
        require(self.owner.chip == "950", "npu_dynamic_mx_quant: Ascend 950 only (aclnnDynamicMxQuant: A2/A3 ×)")
        require(input.dtype in (torch.float16, torch.bfloat16, torch.float32),
                "npu_dynamic_mx_quant: input must be FLOAT16, BFLOAT16 or FLOAT")
        require(axis in (-1, input.dim() - 1), "stand-in: only the last axis is implemented")
        dst = _TORCH_NPU_DST.get(dst_type, dst_type)
        require(dst in FP8_DTYPES, "stand-in: only FP8 destinations are implemented")
        require(round_mode == "rint", "npu_dynamic_mx_quant: FP8 destinations support round_mode 'rint' only")
        require(isinstance(block_size, int) and 0 < block_size <= 1024 and block_size % 32 == 0,
                "npu_dynamic_mx_quant: block_size must be a multiple of 32, > 0 and <= 1024")
        require(input.dtype != torch.float32 or (block_size == 32 and input.shape[axis] >= 32),
                "npu_dynamic_mx_quant: a FLOAT input takes block_size 32 only and a quantized axis of at least 32 "
                "(aclnnDynamicMxQuantV3 约束说明)")
        require(scale_alg in (0, 1), "npu_dynamic_mx_quant: scale_alg must be 0 or 1 for FP8")
        require(dst_type_max == 0.0, "stand-in: dst_type_max is not implemented")
        require(max_low_bound >= 0.0 and (max_low_bound == 0.0 or scale_alg == 1),
                "npu_dynamic_mx_quant: max_low_bound must be >= 0 and needs scale_alg=1")
        *lead, k = input.shape
        nb = cdiv(k, block_size)
        x = torch.nn.functional.pad(input.float(), (0, nb * block_size - k))  # missing values count as 0
        blocks = x.view(*lead, nb, block_size)
        amax = blocks.abs().amax(-1)
        if scale_alg == 1:
            codes = _alg1_codes(amax.clamp_min(max_low_bound) if max_low_bound else amax, FP8_MAX[dst])
        else:
            exp = torch.floor(torch.log2(amax)) - EMAX[dst]
            codes = (exp.clamp(-127, 127) + 127).to(torch.uint8)
        scale = e8m0_values(codes).float()
        y = (blocks * (1.0 / scale)[..., None]).view(*lead, nb * block_size)[..., :k].to(dst)
        pairs = cdiv(nb, 2)
        out_scale = torch.zeros(*lead, 2 * pairs, dtype=torch.uint8)
        out_scale[..., :nb] = codes
        return y, out_scale.view(*lead, pairs, 2)


class DynamicMxQuantWithoutLowBound(DynamicMxQuant):
    """The signature of torch_npu 26.1.0 and older: no `max_low_bound`."""

    def __call__(self, input, *, axis=-1, round_mode="rint", dst_type=FLOAT4_E2M1FN_X2, block_size=32, scale_alg=0,
                 dst_type_max=0.0):
        return super().__call__(input, axis=axis, round_mode=round_mode, dst_type=dst_type, block_size=block_size,
                                scale_alg=scale_alg, dst_type_max=dst_type_max)


def _alg1_codes(amax: torch.Tensor, dst_max: float) -> torch.Tensor:
    """scale_alg 1: S = amax / Amax(DType); its biased exponent, plus one when the mantissa is non-zero
    (normal S, E < 254) or > 0.5 (subnormal S) — aclnnDynamicMxQuant "场景2"."""
    s = amax.float() / dst_max
    bits = s.view(torch.int32)
    e = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    up = torch.where(e > 0, (mant > 0) & (e < 254), mant > (1 << 22))
    return (e + up.to(torch.int32)).to(torch.uint8)
