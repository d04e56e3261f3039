"""Delegation to DeepGEMM (`deep_gemm`) when it is importable: our sm90/sm100 bytes are DeepGEMM's.

DeepGEMM's calls (deep_gemm/__init__.py, csrc/apis/gemm.hpp): `fp8_gemm_nt((a, sfa), (b, sfb), d,
c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False)`,
`m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout, ..., use_psum_layout=False,
ensure_zero_padding=True, expected_m_for_psum_layout=None)`, `m_grouped_fp8_gemm_nt_masked(...,
masked_m, expected_m, ...)`, and the bf16 twins. On SM90 it reads fp32 SFA (MN-major,
TMA-aligned) and 128x128 SFB as is; on SM100 packed UE8M0 int32 scales — exactly our formats, so
its own layout transform finds nothing to do. Its grouped GEMMs write bf16 d only; we pass
`ensure_zero_padding=False` because the contract leaves padding rows of d untouched.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ._probe import missing_reason, module

PACKAGE = "deep_gemm"


@attrs.frozen
class DeepGemmCall:
    """One DeepGEMM call: its function name, positional and keyword arguments."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def run(self, library: Any = None) -> None:
        getattr(library or module(PACKAGE), self.function)(*self.args, **self.kwargs)


def unavailable_reason() -> str | None:
    return missing_reason(PACKAGE)


def recipe(gran_a: tuple[int, int], gran_b: tuple[int, int]) -> dict[str, Any]:
    """DeepGEMM's recipe keywords: one (gm, gn, gk) when both share gran_k, else recipe_a / recipe_b."""
    if gran_a[1] == gran_b[1]:
        return {"recipe": (gran_a[0], gran_b[0], gran_a[1])}
    return {"recipe_a": tuple(gran_a), "recipe_b": tuple(gran_b)}


def fp8_gemm_nt(a, sfa, b, sfb, d, c, gran_a, gran_b) -> DeepGemmCall:
    return DeepGemmCall("fp8_gemm_nt", ((a, sfa), (b, sfb), d), {"c": c, **recipe(gran_a, gran_b),
                                                                  "disable_ue8m0_cast": True})


def fp8_fp4_gemm_nt(a, sfa, b, sfb, d, c, gran_a, gran_b) -> DeepGemmCall:
    return DeepGemmCall("fp8_fp4_gemm_nt", ((a, sfa), (b.view(torch.int8), sfb), d),
                        {"c": c, **recipe(gran_a, gran_b), "disable_ue8m0_cast": True})


def bf16_gemm_nt(a, b, d, c) -> DeepGemmCall:
    return DeepGemmCall("bf16_gemm_nt", (a, b, d), {"c": c})


def m_grouped_contiguous(a, b, d, grouped_layout, use_psum_layout, expected_m, sfa=None, sfb=None, gran_a=None,
                         gran_b=None) -> DeepGemmCall:
    keywords = {"use_psum_layout": use_psum_layout, "ensure_zero_padding": False}
    if use_psum_layout:
        keywords["expected_m_for_psum_layout"] = expected_m
    if sfa is None:
        return DeepGemmCall("m_grouped_bf16_gemm_nt_contiguous", (a, b, d, grouped_layout), keywords)
    return DeepGemmCall("m_grouped_fp8_gemm_nt_contiguous", ((a, sfa), (b, sfb), d, grouped_layout),
                        {**recipe(gran_a, gran_b), "disable_ue8m0_cast": True, **keywords})


def m_grouped_masked(a, b, d, masked_m, expected_m, sfa=None, sfb=None, gran_a=None, gran_b=None) -> DeepGemmCall:
    if sfa is None:
        return DeepGemmCall("m_grouped_bf16_gemm_nt_masked", (a, b, d, masked_m, expected_m), {})
    return DeepGemmCall("m_grouped_fp8_gemm_nt_masked", ((a, sfa), (b, sfb), d, masked_m, expected_m),
                        {**recipe(gran_a, gran_b), "disable_ue8m0_cast": True})


def grouped_reasons(d_dtype: torch.dtype) -> list[str]:
    return [] if d_dtype == torch.bfloat16 else [f"DeepGEMM's grouped GEMMs write bf16 d, not {d_dtype}"]
