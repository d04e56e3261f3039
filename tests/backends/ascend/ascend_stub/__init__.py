"""A documented-semantics stand-in for the torch_npu calls the ascend providers make (tests only).

`make_stand_in(soc)` returns an object with the attributes of the `torch_npu` module the providers
use (`npu_quant_matmul`, `npu_dynamic_mx_quant`, `npu_grouped_matmul`, the attention and MoE ops,
`npu_quant_lightning_indexer` (indexer.py), `npu_format_cast`, the MC2 pair
`npu_moe_distribute_dispatch_v2` / `combine_v2` over a torch.distributed group (mc2.py), dtype ids,
`npu.get_soc_version()`), each implemented in plain torch on CPU tensors from the documentation's
formulas (docs/ascend.md, *Sources*), raising `StandInError` on every documented constraint it
checks. It proves our calls follow the documented contract; it does not prove what an NPU computes.

It is deliberately NOT a package named `torch_npu`: torch autoloads device backends through the
`torch.backends` entry point, and a fake `torch_npu` on sys.path could be picked up by that (or by
anything else probing for an NPU). Tests hand this object to the backend explicitly through
`portable_kernels.backends.ascend.vendor.runtime.use_stand_in`.
"""

from __future__ import annotations

from types import SimpleNamespace

from ._common import FLOAT4_E2M1FN_X2, FLOAT8_E8M0FNU, HIFLOAT8, SOC_VERSIONS, StandInError, chip_of
from .attention import FusedInferAttention, KvQuantSparseFlashAttention, SparseFlashAttention
from .formats import FormatCast
from .grouped import GroupedMatmul
from .indexer import QuantLightningIndexer
from .mc2 import CombineV2, DispatchV2, register_group
from .moe import MoeGatingTopK
from .quant import DynamicMxQuant, DynamicMxQuantWithoutLowBound, QuantMatmul

__all__ = ["StandIn", "StandInError", "make_stand_in", "register_group", "SOC_VERSIONS"]


class StandIn:
    """The torch_npu surface the providers call, for one chip. `calls` records every op name called."""

    float8_e8m0fnu = FLOAT8_E8M0FNU
    float4_e2m1fn_x2 = FLOAT4_E2M1FN_X2
    hifloat8 = HIFLOAT8

    def __init__(self, soc: str = "950", *, with_max_low_bound: bool = True) -> None:
        if soc not in SOC_VERSIONS:
            raise ValueError(f"soc must be one of {sorted(SOC_VERSIONS)}, got {soc!r}")
        self.soc = soc
        self.chip = chip_of(soc)
        self.calls: list[str] = []
        version = SOC_VERSIONS[soc]
        self.npu = SimpleNamespace(get_soc_version=lambda: version,
                                   get_device_name=lambda device=None: _DEVICE_NAMES[soc],
                                   is_available=lambda: True)
        self.Format = SimpleNamespace(ND=2, FRACTAL_NZ=29)
        self._format = FormatCast(self)
        self.npu_format_cast = self._format.npu_format_cast
        self.get_npu_format = self._format.get_npu_format
        self.npu_quant_matmul = QuantMatmul(self)
        self.npu_dynamic_mx_quant = (DynamicMxQuant if with_max_low_bound else DynamicMxQuantWithoutLowBound)(self)
        self.npu_grouped_matmul = GroupedMatmul(self)
        self.npu_fused_infer_attention_score = FusedInferAttention(self)
        self.npu_sparse_flash_attention = SparseFlashAttention(self)
        self.npu_kv_quant_sparse_flash_attention = KvQuantSparseFlashAttention(self)
        self.npu_moe_gating_top_k = MoeGatingTopK(self)
        self.npu_quant_lightning_indexer = QuantLightningIndexer(self)
        self.npu_moe_distribute_dispatch_v2 = DispatchV2(self)
        self.npu_moe_distribute_combine_v2 = CombineV2(self)

    def record(self, op: str) -> None:
        self.calls.append(op)


_DEVICE_NAMES = {"910b": "Ascend910B3", "910c": "Ascend910_9382", "950": "Ascend950DT"}


def make_stand_in(soc: str = "950", *, with_max_low_bound: bool = True) -> StandIn:
    """A fresh stand-in for one chip ("910b" = Atlas A2, "910c" = Atlas A3, "950" = Ascend 950).

    with_max_low_bound=False models a torch_npu without `npu_dynamic_mx_quant(max_low_bound=)`
    (26.1.0 and older).
    """
    return StandIn(soc, with_max_low_bound=with_max_low_bound)
