"""The byte formats the ascend backend wants for quantized operands (Ascend 950, MX).

- Scales: UE8M0 per (1, 32) along K for every operand (weight-block scales broadcast along N and
  replicated along K first, both exact), two K-blocks per int16 (even block in the low byte),
  MN-major, no padding — the bytes CANN's MX quant matmul takes. Power-of-two scales only.
- Data: ND (row-major, K contiguous) for dense GEMM operands, which DeepGEMM-Ascend keeps ND;
  FRACTAL_NZ tiles for the weights of the grouped (MoE) GEMMs, which the fused MoE path and the
  torch_npu grouped operators prefer.
"""

from __future__ import annotations

from portable_kernels.layout import Layout
from portable_kernels.layouts import MX_BLOCK_K, ascend_mx_decode, ascend_mx_encode_from_blocks, nd_to_nz, nz_to_nd
from portable_kernels.tensors import PreparedTensor, QuantTensor, cdiv

MX_FORMAT = "ascend-mx-ue8m0-int16-mn-major"
MX_NZ_FORMAT = "ascend-mx-ue8m0-int16-mn-major+nz-data"


def _mx_scales(qt: QuantTensor):
    """Scales replicated to one per (row, 32 K) while packing (exact), two exponents per int16."""
    gm, gk = qt.granularity
    *_, mn, k = qt.shape
    return ascend_mx_encode_from_blocks(qt.scale, mn, k, block_mn=gm, block_k=gk), (1, MX_BLOCK_K)


def _mx_scale_decode(p: PreparedTensor):
    gran = p.storage_granularity
    return ascend_mx_decode(p.scale, cdiv(p.shape[-1], gran[1])), gran


def _encode(qt: QuantTensor):
    scale, gran = _mx_scales(qt)
    return qt.data.contiguous(), scale, gran


def _decode(p: PreparedTensor) -> QuantTensor:
    scale, gran = _mx_scale_decode(p)
    return QuantTensor(p.data, scale, gran, True, p.element)


def _encode_nz(qt: QuantTensor):
    scale, gran = _mx_scales(qt)
    return nd_to_nz(qt.data), scale, gran


def _decode_nz(p: PreparedTensor) -> QuantTensor:
    scale, gran = _mx_scale_decode(p)
    stored_cols = p.shape[-1] // 2 if p.element == "e2m1" else p.shape[-1]
    return QuantTensor(nz_to_nd(p.data, p.shape[-2], stored_cols), scale, gran, True, p.element)


MX = Layout(MX_FORMAT, _encode, _decode, requires_ue8m0=True)
MX_NZ = Layout(MX_NZ_FORMAT, _encode_nz, _decode_nz, requires_ue8m0=True)
BY_FORMAT = {MX_FORMAT: MX, MX_NZ_FORMAT: MX_NZ}
