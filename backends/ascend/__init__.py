"""ascend backend: Huawei Ascend NPUs — Atlas A2 (910B), Atlas A3 (910_93) and Ascend 950.

Options: `soc` ("910b", "910c", "950"; detected from torch_npu on a device, 950 in emulation by
default) and `scales` ("ue8m0": power-of-two scales, the default; "fp32": arbitrary fp32 block
scales). Where quantized operands are stored (docs/ascend.md, *Byte formats at ingest*):

- Ascend 950, scales="ue8m0": `ASCEND_MX_KMAJOR` (UE8M0 per (1, 32), K-major pairs) for every
  operand — CANN's MX quant matmul form for K-major data;
  scales="fp32": `PLAIN` (DeepGEMM's fp32 scales), read by npu_quant_matmul's G-B mode as is.
- Atlas A2/A3 (no FP8): weights dequantized once at ingest, `ASCEND_BF16_VALUES` (exact for
  power-of-two scales) or with scales="fp32" `ASCEND_FP32_VALUES`; activations `PLAIN`. The bf16
  weights of `fp8_gemm_nt` and of the M-grouped FP8 GEMMs are `ASCEND_BF16_VALUES_NZ`: cast to
  FRACTAL_NZ once at ingest on an NPU (`place_encoded`), since the matmuls they reach take NZ bf16
  weights (NZ_AT_INGEST below); ND bytes in emulation.
- The FP8 KV cache (`kv_cache_format`): Ascend 950 `ASCEND_FP8_KV` (CANN's 656-byte [nope | rope |
  scales]); A2/A3 `ASCEND_BF16_KV` (the rows' exact bf16 values, dequantized once: their KV-quant op
  takes int8 nope values, which cannot carry e4m3; their bf16 MLA ops read the values as they are).

Providers: "torch_npu..." (torch_npu_providers.py) call the CANN operators torch_npu documents, per
chip; they need torch_npu and NPU tensors (tests hand them a stand-in instead). The
"layout-reference" oracle decodes the backend's Formats and runs the contract math for every op —
a correctness tool, not a performance path, and what runs in emulation without torch_npu.
Nothing here has run on a real NPU.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from portable_kernels.layouts import (ASCEND_BF16_VALUES, ASCEND_BF16_VALUES_NZ, ASCEND_FP8_KV, ASCEND_FP32_VALUES,
                                      ASCEND_MOE_ALIGNMENT, ASCEND_BF16_KV, ASCEND_MX_KMAJOR, NPU_FORMAT_FRACTAL_NZ,
                                      NZ_FORMATS, PLAIN, KVCacheFormat)

from portable_kernels.core.contract import QuantArg
from portable_kernels.core.formats import Format
from portable_kernels.core.oracle import register_oracles
from portable_kernels.core.registry import Backend, Registry

from . import chips
from .vendor import runtime
from . import providers
from .providers import torch_npu as torch_npu_providers

NAME = "ascend"
SCALES = ("ue8m0", "fp32")
#: FP4 weights on Atlas A2/A3 stay in the logical form (the dequantized Formats hold e4m3 data only)
FP4_ARGS = {("fp8_fp4_gemm_nt", "b")}


#: weights stored FRACTAL_NZ at ingest on an NPU, per chip and op (docs/ascend.md, *FRACTAL_NZ at ingest*):
#: - Atlas A2/A3 `fp8_gemm_nt` b (bf16 values): torch_npu's matmul runs aclnnMatmulWeightNz for a 2-D ND x
#:   2-D NZ pair (op-plugin MatmulKernelNpuOpApi.cpp matmul_implement_npu, OpUtils.cpp is_nd_nz_format);
#:   aclnnMatmulWeightNz.md 产品支持情况 A2/A3 √, mat2 BFLOAT16 NZ, "B矩阵转置时 (k1, n1, n0, k0)".
#: - Atlas A2/A3 M-grouped FP8 GEMMs b (bf16 values): npu_grouped_matmul runs aclnnGroupedMatmulWeightNz for an
#:   NZ weight (op-plugin GroupedMatmulKernelNpuOpApi.cpp, is_weight_nz); aclnnGroupedMatmulWeightNz.md
#:   约束说明 › A2/A3: 非量化 x BFLOAT16 / weight BFLOAT16 / out BFLOAT16, groupType 0 单单单 "支持weight转置".
#: Not NZ: the 950's npu_quant_matmul (aclnnQuantMatmulV5.md 参数说明, Ascend 950: "x2仅支持ND格式") and its MX
#: grouped matmul (aclnnGroupedMatmulWeightNz.md, 950: weight FLOAT16 / BFLOAT16 / FLOAT4_E2M1 / INT4 only, no
#: FP8); fp32 values (ASCEND_FP32_VALUES: the A2/A3 page allows FLOAT32 NZ, but vLLM-Ascend's maybe_trans_nz
#: never casts FP32 and no NPU run here settles it).
NZ_AT_INGEST = {("fp8_gemm_nt", "b"), ("m_grouped_fp8_gemm_nt_contiguous", "b"), ("m_grouped_fp8_gemm_nt_masked", "b")}


def format_for_chip(chip: str, scales: str, op: str, arg: QuantArg) -> Format:
    """The Format of one quantized argument on one chip (see the module docstring)."""
    if chips.has_fp8(chip):
        return ASCEND_MX_KMAJOR if scales == "ue8m0" else PLAIN
    if arg.role == "rhs" and (op, arg.name) not in FP4_ARGS:
        if scales != "ue8m0":
            return ASCEND_FP32_VALUES
        return ASCEND_BF16_VALUES_NZ if (op, arg.name) in NZ_AT_INGEST else ASCEND_BF16_VALUES
    return PLAIN


class AscendBackend(Backend):
    name = NAME
    device_types = ("npu",)
    emulation = True
    moe_alignment = ASCEND_MOE_ALIGNMENT
    options = {"soc": chips.CHIPS, "scales": SCALES}
    not_mapped = torch_npu_providers.NOT_MAPPED

    def unavailable_reason(self) -> str | None:
        return runtime.unavailable_reason()

    def variants(self) -> list[dict[str, Any]]:
        return [{"soc": "950"}, {"soc": "910b"}]

    def default_options(self, device: torch.device) -> dict[str, Any]:
        chip = runtime.detected_chip() if device.type == "npu" else None
        return {"soc": chip} if chip else {}

    def format_for(self, op: str, arg: QuantArg, options: Mapping[str, Any]) -> Format:
        chip = options.get("soc") or runtime.detected_chip() or chips.DEFAULT_CHIP
        return format_for_chip(chip, options.get("scales", "ue8m0"), op, arg)

    def formats(self) -> tuple[Format, ...]:
        return (ASCEND_MX_KMAJOR, PLAIN, ASCEND_BF16_VALUES, ASCEND_BF16_VALUES_NZ, ASCEND_FP32_VALUES)

    def place_encoded(self, fmt: Format, data: torch.Tensor) -> torch.Tensor:
        """An NZ Format's data cast to FRACTAL_NZ once, here at ingest, on an NPU (or the test stand-in,
        which stands for one): torch_npu.npu_format_cast(x, 29) keeps the logical shape, so providers
        pass the tensor on as they would an ND one. CPU tensors in emulation keep the ND bytes; the
        Format's name records the cast."""
        if fmt.name not in NZ_FORMATS or (data.device.type != "npu" and not runtime.using_stand_in()):
            return data
        npu = runtime.torch_npu()
        if npu is None:  # an npu tensor without torch_npu cannot exist; keep the bytes rather than fail
            return data
        return npu.npu_format_cast(data.contiguous(), NPU_FORMAT_FRACTAL_NZ)

    def kv_cache_format(self, options: Mapping[str, Any]) -> KVCacheFormat:
        """950: CANN's 656-byte row order (npu_kv_quant_sparse_flash_attention reads it as is); A2/A3:
        the rows' exact bf16 values (ASCEND_BF16_KV), which their bf16 MLA ops read as they are — their
        KV-quant op takes int8 nope values only (torch_npu-npu_kv_quant_sparse_flash_attention.md 约束说明),
        and int8 cannot carry e4m3 tiles, so that op is not used."""
        chip = options.get("soc") or runtime.detected_chip() or chips.DEFAULT_CHIP
        return ASCEND_FP8_KV if chips.has_fp8(chip) else ASCEND_BF16_KV


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: ascend`."""
    backend = AscendBackend()
    registry.add_backend(backend)
    _register_fake_storage()
    registry.register_modules(providers, NAME)
    register_oracles(registry, backend)


def _register_fake_storage() -> None:
    """torch.compile's fake storage for ASCEND_BF16_VALUES_NZ: its parent's tensors (bf16 values of the
    logical shape, fp32 block scales), since the NZ cast keeps the logical shape."""
    from portable_kernels.torch_ops.fake_storage import register_fake_storage

    def build(data: torch.Tensor, shape: tuple, granularity: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        *lead, mn, k = shape
        scale = torch.empty((*lead, -(-mn // granularity[0]), -(-k // granularity[1])), dtype=torch.float32,
                            device=data.device)
        return torch.empty(data.shape, dtype=torch.bfloat16, device=data.device), scale

    register_fake_storage(ASCEND_BF16_VALUES_NZ, build)
