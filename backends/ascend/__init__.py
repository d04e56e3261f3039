"""ascend backend: Huawei Ascend NPUs — Atlas A2 (910B), Atlas A3 (910_93) and Ascend 950.

Options: `soc` ("910b", "910c", "950"; detected from torch_npu on a device, 950 in emulation by
default) and `scales` ("ue8m0": power-of-two scales, the default; "fp32": arbitrary fp32 block
scales). Where quantized operands are stored (docs/ascend.md, *Byte formats at ingest*):

- Ascend 950, scales="ue8m0": `ASCEND_MX_KMAJOR` (UE8M0 per (1, 32), K-major pairs) for every
  operand — CANN's MX quant matmul form for K-major data;
  scales="fp32": `PLAIN` (DeepGEMM's fp32 scales), read by npu_quant_matmul's G-B mode as is.
- Atlas A2/A3 (no FP8): weights dequantized once at ingest, `ASCEND_BF16_VALUES` (exact for
  power-of-two scales) or with scales="fp32" `ASCEND_FP32_VALUES`; activations `PLAIN`.
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
from portable_kernels.layouts import (ASCEND_BF16_VALUES, ASCEND_FP8_KV, ASCEND_FP32_VALUES, ASCEND_MOE_ALIGNMENT,
                                      ASCEND_BF16_KV, ASCEND_MX_KMAJOR, PLAIN, KVCacheFormat)

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


def format_for_chip(chip: str, scales: str, op: str, arg: QuantArg) -> Format:
    """The Format of one quantized argument on one chip (see the module docstring)."""
    if chips.has_fp8(chip):
        return ASCEND_MX_KMAJOR if scales == "ue8m0" else PLAIN
    if arg.role == "rhs" and (op, arg.name) not in FP4_ARGS:
        return ASCEND_BF16_VALUES if scales == "ue8m0" else ASCEND_FP32_VALUES
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
        return (ASCEND_MX_KMAJOR, PLAIN, ASCEND_BF16_VALUES, ASCEND_FP32_VALUES)

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
    registry.register_modules(providers, NAME)
    register_oracles(registry, backend)
