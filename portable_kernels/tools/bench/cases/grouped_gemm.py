"""MoE grouped GEMM cases: m_grouped_*_gemm_nt_{masked,contiguous} against a loop of torch.matmul.

The peer is the loop over experts a user writes, with FP8 weights dequantized once and kept in
bf16 (activations dequantized per call). Targets are issue 12's (cpu backend).
"""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.layouts import contiguous_m_indices
from portable_kernels.ops.quant.fp8 import dequantize_reference

from ..case import TINY, UE8M0_NOTE, Case, Inputs, needs_pow2_scales, seeded

FAMILY = "grouped_gemm"
TITLE = "MoE grouped GEMMs vs a loop of torch.matmul"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend


def _build_masked(g: int, rows: int, n: int, k: int):
    def build(device: torch.device) -> Inputs:
        x = seeded(g, rows, k, seed=10, device=device)
        w = seeded(g, n, k, seed=11, device=device, scale=k ** -0.5)
        ue8m0 = needs_pow2_scales("m_grouped_fp8_gemm_nt_masked")
        a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0), pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)
        prepared = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_masked, a=a, b=b)
        i = Inputs(a=a, pa=prepared["a"], pb=prepared["b"], rows=rows, g=g,
                   masked_m=torch.full((g,), rows, dtype=torch.int32, device=device),
                   d=torch.empty(g, rows, n, dtype=torch.bfloat16, device=device),
                   w_bf16=dequantize_reference(b).bfloat16())
        if ue8m0:
            i.note = UE8M0_NOTE
        return i
    return build


def _masked_peer(i: Inputs) -> object:
    ad = dequantize_reference(i.a).bfloat16()
    return [torch.matmul(ad[e, :i.rows], i.w_bf16[e].T) for e in range(i.g)]


def _masked(g: int, rows: int, n: int, k: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "m_grouped_fp8_gemm_nt_masked", f"G={g} rows={rows} N={n} K={k}", _build_masked(g, rows, n, k),
                lambda i: pk.m_grouped_fp8_gemm_nt_masked(i.pa, i.pb, i.d, i.masked_m, i.rows), _masked_peer,
                "m_grouped_fp8_gemm_nt_masked (prepared)",
                "loop of torch.matmul per expert, weights dequantized once to bf16", target=1.0,
                target_source=SOURCE, target_on=ON, sizes=sizes)


def _build_contiguous(g: int, rows: int, n: int, k: int):
    def build(device: torch.device) -> Inputs:
        # each group's segment padded to the backend's alignment (padding rows: -1, never computed)
        align = pk.get_m_alignment_for_contiguous_layout()
        stride = -(-rows // align) * align
        m_indices = contiguous_m_indices(torch.full((g,), rows), align).to(device)
        return Inputs(x=seeded(g * stride, k, seed=12, device=device),
                      w=seeded(g, n, k, seed=13, device=device, scale=k ** -0.5), rows=rows, g=g, stride=stride,
                      m_indices=m_indices, d=torch.empty(g * stride, n, dtype=torch.bfloat16, device=device))
    return build


def _contiguous_peer(i: Inputs) -> object:
    return [torch.matmul(i.x[e * i.stride:e * i.stride + i.rows], i.w[e].T) for e in range(i.g)]


def _contiguous(g: int, rows: int, n: int, k: int, sizes=frozenset({"quick", "full"})) -> Case:
    return Case(FAMILY, "m_grouped_bf16_gemm_nt_contiguous", f"G={g} rows={rows} N={n} K={k}",
                _build_contiguous(g, rows, n, k),
                lambda i: pk.m_grouped_bf16_gemm_nt_contiguous(i.x, i.w, i.d, i.m_indices), _contiguous_peer,
                "m_grouped_bf16_gemm_nt_contiguous", "loop of torch.matmul per expert (bf16)", target=1.0,
                target_source=SOURCE, target_on=ON, sizes=sizes)


CASES = [
    _masked(8, 16, 4096, 7168),
    _contiguous(8, 256, 2048, 7168),
    _masked(2, 4, 128, 256, sizes=TINY),
    _contiguous(2, 100, 128, 256, sizes=TINY),
]
