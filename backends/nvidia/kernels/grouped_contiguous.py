"""m_grouped_{fp8,bf16}_gemm_nt_contiguous in Triton: MoE rows of all groups back to back in A
[M, K], one B [G, N, K] per group; only valid rows of D are written.

Every group's segment starts on a multiple of the alignment (128 on NVIDIA, 256 for Ascend-style
layouts, or any value set by set_mk_alignment_for_contiguous_layout, e.g. DeepGEMM's 224). A row
tile of BLOCK_M rows is computed once per group that has rows in it, each pass storing only that
group's rows: one pass when BLOCK_M divides the alignment (the autotuner and the default config
prefer such tiles), two or more on the tiles where a segment boundary falls inside. The groups
come from `m_indices` (the tile's distinct ids in ascending order; -1 padding rows belong to none)
or, in the psum form, from the cumulative end rows: group g owns [align(psum[g-1]), psum[g]). A
group id outside [0, G) is skipped, never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized
from ._launch import autotuned, launch
from ._tile import gemm_tile, store_tile

OPS = {True: "m_grouped_fp8_gemm_nt_contiguous", False: "m_grouped_bf16_gemm_nt_contiguous"}


@triton.jit
def _psum_group(psum_ptr, row, G, ALIGN, G_POW2: tl.constexpr):
    """(group, first row, end row) of the segment holding `row` in the psum layout: the last group
    starting at or before `row` (empty groups before it own no rows at or after `row`)."""
    g = tl.arange(0, G_POW2)
    ends = tl.load(psum_ptr + g, mask=g < G, other=0x7FFFFFFF)
    prev = tl.load(psum_ptr + g - 1, mask=(g >= 1) & (g < G), other=0)
    starts = tl.where(g < G, (prev + ALIGN - 1) // ALIGN * ALIGN, 0x7FFFFFFF)
    group = tl.sum((starts <= row).to(tl.int32)) - 1
    start = tl.sum(tl.where(g == group, starts, 0))
    end = tl.sum(tl.where(g == group, ends, 0))
    return group, start, end


@triton.jit
def _psum_bounds(psum_ptr, group, G, ALIGN):
    """(first row, end row) of `group` in the psum layout; (0, 0) for group >= G (nothing read)."""
    prev = tl.load(psum_ptr + group - 1, mask=(group >= 1) & (group <= G), other=0)
    end = tl.load(psum_ptr + group, mask=group < G, other=0)
    return (prev + ALIGN - 1) // ALIGN * ALIGN, end


@triton.jit
def grouped_contiguous_kernel(a_ptr, b_ptr, d_ptr, layout_ptr, sa_ptr, sb_ptr, M, N, K, G, ALIGN,
                              stride_am, stride_bg, stride_bn, stride_dm,
                              sa_stride_mn, sa_stride_k, sb_stride_g, sb_stride_mn, sb_stride_k,
                              SB_GRAN_N: tl.constexpr, IS_FP8: tl.constexpr, PSUM: tl.constexpr,
                              SA_PACKED: tl.constexpr, SB_PACKED: tl.constexpr, OUT_BF16: tl.constexpr,
                              G_POW2: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    first = pid_m * BLOCK_M
    rm = first + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m = rm < M
    mask_n = rn < N
    none = 0x7FFFFFFF  # "no further group"
    if PSUM:
        group, start, end = _psum_group(layout_ptr, first, G, ALIGN, G_POW2)
        more = (group < G) & (start < first + BLOCK_M)
    else:
        ids = tl.load(layout_ptr + rm, mask=in_m, other=-1)
        group = tl.min(tl.where(ids >= 0, ids, none))
        more = group < G
    while more:
        if PSUM:
            valid = in_m & (rm >= start) & (rm < end)
        else:
            valid = ids == group
        if (group >= 0) & (tl.sum(valid.to(tl.int32)) > 0):
            acc = gemm_tile(a_ptr, b_ptr + group.to(tl.int64) * stride_bg, sa_ptr, sb_ptr + group * sb_stride_g,
                            rm, rn, valid, mask_n, K, stride_am, stride_bn, 1, 1, sa_stride_mn, sa_stride_k,
                            sb_stride_mn, sb_stride_k, 1, SB_GRAN_N, IS_FP8, SA_PACKED, SB_PACKED,
                            BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
            store_tile(d_ptr, d_ptr, acc, rm, rn, valid[:, None] & mask_n[None, :], stride_dm, 0, 0, False,
                       OUT_BF16, INTERPRET)
        if PSUM:
            group += 1
            start, end = _psum_bounds(layout_ptr, group, G, ALIGN)
            more = (group < G) & (start < first + BLOCK_M)
        else:
            group = tl.min(tl.where(ids > group, ids, none))
            more = group < G


#: the first is the default for the usual alignment 128: 128x64 on 8 warps is the largest tile whose
#: fp8 form compiles without spills on sm90 and sm100 (128x128 spills 8-16 B / 176-184 B there; on
#: 4 warps 128x64 spilled on both, so that form is gone)
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4),
]


def _prune(configs, named_args, **kwargs):
    """Configs whose row tile divides the alignment (one pass per tile), if any; else all of them."""
    fitting = [c for c in configs if named_args["ALIGN"] % c.kwargs["BLOCK_M"] == 0]
    return fitting or configs


def default_config(alignment: int) -> triton.Config:
    """The config launched without autotuning: the first whose BLOCK_M divides the alignment, else
    the smallest row tile (fewest tiles holding a segment boundary)."""
    return next((c for c in CONFIGS if alignment % c.kwargs["BLOCK_M"] == 0),
                min(CONFIGS, key=lambda c: c.kwargs["BLOCK_M"]))


_tuned = autotuned(grouped_contiguous_kernel, CONFIGS, key=["M", "N", "K", "G", "ALIGN", "IS_FP8", "PSUM",
                                                            "SA_PACKED", "SB_PACKED", "OUT_BF16"],
                   prune_configs_by={"early_config_prune": _prune})


def check_groups(op: str, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, a_dims: int) -> None:
    _checks.tensor(op, "a", a, (dtype,), (None,) * a_dims)
    _checks.tensor(op, "b", b, (dtype,), (None, None, a.shape[-1]), a.device)
    _checks.inner_contiguous(op, "a", a)
    _checks.inner_contiguous(op, "b", b)
    if b.shape[0] < 1:
        _checks.fail(op, "b", "empty along G", "at least one group", "pass G >= 1 weights")
    if a.shape[-1] < 1:
        _checks.fail(op, "a", "empty along K", "K >= 1", "a GEMM over K = 0 has nothing to compute")


@serialized
def m_grouped_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                 *, sfa: torch.Tensor | None = None, sfb: torch.Tensor | None = None,
                                 gran_a: tuple[int, int] = (1, 128), gran_b: tuple[int, int] = (128, 128),
                                 use_psum_layout: bool = False, alignment: int = 128,
                                 config: triton.Config | None = None) -> None:
    """Contiguous grouped GEMM written into d (valid rows only).

    fp8 (sfa and sfb given): a e4m3 [M, K] with per-row scales sfa (gran (1, gk)); b e4m3 [G, N, K]
    with scales sfb (gran (gn, gk), fp32 [G, ceil(N/gn), kb] or sm100 int32 words [G, N, w]).
    bf16 (no scales): a bf16 [M, K], b bf16 [G, N, K]. d: bf16/fp32 [M, N] contiguous.
    grouped_layout: int32 [M] group per row (-1 padding), or with use_psum_layout int32 [G]
    cumulative end rows. alignment: the segments' row alignment, any positive int.
    """
    is_fp8 = sfa is not None or sfb is not None
    op = OPS[is_fp8]
    check_groups(op, a, b, torch.float8_e4m3fn if is_fp8 else torch.bfloat16, 2)
    (m, k), (g, n, _) = a.shape, b.shape
    device = a.device
    if is_fp8:
        if gran_a[0] != 1 or gran_a[1] != gran_b[1]:
            _checks.fail(op, "gran_a", gran_a, f"(1, {gran_b[1]}) (per-token, b's K granularity)",
                         "quantize activations per token with b's gran_k")
        _checks.block_k(op, "gran_a", gran_a[1])
        _checks.scale_storage(op, "sfa", sfa, m, k, gran_a, device)
        _checks.scale_storage(op, "sfb", sfb, n, k, gran_b, device, groups=g)
    _checks.gemm_output(op, d, None, (m, n), device)
    _checks.tensor(op, "grouped_layout", grouped_layout, (torch.int32,), (g if use_psum_layout else m,), device)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        _checks.fail(op, "alignment", repr(alignment), "a positive int",
                     "use get_m_alignment_for_contiguous_layout() (128 on NVIDIA)")
    if m == 0 or n == 0:
        return
    sfa = sfa if is_fp8 else a
    sfb = sfb if is_fp8 else b
    sb_strides = (sfb.stride(0), sfb.stride(1), sfb.stride(2)) if is_fp8 else (0, 0, 0)
    args = (a, b, d, grouped_layout, sfa, sfb, m, n, k, g, alignment, a.stride(0), b.stride(0), b.stride(1),
            d.stride(0), sfa.stride(0) if is_fp8 else 0, sfa.stride(1) if is_fp8 else 0, *sb_strides)
    constants = dict(SB_GRAN_N=gran_b[0] if is_fp8 else 1, IS_FP8=is_fp8, PSUM=use_psum_layout,
                     SA_PACKED=is_fp8 and sfa.dtype == torch.int32, SB_PACKED=is_fp8 and sfb.dtype == torch.int32,
                     OUT_BF16=d.dtype == torch.bfloat16, G_POW2=triton.next_power_of_2(g),
                     BLOCK_K=gran_a[1] if is_fp8 else 64, INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))

    launch(grouped_contiguous_kernel, _tuned, grid, args, constants, config, default_config(alignment))
