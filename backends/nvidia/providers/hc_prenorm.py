"""nvidia provider of tf32_hc_prenorm_gemm: the Triton kernel (kernels/hc_prenorm_gemm.py) — one pass
over a giving the TF32 product and the squared norm; untested on a GPU. DeepGEMM's own kernel is
not mapped (DeepGEMM's provider module maps the GEMMs and attention only)."""

from __future__ import annotations

from portable_kernels.core.registry import Registry
from portable_kernels.ops.gemm.hc_prenorm import HC_PRENORM, HcPrenormInputs

from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

#: the widest N the kernel covers in one tile (kernels.hc_prenorm_gemm.MAX_N, without importing Triton)
MAX_N = 256


def _reasons(call: HcPrenormInputs) -> list[str]:
    out = triton_reasons(call)
    if call.b.shape[0] > MAX_N:
        out.append(f"N = {call.b.shape[0]} > {MAX_N}: the kernel loads the whole b tile per K step")
    return out


def _fits(call: HcPrenormInputs) -> bool:
    """What the check looks at beyond dtypes and devices (selection caches its answer per value)."""
    return call.b.shape[0] <= MAX_N


def _hc_prenorm(call: HcPrenormInputs) -> None:
    kernel("hc_prenorm_gemm").tf32_hc_prenorm_gemm(call.a, call.b, call.d, call.sqr_sum, call.num_splits)


def register(registry: Registry) -> None:
    registry.kernel(HC_PRENORM.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    check=_reasons, shape_class=_fits, doc="Triton: a tile widened once for the TF32 dot and the sum of squares, "
                                        "a program per (64 rows, K split); untested on a GPU")(_hc_prenorm)
