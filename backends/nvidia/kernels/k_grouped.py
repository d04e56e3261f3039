"""k_grouped_fp8_gemm_{tn,nt}_contiguous and k_grouped_bf16_gemm_tn_contiguous in Triton: one fp32
[M, N] output per group, d[g] = c[g] + Σ over the group's own K rows.

One program computes one BLOCK_M x BLOCK_N tile of one group (grid: tiles x G). The group's first
row, K size and first scale row are read on the device from `grouped_layout` (K sizes, or psum end
rows whose group g starts at align(end[g-1])), all G entries at once, so nothing syncs with the
host. The tn form reads A_g = a[start:start+K_g] ([K_g, M], M contiguous) and B_g likewise; the nt
form reads the flat blocks A_g [M, K_g] and B_g [N, K_g] stored K-major one after another. FP8
scales are per (gran_k rows, 1 column) inside each group, compact: the K loop steps one scale
block and scales each block's partial product by sa[m]·sb[n] (the shared GEMM tile). A span past
the operands' rows (a layout not checked on the host) is cut at the last row, so no read leaves
the tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import INTERPRET, serialized
from ._launch import autotuned, launch, pick_config
from ._tile import gemm_tile, store_tile

OPS = {("tn", True): "k_grouped_fp8_gemm_tn_contiguous", ("nt", True): "k_grouped_fp8_gemm_nt_contiguous",
       ("tn", False): "k_grouped_bf16_gemm_tn_contiguous"}
#: the K step of the bf16 form (fp8 steps one scale block, gran_k)
BF16_BLOCK_K = 64


@triton.jit
def _group_span(layout_ptr, group, G, ALIGN, GRAN_K, ROWS, SF_ROWS, PSUM: tl.constexpr, G_POW2: tl.constexpr):
    """(first row, K rows, first scale row) of `group`, its K cut to the rows and scale rows there are."""
    j = tl.arange(0, G_POW2)
    values = tl.load(layout_ptr + j, mask=j < G, other=0)
    if PSUM:
        prev = tl.load(layout_ptr + j - 1, mask=(j >= 1) & (j < G), other=0)
        starts = (prev + ALIGN - 1) // ALIGN * ALIGN
        sizes = tl.maximum(values - starts, 0)
    else:
        sizes = values
        starts = tl.cumsum(sizes, axis=0) - sizes
    blocks = (sizes + GRAN_K - 1) // GRAN_K
    start = tl.sum(tl.where(j == group, starts, 0))
    size = tl.sum(tl.where(j == group, sizes, 0))
    sf_row = tl.sum(tl.where(j < group, blocks, 0))
    size = tl.maximum(tl.minimum(tl.minimum(size, ROWS - start), (SF_ROWS - sf_row) * GRAN_K), 0)
    return start, size, sf_row


@triton.jit
def k_grouped_kernel(a_ptr, b_ptr, d_ptr, c_ptr, layout_ptr, sa_ptr, sb_ptr, M, N, G, ALIGN, ROWS, SF_ROWS,
                     stride_a, stride_b, stride_dg, stride_dm, stride_cg, stride_cm, stride_cn,
                     sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k,
                     IS_FP8: tl.constexpr, TN: tl.constexpr, PSUM: tl.constexpr, HAS_C: tl.constexpr,
                     K_MULT16: tl.constexpr, G_POW2: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // tiles_n
    pid_n = tl.program_id(0) % tiles_n
    group = tl.program_id(1)
    start, size, sf_row = _group_span(layout_ptr, group, G, ALIGN, BLOCK_K if IS_FP8 else 1, ROWS,
                                      SF_ROWS if IS_FP8 else ROWS, PSUM, G_POW2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    if TN:  # A_g [K_g, M]: row k of the group at a[start + k], M contiguous (the nt view is MN-major)
        a_g = a_ptr + start.to(tl.int64) * stride_a
        b_g = b_ptr + start.to(tl.int64) * stride_b
        acc = gemm_tile(a_g, b_g, sa_ptr + sf_row * sa_stride_k, sb_ptr + sf_row * sb_stride_k, rm, rn, mask_m,
                        mask_n, size, 1, 1, stride_a, stride_b, sa_stride_mn, sa_stride_k, sb_stride_mn,
                        sb_stride_k, 1, 1, IS_FP8, False, False, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
    else:  # A_g [M, K_g] K-major, stored flat after the previous groups' blocks
        if K_MULT16:  # K_g is a multiple of 16 (the launcher saw ks): rounding tells the compiler, so rows load as vectors
            size = size // 16 * 16
        a_g = a_ptr + start.to(tl.int64) * M
        b_g = b_ptr + start.to(tl.int64) * N
        acc = gemm_tile(a_g, b_g, sa_ptr + sf_row * sa_stride_k, sb_ptr + sf_row * sb_stride_k, rm, rn, mask_m,
                        mask_n, size, size, size, 1, 1, sa_stride_mn, sa_stride_k, sb_stride_mn, sb_stride_k,
                        1, 1, IS_FP8, False, False, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET)
    store_tile(d_ptr + group.to(tl.int64) * stride_dg, c_ptr + group.to(tl.int64) * stride_cg, acc, rm, rn,
               mask_m[:, None] & mask_n[None, :], stride_dm, stride_cm, stride_cn, HAS_C, False, INTERPRET)


#: bf16 tiles; every one compiles without spills on sm90 and sm100
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4),
]
#: fp8 tiles: the per-block promotion (acc += partial·sa·sb) holds a second fp32 tile, and on sm100
#: moves it out of tensor memory every K block; of the tiles above only 64 x 64 compiles without
#: spills for both forms on both archs (gpu-report --all-configs: 128 x 128 spills 56-80 B on sm90
#: and 480-488 B on sm100)
FP8_CONFIGS = [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=4)]
_KEY = ["M", "N", "G", "IS_FP8", "TN", "PSUM", "HAS_C", "K_MULT16", "BLOCK_K"]
_tuned = {False: autotuned(k_grouped_kernel, CONFIGS, key=_KEY), True: autotuned(k_grouped_kernel, FP8_CONFIGS, key=_KEY)}


def _operand(op: str, arg: str, data: torch.Tensor, mn: int, layout: str, dtype: torch.dtype,
             device: torch.device | None) -> int:
    """Checks one operand's data; returns its rows of K."""
    if layout == "tn":
        _checks.tensor(op, arg, data, (dtype,), (None, mn), device)
        _checks.inner_contiguous(op, arg, data)
        return data.shape[0]
    _checks.tensor(op, arg, data, (dtype,), (None,), device)
    _checks.contiguous(op, arg, data)
    if mn == 0:
        return 0  # nothing is read
    if data.numel() % mn:
        _checks.fail(op, arg, f"of {data.numel()} elements", f"a multiple of {mn}",
                     "store every group's [MN, K_g] block whole")
    return data.numel() // mn


def _scale(op: str, arg: str, sf: torch.Tensor, mn: int, layout: str, device: torch.device) -> tuple[int, int, int]:
    """Checks one operand's scales; returns (scale rows, stride along MN, stride along the K blocks)."""
    shape = (None, mn) if layout == "tn" else (mn, None)
    _checks.tensor(op, arg, sf, (torch.float32,), shape, device)
    if layout == "tn":
        return sf.shape[0], sf.stride(1), sf.stride(0)
    return sf.shape[1], sf.stride(0), sf.stride(1)


@serialized
def k_grouped_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                   c: torch.Tensor | None = None, *, layout: str = "tn", sfa: torch.Tensor | None = None,
                   sfb: torch.Tensor | None = None, gran_k: int = 128, use_psum_layout: bool = False,
                   alignment: int = 128, ks: tuple[int, ...] | None = None, config: triton.Config | None = None) -> None:
    """d[g] = c[g] + A_gᵀ·B_g (tn) or A_g·B_gᵀ (nt) for every group, written into d.

    tn: a e4m3/bf16 [sum_K, M], b [sum_K, N] (inner dim contiguous); fp8 scales fp32 [sum_kb, M] /
    [sum_kb, N], any strides. nt (fp8 only): a flat e4m3 [sum_K * M] holding A_g [M, K_g] block after
    block, b likewise with N; scales fp32 [M, sum_kb] / [N, sum_kb], any strides. d fp32 [G, M, N]
    contiguous; c None or fp32 [G, M, N] (any strides, may be d). grouped_layout int32 [G]: the K
    sizes, or with use_psum_layout the cumulative end rows (group g starts at align(end[g-1])).
    gran_k: the scales' K block (fp8), a power of two in 16..256. ks: the K sizes as Python ints when
    known (the non-psum form): all multiples of 16 let the nt form load rows as vectors (a device
    layout that disagrees reads K_g rounded down to 16, never past a row). `config` pins one triton.Config.
    """
    is_fp8 = sfa is not None or sfb is not None
    if layout not in ("tn", "nt") or (layout == "nt" and not is_fp8):
        _checks.fail(OPS[("tn", is_fp8)], "layout", repr(layout), "'tn', or 'nt' with fp8 scales",
                     "pass layout='tn' (bf16 has no nt form)")
    op = OPS[(layout, is_fp8)]
    _checks.tensor(op, "d", d, (torch.float32,), (None, None, None))
    _checks.contiguous(op, "d", d)
    groups, m, n = d.shape
    device = d.device
    if c is not None:
        _checks.tensor(op, "c", c, (torch.float32,), (groups, m, n), device)
    _checks.tensor(op, "grouped_layout", grouped_layout, (torch.int32,), (groups,), device)
    if use_psum_layout and layout == "nt":
        _checks.fail(op, "use_psum_layout", "True", "False (the nt form has no psum layout)",
                     "use the tn form for psum layouts")
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        _checks.fail(op, "alignment", repr(alignment), "a positive int",
                     "use get_mk_alignment_for_contiguous_layout() (128 on NVIDIA)")
    dtype = torch.float8_e4m3fn if is_fp8 else torch.bfloat16
    rows = _operand(op, "a", a, m, layout, dtype, device)
    if _operand(op, "b", b, n, layout, dtype, device) != rows:
        _checks.fail(op, "b", f"{rows} rows of K in a but not in b", "the same sum_K rows as a",
                     "pass A and B over the same K rows")
    if is_fp8:
        if sfa is None or sfb is None:
            _checks.fail(op, "sfb" if sfb is None else "sfa", "None", "fp32 scales (both operands are fp8)",
                         "pass both operands' per-channel scales")
        _checks.block_k(op, "gran_k", gran_k)
        sf_rows, sa_mn, sa_k = _scale(op, "sfa", sfa, m, layout, device)
        sfb_rows, sb_mn, sb_k = _scale(op, "sfb", sfb, n, layout, device)
        if sfb_rows != sf_rows:
            _checks.fail(op, "sfb", f"{sfb_rows} scale rows", f"{sf_rows} like sfa", "quantize A and B per group alike")
    else:
        sfa, sfb, sf_rows, sa_mn, sa_k, sb_mn, sb_k = a, b, 0, 0, 0, 0, 0
    if ks is not None and (not isinstance(ks, (tuple, list)) or len(ks) != groups
                           or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ks)):
        _checks.fail(op, "ks", repr(ks), f"None or {groups} ints >= 0", "pass the K sizes of the groups")
    if d.numel() == 0:
        return
    c_arg = c if c is not None else d
    stride_a, stride_b = (a.stride(0), b.stride(0)) if layout == "tn" else (m, n)
    args = (a, b, d, c_arg, grouped_layout, sfa, sfb, m, n, groups, alignment, rows, sf_rows, stride_a, stride_b,
            d.stride(0), d.stride(1), c_arg.stride(0), c_arg.stride(1), c_arg.stride(2), sa_mn, sa_k, sb_mn, sb_k)
    constants = dict(IS_FP8=is_fp8, TN=layout == "tn", PSUM=use_psum_layout, HAS_C=c is not None,
                     K_MULT16=ks is not None and all(size % 16 == 0 for size in ks),
                     G_POW2=triton.next_power_of_2(groups), BLOCK_K=gran_k if is_fp8 else BF16_BLOCK_K,
                     INTERPRET=INTERPRET)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), groups)

    configs = FP8_CONFIGS if is_fp8 else CONFIGS
    launch(k_grouped_kernel, _tuned[is_fp8], grid, args, constants, config, pick_config(configs, m))
