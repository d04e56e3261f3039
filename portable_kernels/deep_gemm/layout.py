"""`deep_gemm` layout utilities: TMA-aligned scale layouts, the packed UE8M0 form, the contiguous
alignment (shared with portable_kernels' grouped GEMMs and get_fused_mapping) — built on
portable_kernels.layouts, with DeepGEMM's signatures.

Which layout `transform_sf_into_required_layout` produces depends on the architecture, as in
DeepGEMM: SM90 keeps fp32 (MN-major, TMA-aligned), SM100 packs UE8M0 exponents four per int32; the
architecture is the nvidia backend's (`use_backend("nvidia", arch="sm100")`, else the CUDA
device's, else SM90). Scales that are not powers of two are refused where DeepGEMM would silently
keep only their exponent bits.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.checks import check_int, is_int
from ..core.alignment import padding_rows, set_mk_alignment_for_contiguous_layout
from ..core.errors import ContractError, LayoutError, format_problem
from ..core.alignment import get_m_alignment_for_contiguous_layout
from ..layouts import (LayoutConversionError, TMA_ALIGN_BYTES, broadcast_block_scales_to_rows, sm90_sfa_encode,
                       sm100_ue8m0_encode, tma_aligned_mn)
from ..core.tensors import cdiv as ceil_div
from ..core.tensors import describe
from .runtime import arch_major

__all__ = ["get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor", "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor",
           "get_mn_major_tma_aligned_packed_ue8m0_tensor", "transform_sf_into_required_layout",
           "get_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
           "get_m_alignment_for_contiguous_layout", "get_k_alignment_for_contiguous_layout",
           "get_theoretical_mk_alignment_for_contiguous_layout"]

#: SM100 block size DeepGEMM aligns the contiguous layout to, and its MMA step (get_theoretical_...)
SM100_BLOCK_M, SM100_MMA_STEP = 224, 32
LEGACY_ALIGNMENT = 128


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """x rounded up so x elements of element_size bytes fill whole 16-byte TMA units."""
    check_int("get_tma_aligned_size", "x", x, 0)
    if element_size not in (1, 2, 4, 8, 16):
        raise ContractError(format_problem("get_tma_aligned_size", "element_size", repr(element_size),
                                           f"a divisor of {TMA_ALIGN_BYTES}", "pass tensor.element_size()"))
    return tma_aligned_mn(x, element_size)


def _scales(op: str, sf: Any) -> None:
    if not isinstance(sf, torch.Tensor) or sf.dtype != torch.float32 or sf.dim() not in (2, 3):
        raise ContractError(format_problem(op, "sf", describe(sf), "fp32 [(G,) MN, K-blocks]",
                                           "pass the fp32 scales of a cast"))


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """fp32 [(G,) MN, K] -> the same values stored MN-major with strides (1, align(MN, 4)) (DeepGEMM's SM90 SFA)."""
    _scales("get_mn_major_tma_aligned_tensor", sf)
    mn, k = sf.shape[-2:]
    aligned = get_tma_aligned_size(mn, 4)
    if sf.stride(-2) == 1 and sf.stride(-1) == aligned and (sf.dim() == 2 or sf.stride(0) == aligned * k):
        return sf  # already in the layout, as DeepGEMM returns it
    return sm90_sfa_encode(sf)


#: DeepGEMM's name of the same layout before it called it MN-major
get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, psum_layout: torch.Tensor | None = None) -> torch.Tensor:
    """Power-of-two fp32 [(G,) MN, K] -> int32 [(G,) MN, ceil(K/4)], four exponents per word, MN-major,
    TMA-aligned (DeepGEMM's SM100 scales). With psum_layout (int32 [G] end rows, 2-D sf), the gap rows
    of that layout may hold anything: they are packed as 1.0 (DeepGEMM writes some finite code there)."""
    op = "get_mn_major_tma_aligned_packed_ue8m0_tensor"
    _scales(op, sf)
    if psum_layout is not None:
        if sf.dim() != 2 or not isinstance(psum_layout, torch.Tensor) or psum_layout.dtype != torch.int32:
            raise ContractError(format_problem(op, "psum_layout", describe(psum_layout),
                                               "int32 [G] end rows, with 2-D sf", "pass the GEMM's psum layout"))
        gaps = padding_rows(psum_layout, True, get_mk_alignment_for_contiguous_layout(), sf.shape[0])
        sf = sf.masked_fill(gaps[:, None], 1.0)
    try:
        return sm100_ue8m0_encode(sf)
    except LayoutConversionError as exc:
        raise LayoutError(f"{op}: {exc}") from exc


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, grouped_layout: torch.Tensor,
                                                           ks_cpu: list[int] | None, gran_k: int, k_alignment: int,
                                                           use_psum_layout: bool = False) -> torch.Tensor:
    """DeepGEMM's per-group packing of k-grouped SM100 scales: power-of-two fp32 [sf_k, MN] (each
    group's ceil(k_g / gran_k) scale rows in turn) -> int32 [packed_sf_k, MN], four consecutive K
    scales of one group per word (a group's last word padded with zero bytes), MN-major.
    grouped_layout (int32 [G], the device copy) gives each group's K: its entries, or with
    use_psum_layout end offsets, group g spanning [align(end[g-1], k_alignment), end[g]).
    packed_sf_k = sum ceil(k_g / (4 gran_k)) over ks_cpu when given; without it (None or [],
    psum layout only) DeepGEMM's upper bound (sf_k + 3 G) / 4, the rows past the groups' words zero."""
    op = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    _scales(op, sf)
    if gran_k not in (32, 128):
        raise ContractError(format_problem(op, "gran_k", repr(gran_k), "32 or 128", "pass the scales' K granularity"))
    if not is_int(k_alignment) or k_alignment <= 0 or k_alignment % 32:
        raise ContractError(format_problem(op, "k_alignment", repr(k_alignment), "a positive multiple of 32",
                                           "pass the contiguous layout's K alignment"))
    if sf.dim() != 2 or not sf.is_contiguous() or sf.shape[1] % 4:
        raise ContractError(format_problem(op, "sf", describe(sf), "contiguous fp32 [sf_k, MN] with MN % 4 == 0",
                                           "pass the k-grouped scales as produced by per_channel_cast_to_fp8"))
    if not isinstance(grouped_layout, torch.Tensor) or grouped_layout.dtype != torch.int32 \
            or grouped_layout.dim() != 1 or not 1 <= grouped_layout.numel() <= 128:
        raise ContractError(format_problem(op, "grouped_layout", describe(grouped_layout), "int32 [G], 1 <= G <= 128",
                                           "pass the groups' K sizes (or psum ends) as an int32 tensor"))
    synced = ks_cpu is not None and len(ks_cpu) > 0
    if not synced and not use_psum_layout:
        raise ContractError(format_problem(op, "ks_cpu", repr(ks_cpu), "the groups' K sizes (or use_psum_layout)",
                                           "pass ks_cpu = grouped_layout.tolist()"))
    if synced and len(ks_cpu) != grouped_layout.numel():
        raise ContractError(format_problem(op, "ks_cpu", f"{len(ks_cpu)} sizes", f"{grouped_layout.numel()} (one per "
                                           "group)", "pass one K size per group"))
    sf_k, mn = sf.shape
    groups = grouped_layout.tolist()
    ks, previous = [], 0
    for value in groups:
        ks.append(value - ceil_div(previous, k_alignment) * k_alignment if use_psum_layout else value)
        previous = value
    rows = [ceil_div(k, gran_k) for k in ks]
    if sum(rows) > sf_k or min(ks) < 0 or (synced and not use_psum_layout and sum(rows) != sf_k):
        raise ContractError(format_problem(op, "grouped_layout", repr(groups), f"groups whose scale rows fit sf's "
                                           f"{sf_k}", "pass the layout the scales were made for"))
    packed_rows = sum(ceil_div(k, gran_k * 4) for k in ks_cpu) if synced else (sf_k + 3 * len(groups)) // 4
    out = torch.zeros(packed_rows, mn, dtype=torch.int32, device=sf.device)
    start, at = 0, 0
    for n in rows:
        words = ceil_div(n, 4)
        if words and at < packed_rows:
            try:
                packed = sm100_ue8m0_encode(sf[start:start + n].T)       # [MN, words], exponents only
            except LayoutConversionError as exc:
                raise LayoutError(f"{op}: {exc}") from exc
            keep = min(words, packed_rows - at)
            out[at:at + keep] = packed[:mn, :keep].T
        start, at = start + n, at + words
    return out


def transform_sf_into_required_layout(sf: torch.Tensor, mn: int, k: int, recipe: tuple, num_groups: int | None = None,
                                      is_sfa: bool | None = None, disable_ue8m0_cast: bool = False,
                                      psum_layout: torch.Tensor | None = None) -> torch.Tensor:
    """Scales in the layout DeepGEMM's kernels read on this architecture (see the module docstring).

    recipe: (gran_m, gran_n, gran_k) with is_sfa, or (gran_mn, gran_k) without it.
    """
    op = "transform_sf_into_required_layout"
    if isinstance(recipe, (tuple, list)) and len(recipe) == 3 and is_sfa is not None:
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    elif isinstance(recipe, (tuple, list)) and len(recipe) == 2 and is_sfa is None:
        gran_mn, gran_k = recipe
    else:
        raise ContractError(format_problem(op, "recipe", repr(recipe), "(gran_m, gran_n, gran_k) with is_sfa, or "
                                           "(gran_mn, gran_k) without it", "pass the GEMM's recipe"))
    if not isinstance(sf, torch.Tensor) or sf.dim() != 2 + (num_groups is not None):
        raise ContractError(format_problem(op, "sf", describe(sf), f"{2 + (num_groups is not None)}-D scales",
                                           "pass num_groups only for grouped [G, MN, K] scales"))
    words = 4 if sf.dtype == torch.int32 else 1
    if sf.shape[-2] != -(-mn // gran_mn) or sf.shape[-1] != -(-k // (gran_k * words)):
        raise ContractError(format_problem(op, "sf", f"of shape {tuple(sf.shape)}",
                                           f"[..., ceil(mn/{gran_mn}), ceil(k/{gran_k * words})]",
                                           "pass mn, k and recipe of these scales"))
    sm100 = arch_major() == 10
    if sf.dtype == torch.float32 and (not sm100 or disable_ue8m0_cast) and gran_k == 128 and gran_mn in (1, 128):
        return get_mn_major_tma_aligned_tensor(sf) if gran_mn == 1 else sf
    if sf.dtype == torch.float32 and sm100 and gran_k in (32, 128) and not disable_ue8m0_cast:
        rows = sf if gran_mn == 1 else broadcast_block_scales_to_rows(sf, mn, gran_mn)
        return get_mn_major_tma_aligned_packed_ue8m0_tensor(rows, psum_layout)
    if sf.dtype == torch.int32 and sm100 and gran_mn == 1 and gran_k in (32, 128):
        return sf
    raise ContractError(format_problem(op, "sf", f"{sf.dtype} scales with recipe {tuple(recipe)} on SM{arch_major()}0",
                                       "a transformation DeepGEMM defines (fp32 (1|128, 128) on SM90, fp32 or int32 "
                                       "(x, 32|128) on SM100)", "check the recipe and the scales' dtype"))


def get_mk_alignment_for_contiguous_layout() -> int:
    """The contiguous layout's alignment (set_mk_alignment_for_contiguous_layout's value, else 128)."""
    return get_m_alignment_for_contiguous_layout()


get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """DeepGEMM's preferred alignment: 128 on SM90; on SM100 its block size 224, lowered in steps of 32
    while the smaller block still covers expected_m."""
    if arch_major() != 10:
        return LEGACY_ALIGNMENT
    block_m = SM100_BLOCK_M
    if expected_m is not None:
        while block_m > SM100_MMA_STEP and block_m - SM100_MMA_STEP >= expected_m:
            block_m -= SM100_MMA_STEP
    return block_m
