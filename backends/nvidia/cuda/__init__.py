"""CUDA C++ kernels of the nvidia backend, built and loaded through deepjit (the library's one
JIT context, `portable_kernels.core.native.build.JIT`, so their cubins share the build cache with the
cpu backend's C++ kernels and the shared host layout encoders).

`layout_encoders.cu` holds the GPU encoders of the sm90 and sm100 scale formats that
prepare_inputs runs at ingest. `build(arch)` compiles the cubin for sm_90a or sm_100a (works
without a GPU: CI builds both); `sm90_sfa_encode` / `sm100_pack` validate their arguments in
Python, then launch through deepjit's CUDA driver loader on cuda tensors. `register_encoders()`
(called by the backend's register) makes prepare_inputs use them for SM90/SM100 operands on cuda
tensors; if they cannot load there, the torch encoders run. They have been compiled here but
never run: no GPU was available to this work (see docs/device-checks.md).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import torch

import deepjit
from portable_kernels.layouts import SM90, SM100, LayoutConversionError, tma_aligned_mn
from portable_kernels.layouts.format import Encoded
from portable_kernels.core.native import build as native_build
from portable_kernels.core.native.layout_encoders import register_device_encoder

log = logging.getLogger(__name__)
_USABLE: dict[tuple[str, int | None], bool] = {}

SOURCE_FILE = Path(__file__).with_name("layout_encoders.cu")
MODULE = "pk_nvidia_layout_encoders"
#: CUDA architectures built: Hopper and Blackwell
ARCHS = {"sm90": "sm_90a", "sm100": "sm_100a"}
THREADS = 256


def jit() -> deepjit.JitContext:
    """The library's one deepjit context (portable_kernels/core/native/build.py), looked up at each use."""
    return native_build.JIT


def source() -> str:
    return SOURCE_FILE.read_text()


def build(arch: str) -> deepjit.Artifact:
    """Compile (or reuse) the encoders' cubin for "sm90" or "sm100"; needs nvcc, no GPU."""
    return jit().build(MODULE, source(), toolchain="cuda", arch=ARCHS[arch], flags=["-O3"])


def _arch_of(device: torch.device) -> str:
    major, _ = torch.cuda.get_device_capability(device)
    if major not in (9, 10):
        raise deepjit.DeviceUnavailableError(f"the layout encoders are built for sm_90a / sm_100a, not {major}.x")
    return "sm90" if major == 9 else "sm100"


def _module(device: torch.device):
    return jit().compile(MODULE, source(), toolchain="cuda", arch=ARCHS[_arch_of(device)], flags=["-O3"])


def _grid(total: int) -> tuple[int]:
    return (max(1, min(-(-total // THREADS), 65535)),)


def _as_groups(sf: torch.Tensor, what: str) -> tuple[torch.Tensor, bool]:
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or sf.dim() not in (2, 3):
        raise LayoutConversionError(f"{what}: expected fp32 [(G,) rows, K-blocks] scales, got {sf!r:.80}")
    if sf.device.type != "cuda":
        raise LayoutConversionError(f"{what}: the CUDA encoders take cuda tensors, got {sf.device}")
    return (sf if sf.dim() == 3 else sf.unsqueeze(0)), sf.dim() == 3


def _usable(device: torch.device) -> bool:
    """Whether the encoders can run on this cuda device here (built and loaded once; a failure is
    logged once and prepare_inputs keeps the torch encoders)."""
    key = (device.type, device.index)
    if key not in _USABLE:
        try:
            _module(device)
            _USABLE[key] = True
        except Exception as exc:  # no driver, no nvcc, an unsupported arch: the torch encoders run
            log.warning("CUDA layout encoders unavailable on %s (%s); prepare_inputs uses the torch encoders",
                        device, exc)
            _USABLE[key] = False
    return _USABLE[key]


def encode_sm90(operand: Any) -> Encoded | None:
    """SM90 operand bytes for prepare_inputs: per-row scales through the CUDA encoder (block scales,
    SFB, are stored as is: the torch copy is already one pass)."""
    if operand.granularity[0] != 1 or not _usable(operand.data.device):
        return None
    return Encoded(operand.data.contiguous(), sm90_sfa_encode(operand.scale), tuple(operand.granularity))


def encode_sm100(operand: Any) -> Encoded | None:
    """SM100 operand bytes for prepare_inputs (power-of-two check, packing and row broadcast in one pass)."""
    if not _usable(operand.data.device):
        return None
    gm, gk = operand.granularity
    return Encoded(operand.data.contiguous(), sm100_pack(operand.scale, operand.shape[-2], gm), (1, gk))


def register_encoders() -> None:
    """Make prepare_inputs use these encoders for SM90/SM100 operands on cuda tensors."""
    register_device_encoder("cuda", SM90.name, encode_sm90)
    register_device_encoder("cuda", SM100.name, encode_sm100)


def sm90_sfa_encode(sf: torch.Tensor) -> torch.Tensor:
    """layouts.sm90_sfa_encode on the GPU: fp32 [(G,) MN, KB] -> the same values, MN-major TMA-aligned."""
    s, grouped = _as_groups(sf, "sm90_sfa_encode")
    g, mn, kb = s.shape
    tma = tma_aligned_mn(mn)
    storage = torch.empty(g, kb, tma, dtype=torch.float32, device=s.device)
    if storage.numel():
        _module(s.device).pk_sm90_sfa_encode.launch(
            _grid(storage.numel()), (THREADS,),
            [s, storage, ctypes.c_int(g), ctypes.c_int(mn), ctypes.c_int(kb), ctypes.c_int(tma),
             ctypes.c_longlong(s.stride(0)), ctypes.c_longlong(s.stride(1)), ctypes.c_longlong(s.stride(2))],
            stream=torch.cuda.current_stream(s.device))
    out = storage[:, :, :mn].transpose(1, 2)
    return out if grouped else out[0]


def sm100_pack(sf: torch.Tensor, mn: int, block_mn: int = 1) -> torch.Tensor:
    """layouts.sm100_ue8m0_encode_from_blocks on the GPU (block_mn = 1: per-row scales).

    Reads one flag back from the device (a sync: this runs at ingest) and raises
    LayoutConversionError if any scale is not a power of two.
    """
    s, grouped = _as_groups(sf, "sm100_pack")
    g, rows, kb = s.shape
    if isinstance(block_mn, bool) or not isinstance(block_mn, int) or block_mn < 1 or rows != -(-mn // block_mn):
        raise LayoutConversionError(f"sm100_pack: {rows} block rows do not cover mn={mn} with block_mn={block_mn}")
    words, tma = -(-kb // 4), tma_aligned_mn(mn)
    storage = torch.empty(g, words, tma, dtype=torch.int32, device=s.device)
    bad = torch.zeros(1, dtype=torch.int32, device=s.device)
    if storage.numel():
        _module(s.device).pk_sm100_pack.launch(
            _grid(storage.numel()), (THREADS,),
            [s, storage, bad, ctypes.c_int(g), ctypes.c_int(mn), ctypes.c_int(kb), ctypes.c_int(words),
             ctypes.c_int(tma), ctypes.c_int(block_mn), ctypes.c_longlong(s.stride(0)),
             ctypes.c_longlong(s.stride(1)), ctypes.c_longlong(s.stride(2))],
            stream=torch.cuda.current_stream(s.device))
        if int(bad.item()):
            raise LayoutConversionError("cannot store fp32 scales as UE8M0 exponents: scales are not powers of two; "
                                        "quantize with use_ue8m0=True first")
    out = storage[:, :, :mn].transpose(1, 2)
    return out if grouped else out[0]
