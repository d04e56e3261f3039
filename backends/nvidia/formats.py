"""The byte formats the nvidia backend wants for quantized operands, per GPU architecture.

- sm90 (Hopper: H100, H200): fp32 scales; per-row scales MN-major and TMA-aligned (DeepGEMM's
  SFA), 128x128 weight-block scales as is (SFB, K-major). Any fp32 scale is accepted.
- sm100 (Blackwell): every scale per row (128x128 weight scales broadcast along N first), UE8M0
  exponents packed four K-blocks per int32, MN-major, TMA-aligned. Power-of-two scales only.
Data bytes (fp8 e4m3, or packed e2m1) are K-major and unchanged on both.
"""

from __future__ import annotations

from portable_kernels.layout import Layout
from portable_kernels.layouts import (sm90_sfa_decode, sm90_sfa_encode, sm90_sfb_decode, sm90_sfb_encode,
                                      sm100_ue8m0_decode, sm100_ue8m0_encode_from_blocks)
from portable_kernels.tensors import PreparedTensor, QuantTensor, cdiv

SM90 = "sm90"
SM100 = "sm100"
ARCHS = (SM90, SM100)
SM90_FORMAT = "sm90-fp32-mn-major-tma"
SM100_FORMAT = "sm100-ue8m0-int32-mn-major-tma"


def _sm90_encode(qt: QuantTensor):
    per_row = qt.granularity[0] == 1
    scale = sm90_sfa_encode(qt.scale) if per_row else sm90_sfb_encode(qt.scale)
    return qt.data.contiguous(), scale, qt.granularity


def _sm90_decode(p: PreparedTensor) -> QuantTensor:
    gran = p.storage_granularity
    scale = sm90_sfa_decode(p.scale) if gran[0] == 1 else sm90_sfb_decode(p.scale)
    return QuantTensor(p.data, scale, gran, p.ue8m0, p.element)


def _sm100_encode(qt: QuantTensor):
    gm, gk = qt.granularity  # block scales are replicated to one per row while packing (exact)
    return qt.data.contiguous(), sm100_ue8m0_encode_from_blocks(qt.scale, qt.shape[-2], gm), (1, gk)


def _sm100_decode(p: PreparedTensor) -> QuantTensor:
    gran = p.storage_granularity
    scale = sm100_ue8m0_decode(p.scale, cdiv(p.shape[-1], gran[1]))
    return QuantTensor(p.data, scale, gran, True, p.element)


LAYOUTS = {
    SM90: Layout(SM90_FORMAT, _sm90_encode, _sm90_decode, params=(("arch", SM90),)),
    SM100: Layout(SM100_FORMAT, _sm100_encode, _sm100_decode, requires_ue8m0=True, params=(("arch", SM100),)),
}
BY_FORMAT = {layout.format: layout for layout in LAYOUTS.values()}
