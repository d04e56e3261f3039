"""nvidia providers of the grouped GEMMs (m_grouped_{fp8,bf16}_gemm_nt_{contiguous,masked}): Triton
kernels (SM90/SM100 scales in place, only valid rows written), torch._grouped_mm (bf16) and DeepGEMM."""

from __future__ import annotations

from typing import Any

import torch

from portable_kernels.ops.gemm.grouped import (M_GROUPED_BF16_CONTIGUOUS, M_GROUPED_BF16_MASKED, M_GROUPED_FP8_CONTIGUOUS,
                                           M_GROUPED_FP8_MASKED, ContiguousGroupedInputs, MaskedGroupedInputs)
from portable_kernels.core.registry import Registry

from ..kernels._checks import GEMM_BLOCK_K
from ..vendor import deep_gemm, grouped_mm
from ._common import (BACKEND, LIBRARY_PRIORITY, NVIDIA_FORMATS, TORCH_VENDOR_PRIORITY, TRITON, TRITON_PRIORITY, kernel,
                      storage_granularity, triton_devices, triton_reasons)

OUT_DTYPES = (torch.bfloat16, torch.float32)


def _reasons(call: Any) -> list[str]:
    """Granularities only (they are in the call signature): the kernel takes any segment alignment."""
    ga, gb = storage_granularity(call.a), storage_granularity(call.b)
    out = triton_reasons(call)
    if ga is not None and (ga[0] != 1 or ga[1] != gb[1] or ga[1] not in GEMM_BLOCK_K):
        out.append(f"granularities a {ga}, b {gb}: per-token a sharing b's K block in {GEMM_BLOCK_K}")
    return out


def _scales(call: Any) -> dict[str, Any]:
    a, b = call.a, call.b
    if isinstance(a, torch.Tensor):
        return {}
    return {"sfa": a.scale, "sfb": b.scale, "gran_a": a.storage_granularity, "gran_b": b.storage_granularity}


def _data(t: Any) -> torch.Tensor:
    """The operand's bytes; a bf16 view whose K is not contiguous (DeepGEMM's nn form hands over B
    [G, K, N] transposed) is copied, because the kernels read K-contiguous rows."""
    if not isinstance(t, torch.Tensor):
        return t.data
    return t if t.stride(-1) == 1 else t.contiguous()


def _contiguous(call: ContiguousGroupedInputs) -> None:
    kernel("grouped_contiguous").m_grouped_gemm_nt_contiguous(
        _data(call.a), _data(call.b), call.d, call.grouped_layout, use_psum_layout=call.use_psum_layout,
        alignment=call.alignment, **_scales(call))


def _masked(call: MaskedGroupedInputs) -> None:
    kernel("grouped_masked").m_grouped_gemm_nt_masked(_data(call.a), _data(call.b), call.d, call.masked_m,
                                                      call.expected_m, **_scales(call))


# -- vendor ---------------------------------------------------------------------------------------------


def _grouped_mm_reasons(call: Any) -> list[str]:
    return grouped_mm.device_reasons(call.device) + grouped_mm.reasons(call.b.shape[-1], call.b.shape[1],
                                                                        call.d.dtype)


def _grouped_mm_shape(call: Any) -> Any:
    return call.b.shape[-1] % grouped_mm.ALIGN_ELEMENTS == 0, call.b.shape[1] % grouped_mm.ALIGN_ELEMENTS == 0


def _grouped_mm_contiguous(call: ContiguousGroupedInputs) -> None:
    grouped_mm.run(grouped_mm.contiguous_call(call.a, call.b, call.grouped_layout, call.use_psum_layout,
                                              call.alignment), call.d)


def _grouped_mm_masked(call: MaskedGroupedInputs) -> None:
    grouped_mm.run(grouped_mm.masked_call(call.a, call.b, call.masked_m), call.d)


def _deep_gemm_reasons(call: Any) -> list[str]:
    missing = deep_gemm.unavailable_reason()
    return ([missing] if missing else []) + deep_gemm.grouped_reasons(call.d.dtype)


def _deep_gemm_contiguous(call: ContiguousGroupedInputs) -> None:
    deep_gemm.m_grouped_contiguous(_data(call.a), _data(call.b), call.d, call.grouped_layout, call.use_psum_layout,
                                   call.expected_m, **_scales(call)).run()


def _deep_gemm_masked(call: MaskedGroupedInputs) -> None:
    deep_gemm.m_grouped_masked(_data(call.a), _data(call.b), call.d, call.masked_m, call.expected_m,
                               **_scales(call)).run()


def register(registry: Registry) -> None:
    quantized = {"a": NVIDIA_FORMATS, "b": NVIDIA_FORMATS}
    bf16 = {"a": (torch.bfloat16,), "b": (torch.bfloat16,), "d": OUT_DTYPES}
    for contract, fn, dtypes, formats in (
            (M_GROUPED_FP8_CONTIGUOUS, _contiguous, {"d": OUT_DTYPES}, quantized),
            (M_GROUPED_BF16_CONTIGUOUS, _contiguous, bf16, {}),
            (M_GROUPED_FP8_MASKED, _masked, {"d": OUT_DTYPES}, quantized),
            (M_GROUPED_BF16_MASKED, _masked, bf16, {})):
        registry.kernel(contract.name, BACKEND, TRITON, priority=TRITON_PRIORITY, formats=formats, dtypes=dtypes,
                        devices=triton_devices(), check=_reasons,
                        doc="Triton, one pass per group in a row tile, valid rows written only")(fn)
    for contract, fn in ((M_GROUPED_BF16_CONTIGUOUS, _grouped_mm_contiguous),
                         (M_GROUPED_BF16_MASKED, _grouped_mm_masked)):
        registry.kernel(contract.name, BACKEND, "grouped_mm", priority=TORCH_VENDOR_PRIORITY,
                        dtypes={"a": (torch.bfloat16,), "d": (torch.bfloat16,)}, devices=("cuda",),
                        check=_grouped_mm_reasons, shape_class=_grouped_mm_shape,
                        doc="torch._grouped_mm, valid rows merged into d; untested on a GPU")(fn)
    for contract, fn, formats in ((M_GROUPED_FP8_CONTIGUOUS, _deep_gemm_contiguous, quantized),
                                  (M_GROUPED_BF16_CONTIGUOUS, _deep_gemm_contiguous, {}),
                                  (M_GROUPED_FP8_MASKED, _deep_gemm_masked, quantized),
                                  (M_GROUPED_BF16_MASKED, _deep_gemm_masked, {})):
        registry.kernel(contract.name, BACKEND, "deep_gemm", priority=LIBRARY_PRIORITY, formats=formats,
                        dtypes={"d": (torch.bfloat16,)}, devices=("cuda",), check=_deep_gemm_reasons,
                        doc="delegates to deep_gemm when importable; untested on a GPU")(fn)
