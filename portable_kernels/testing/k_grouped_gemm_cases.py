"""Conformance cases for the K-grouped GEMMs (fp8 tn with and without the psum layout, fp8 nt, bf16
tn): every group's d[g] against the fp64 reference from the dequantized per-group operands, c
accumulated, empty groups giving c[g]. Group sizes follow the running backend's alignment."""

from __future__ import annotations

import functools

import torch

from ..core.alignment import get_m_alignment_for_contiguous_layout
from ..ops.gemm.k_grouped import (k_grouped_bf16_gemm_tn_contiguous, k_grouped_fp8_gemm_nt_contiguous,
                              k_grouped_fp8_gemm_tn_contiguous)
from ..ops.quant.fp8 import expand_scales, quantize_blocks_reference
from .checks import assert_close, assert_written
from .core import Case, conformance_cases
from .generators import randn

FP32_OUTPUT_BOUND = 1e-6
# (M, N, K of each group as a fraction of the alignment; 0 is an empty group)
QUICK = [(48, 32, (1.0, 0.0, 2.0)), (8, 130, (0.4, 1.3))]
FULL = QUICK + [(256, 512, (3.0, 1.0, 0.0, 2.5, 4.0))]


def _ks(fractions, alignment: int, psum: bool) -> list[int]:
    if psum:  # real K sizes; the layout aligns each group's start
        return [round(f * alignment) for f in fractions]
    return [round(f) * alignment if f >= 1 or f == 0 else alignment for f in fractions]


def _quantized_groups(x: torch.Tensor, spans, gran_k: int):
    """Per-group per-channel quantization (data in place, compact scales) and dequantized values."""
    data = torch.zeros(x.shape, dtype=torch.float8_e4m3fn)
    scales, values = [], torch.zeros(x.shape, dtype=torch.float64)
    for start, size in spans:
        if size == 0:
            continue
        q, sf = quantize_blocks_reference(x[start:start + size], gran_k, 1, True)
        data[start:start + size] = q
        scales.append(sf)
        values[start:start + size] = q.double() * expand_scales(sf, (gran_k, 1), (size, x.shape[1])).double()
    return data, torch.cat(scales) if scales else torch.empty(0, x.shape[1]), values


def _case(layout: str, fp8: bool, psum: bool, m: int, n: int, fractions, gran_k: int, seed: int,
          device: torch.device) -> float:
    alignment = get_m_alignment_for_contiguous_layout()
    ks = _ks(fractions, alignment, psum)
    spans, end = [], 0
    for k in ks:
        start = -(-end // alignment) * alignment if psum else end
        spans.append((start, k))
        end = start + k
    total = -(-end // alignment) * alignment if psum else end
    layout_values = [start + k for start, k in spans] if psum else ks
    x = randn(total, m, seed=seed, dtype=torch.bfloat16)
    y = randn(total, n, seed=seed + 1, dtype=torch.bfloat16)
    c = randn(len(ks), m, n, seed=seed + 2, device=device)
    d = torch.full((len(ks), m, n), float("nan"), device=device)
    grouped_layout = torch.tensor(layout_values, dtype=torch.int32, device=device)
    ks_arg = None if psum else list(ks)
    if fp8:
        xa, sfa, va = _quantized_groups(x, spans, gran_k)
        yb, sfb, vb = _quantized_groups(y, spans, gran_k)
        if layout == "tn":
            k_grouped_fp8_gemm_tn_contiguous((xa.to(device), sfa.to(device)), (yb.to(device), sfb.to(device)), d,
                                             ks_arg, grouped_layout, c, recipe=(1, 1, gran_k), use_psum_layout=psum)
        else:
            flat = [(t[s:s + k].T.contiguous().flatten()) for t in (xa, yb) for s, k in [*spans]]
            a_flat, b_flat = torch.cat(flat[:len(spans)]), torch.cat(flat[len(spans):])
            k_grouped_fp8_gemm_nt_contiguous((a_flat.to(device), sfa.T.to(device)), (b_flat.to(device), sfb.T.to(device)),
                                             d, ks_arg, grouped_layout, c)
    else:
        va, vb = x.double(), y.double()
        k_grouped_bf16_gemm_tn_contiguous(x.to(device), y.to(device), d, ks_arg, grouped_layout, c,
                                          use_psum_layout=psum)
    assert_written(d, "d")
    ref = c.cpu().double().clone()
    for g, (start, k) in enumerate(spans):
        ref[g] += va[start:start + k].T @ vb[start:start + k]
    return assert_close(d.cpu(), ref, FP32_OUTPUT_BOUND, "d vs dequantized reference")


def _cases(op: str, layout: str, fp8: bool, psums, gran_ks, quick: bool, seed0: int) -> list[Case]:
    cases = []
    for i, (m, n, fractions) in enumerate(QUICK if quick else FULL):
        for psum in psums:
            for gran_k in gran_ks:
                seed = seed0 + 10 * i + psum
                label = f"M={m} N={n} K/alignment={fractions} psum={psum}" + (f" gran_k={gran_k}" if fp8 else "")
                cases.append(Case(op, label, seed,
                                  functools.partial(_case, layout, fp8, psum, m, n, fractions, gran_k, seed)))
    return cases


@conformance_cases("k_grouped_fp8_gemm_tn_contiguous")
def fp8_tn_cases(quick: bool) -> list[Case]:
    return _cases("k_grouped_fp8_gemm_tn_contiguous", "tn", True, (False, True), (128, 32), quick, 8000)


@conformance_cases("k_grouped_fp8_gemm_nt_contiguous")
def fp8_nt_cases(quick: bool) -> list[Case]:
    return _cases("k_grouped_fp8_gemm_nt_contiguous", "nt", True, (False,), (128,), quick, 8100)


@conformance_cases("k_grouped_bf16_gemm_tn_contiguous")
def bf16_tn_cases(quick: bool) -> list[Case]:
    return _cases("k_grouped_bf16_gemm_tn_contiguous", "tn", False, (False, True), (1,), quick, 8200)
