"""Native encoders of the per-chip byte formats (C++ in layout_encoders.cpp), for prepare_inputs.

Each function has the signature of its torch twin in `portable_kernels.layouts` and returns the
same tensor: same dtype, shape, strides and bytes (tests compare both). The torch encoders stay the
definition: any input outside what the native path handles (other dtypes, strided inputs, empty
tensors, scales that are not powers of two — where the torch encoder raises its own error) is
handed to them. `accelerated_encode(fmt, operand)` is what prepare_inputs asks first: the Encoded
value of a Format it has a native encoder for, or None (then `fmt.encode` runs).

They live here, not in a backend, because several backends' Formats use them (nvidia SM90/SM100,
ascend MX/NZ) and no backend imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from ...layouts import fp8_scales as torch_scales
from ...layouts import nz as torch_nz
from ...layouts.constants import ASCEND_BLOCKS_PER_WORD, FP8_BLOCK_K, FP8_BLOCK_MN, MX_BLOCK_K, SM100_BLOCKS_PER_WORD
from ...layouts.format import Encoded
from .build import I32, I64, PTR, NativeLibrary, num_threads, register_library

LIB = register_library(NativeLibrary("layout_encoders", Path(__file__).with_name("layout_encoders.cpp"), {
    "pk_pack_exponents": [PTR, I64, I64, I64, I64, I64, I64, I64, I64, I32, I64, PTR, I32],
    "pk_sm90_sfa": [PTR, I64, I64, I64, I64, PTR, I32],
    "pk_nd_to_nz": [PTR, I64, I64, I64, I64, I64, I64, I64, PTR, I32],
}, returns={"pk_pack_exponents": I64}))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _plain_scales(sf: Any) -> torch.Tensor | None:
    """sf as a contiguous fp32 [G, R, KB] CPU tensor (a view), or None when the native path does not apply."""
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or sf.dim() not in (2, 3) \
            or sf.device.type != "cpu" or not sf.is_contiguous() or sf.numel() == 0:
        return None
    return sf if sf.dim() == 3 else sf.unsqueeze(0)


def _valid_int(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def sm90_sfa_encode(sf: torch.Tensor) -> torch.Tensor:
    """= layouts.sm90_sfa_encode: fp32 [(G,) MN, sf_k] -> MN-major, TMA-aligned (pad zero)."""
    lib = LIB.get()
    s = _plain_scales(sf)
    if lib is None or s is None:
        return torch_scales.sm90_sfa_encode(sf)
    g, mn, kb = s.shape
    tma_mn = torch_scales.tma_aligned_mn(mn)
    out = _mn_major(sf.dim() == 3, g, mn, kb, tma_mn, torch.float32)
    lib.pk_sm90_sfa(s.data_ptr(), g, mn, kb, tma_mn, out.data_ptr(), num_threads())
    return out


def _mn_major(grouped: bool, g: int, mn: int, words: int, mn_stride: int, dtype: torch.dtype) -> torch.Tensor:
    """Uninitialised [(G,) MN, words] with strides ((words * mn_stride,) 1, mn_stride) over a storage of
    G * words * mn_stride elements, pad rows included: what the torch encoders build as
    storage[:, :, :mn].transpose(1, 2)."""
    storage = torch.empty(g * words * mn_stride, dtype=dtype)
    if grouped:
        return storage.as_strided((g, mn, words), (words * mn_stride, 1, mn_stride))
    return storage.as_strided((mn, words), (1, mn_stride))


def _pack(sf: torch.Tensor, mn: int, block_mn: int, ratio: int, kbo: int, per_word: int, kmajor: bool,
          mn_stride: int, out: torch.Tensor, fallback: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    s = _plain_scales(sf)
    lib = LIB.get()
    if lib is None or s is None:
        return None
    g, r, kb = s.shape
    bad = lib.pk_pack_exponents(s.data_ptr(), g, r, kb, mn, block_mn, ratio, kbo, per_word, int(kmajor), mn_stride,
                                out.data_ptr(), num_threads())
    if bad:
        fallback()  # raises the torch encoder's error for scales that are not powers of two
        raise AssertionError("native and torch encoders disagree on which scales are powers of two")
    return out


def sm100_ue8m0_encode_from_blocks(sf: torch.Tensor, mn: int, block_mn: int = FP8_BLOCK_MN) -> torch.Tensor:
    """= layouts.sm100_ue8m0_encode_from_blocks: int32 [(G,) MN, ceil(sf_k/4)], MN-major, TMA-aligned."""
    def fallback():
        return torch_scales.sm100_ue8m0_encode_from_blocks(sf, mn, block_mn)
    s = _plain_scales(sf)
    if s is None or not _valid_int(mn, 1) or not _valid_int(block_mn, 1) or s.shape[1] != _cdiv(mn, block_mn):
        return fallback()
    g, _, kb = s.shape
    words, tma_mn = _cdiv(kb, SM100_BLOCKS_PER_WORD), torch_scales.tma_aligned_mn(mn)
    out = _mn_major(sf.dim() == 3, g, mn, words, tma_mn, torch.int32)
    if _pack(sf, mn, block_mn, 1, kb, SM100_BLOCKS_PER_WORD, False, tma_mn, out, fallback) is None:
        return fallback()
    return out


def _ascend_args(sf, mn, k, block_mn, block_k) -> tuple[int, int] | None:
    s = _plain_scales(sf)
    if s is None or not all(_valid_int(v, 1) for v in (mn, k, block_mn, block_k)) or block_k % MX_BLOCK_K \
            or s.shape[1] != _cdiv(mn, block_mn) or s.shape[2] != _cdiv(k, block_k):
        return None
    return block_k // MX_BLOCK_K, _cdiv(k, MX_BLOCK_K)


def _ascend_pack(sf: torch.Tensor, mn: int, k: int, block_mn: int, block_k: int, kmajor: bool,
                 fallback: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    """The Ascend MX exponent pairs of `sf` packed natively: MN-major int16 words, or with `kmajor`
    uint8 [G, MN, 2 * words] (pairs adjacent); None where the torch encoder must answer."""
    args = _ascend_args(sf, mn, k, block_mn, block_k)
    if args is None:
        return None
    ratio, kbo = args
    g = sf.shape[0] if sf.dim() == 3 else 1
    words = _cdiv(kbo, ASCEND_BLOCKS_PER_WORD)
    if kmajor:
        out = torch.empty((g, mn, words * ASCEND_BLOCKS_PER_WORD), dtype=torch.uint8)
    else:
        out = _mn_major(sf.dim() == 3, g, mn, words, mn, torch.int16)
    return _pack(sf, mn, block_mn, ratio, kbo, ASCEND_BLOCKS_PER_WORD, kmajor, mn, out, fallback)


def ascend_mx_encode_from_blocks(sf: torch.Tensor, mn: int, k: int, block_mn: int = FP8_BLOCK_MN,
                                 block_k: int = FP8_BLOCK_K) -> torch.Tensor:
    """= layouts.ascend_mx_encode_from_blocks: int16 [(G,) MN, ceil(K/64)], MN-major, no padding."""
    def fallback():
        return torch_scales.ascend_mx_encode_from_blocks(sf, mn, k, block_mn, block_k)
    out = _ascend_pack(sf, mn, k, block_mn, block_k, False, fallback)
    return fallback() if out is None else out


def ascend_mx_kmajor_encode_from_blocks(sf: torch.Tensor, mn: int, k: int, block_mn: int = FP8_BLOCK_MN,
                                        block_k: int = FP8_BLOCK_K) -> torch.Tensor:
    """= layouts.ascend_mx_kmajor_encode_from_blocks: float8_e8m0fnu [(G,) MN, ceil(K/64), 2], contiguous."""
    def fallback():
        return torch_scales.ascend_mx_kmajor_encode_from_blocks(sf, mn, k, block_mn, block_k)
    out = _ascend_pack(sf, mn, k, block_mn, block_k, True, fallback)
    if out is None:
        return fallback()
    g, _, width = out.shape
    out = out.view(g, mn, width // ASCEND_BLOCKS_PER_WORD, ASCEND_BLOCKS_PER_WORD).view(torch.float8_e8m0fnu)
    return out if sf.dim() == 3 else out[0]


def nd_to_nz(x: torch.Tensor) -> torch.Tensor:
    """= layouts.nd_to_nz: ND [..., M, N] -> NZ [..., ceil(N/C0), ceil(M/16), 16, C0], contiguous, zero padded."""
    lib = LIB.get()
    if lib is None or not isinstance(x, torch.Tensor) or x.dim() < 2 or x.device.type != "cpu" \
            or x.element_size() not in (1, 2, 4) or not x.is_contiguous() or x.numel() == 0:
        return torch_nz.nd_to_nz(x)
    *lead, m, n = x.shape
    n1, m1, rows, c0 = torch_nz.nz_shape(m, n, x.dtype)
    out = torch.empty((*lead, n1, m1, rows, c0), dtype=x.dtype)
    batches = x.numel() // (m * n)
    row_bytes = n * x.element_size()
    lib.pk_nd_to_nz(x.data_ptr(), batches, m, row_bytes, row_bytes, m * row_bytes, n1, m1, out.data_ptr(),
                    num_threads())
    return out


# -- the Formats' encodes, natively -------------------------------------------------------------------

def _sm90(operand: Any) -> Encoded:
    gran = tuple(operand.granularity)
    scale = sm90_sfa_encode(operand.scale) if gran[0] == 1 else torch_scales.sm90_sfb_encode(operand.scale)
    return Encoded(operand.data.contiguous(), scale, gran)


def _sm100(operand: Any) -> Encoded:
    gm, gk = operand.granularity
    return Encoded(operand.data.contiguous(), sm100_ue8m0_encode_from_blocks(operand.scale, operand.shape[-2], gm),
                   (1, gk))


def _ascend_scales(operand: Any) -> torch.Tensor:
    gm, gk = operand.granularity
    *_, mn, k = operand.shape
    return ascend_mx_encode_from_blocks(operand.scale, mn, k, block_mn=gm, block_k=gk)


def _ascend_mx(operand: Any) -> Encoded:
    return Encoded(operand.data.contiguous(), _ascend_scales(operand), (1, MX_BLOCK_K))


def _ascend_mx_nz(operand: Any) -> Encoded:
    return Encoded(nd_to_nz(operand.data), _ascend_scales(operand), (1, MX_BLOCK_K))


def _ascend_kmajor(operand: Any) -> Encoded:
    gm, gk = operand.granularity
    *_, mn, k = operand.shape
    return Encoded(operand.data.contiguous(),
                   ascend_mx_kmajor_encode_from_blocks(operand.scale, mn, k, block_mn=gm, block_k=gk), (1, MX_BLOCK_K))


#: Format name -> native encode (the same Encoded as the Format's own encode)
ENCODERS: dict[str, Callable[[Any], Encoded]] = {
    "sm90-fp32-mn-major-tma": _sm90,
    "sm100-ue8m0-int32-mn-major-tma": _sm100,
    "ascend-mx-ue8m0-int16-mn-major": _ascend_mx,
    "ascend-mx-ue8m0-int16-mn-major+nz-data": _ascend_mx_nz,
    "ascend-mx-ue8m0-kmajor-pairs": _ascend_kmajor,
}


#: (device type, Format name) -> an encoder for operands on that device, registered by a backend
#: plugin (e.g. the nvidia backend's CUDA C++ encoders); it returns None to hand over to the
#: Format's own encode (an operand it does not handle, or its native code unavailable)
DEVICE_ENCODERS: dict[tuple[str, str], Callable[[Any], Encoded | None]] = {}


def register_device_encoder(device_type: str, format_name: str, encode: Callable[[Any], Encoded | None]) -> None:
    """Let prepare_inputs encode `format_name` operands on `device_type` tensors with `encode` (which
    must return the Format's own bytes, or None). A backend calls this from its register()."""
    DEVICE_ENCODERS[(device_type, format_name)] = encode


def accelerated_encode(fmt: Any, operand: Any) -> Encoded | None:
    """The native Encoded of `operand` in `fmt`, or None (no native encoder for it, native code off):
    then the Format's own encode runs. CPU operands use this package's C++ encoders; operands on
    another device use what a backend registered for it (register_device_encoder)."""
    name = getattr(fmt, "name", "")
    device_type = operand.data.device.type
    if device_type != "cpu":
        encode = DEVICE_ENCODERS.get((device_type, name))
        return None if encode is None else encode(operand)
    encode = ENCODERS.get(name)
    if encode is None or LIB.get() is None:
        return None
    return encode(operand)
