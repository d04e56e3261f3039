"""Block-scale formats for FP8 (and FP4) GEMM operands: NVIDIA SM90, NVIDIA SM100, Ascend 950 (MX).

Every encoder takes the logical plain form — fp32 `[(G,) MN, num_k_blocks]`, row-major, one scale
per (row, K-block) or per (128-row block, K-block) — and returns the chip's native tensor; every
decoder returns that plain form again, bit for bit. Rule: nothing here changes a number. A format
that cannot carry a scale exactly (UE8M0 and a non power of two, a coarser granularity over unequal
scales) raises LayoutConversionError instead.

Worked example used throughout (FORMATS.md): activations with M = 3, K = 512, so four fp32 scales
per row s[m][kb] (kb = 0..3) with exponent bytes e[m][kb]::

    SM90   fp32, 64 bytes (4 floats per K-block column: 3 rows + 1 pad)
           s00 s10 s20 pad | s01 s11 s21 pad | s02 s12 s22 pad | s03 s13 s23 pad
    SM100  int32, 16 bytes (one word per row, bytes little-endian)
           e00 e01 e02 e03 | e10 e11 e12 e13 | e20 e21 e22 e23 | pad pad pad pad
    Ascend int16, 48 bytes (16 blocks of 32 per row, 8 words per row, no pad)
           byte 2*(3p + m) + j = e32[m][2p + j] = e[m][(2p + j) // 4]
"""

from __future__ import annotations

import torch

from ._util import align, as_int_bits, ceil_div, require_dtype, require_ndim, require_positive_int
from .constants import (
    ASCEND_BLOCKS_PER_WORD,
    FP8_BLOCK_K,
    FP8_BLOCK_MN,
    FP8_E4M3_MAX,
    MX_BLOCK_K,
    SCALE_AMAX_FLOOR,
    SM100_BLOCKS_PER_WORD,
    TMA_ALIGN_BYTES,
)
from .errors import LayoutConversionError
from .ue8m0 import ceil_to_ue8m0, checked_exponents_int32, ue8m0_exponents, ue8m0_to_fp32

__all__ = [
    "fp8_scale_from_amax",
    "tma_aligned_mn",
    "sm90_sfa_encode",
    "sm90_sfa_decode",
    "is_sm90_sfa_layout",
    "sm90_sfb_encode",
    "sm90_sfb_decode",
    "broadcast_block_scales_to_rows",
    "sm100_ue8m0_encode",
    "sm100_ue8m0_encode_from_blocks",
    "sm100_ue8m0_decode",
    "is_sm100_ue8m0_layout",
    "regranularize_k",
    "ascend_mx_encode",
    "ascend_mx_encode_from_blocks",
    "ascend_mx_decode",
    "ascend_mx_byte_view",
    "is_ascend_mx_layout",
    "ascend_mx_kmajor_encode",
    "ascend_mx_kmajor_encode_from_blocks",
    "ascend_mx_kmajor_decode",
    "ue8m0_words_to_fp32",
]

_SCALES_DOC = "fp32 [MN, num_k_blocks] or [G, MN, num_k_blocks]"
_FP32_FIX = "scales are fp32 (convert bf16/fp16 scales with .float(), which is exact)"


def fp8_scale_from_amax(amax: torch.Tensor, use_ue8m0: bool = False) -> torch.Tensor:
    """Per-block FP8 scale from the block's max |x|: `sf = max(amax, 1e-4) / 448`, data is `q = x / sf`.

    With `use_ue8m0=True` the scale is then rounded up to a power of two (`ceil_to_ue8m0`), which
    the SM100 and Ascend MX layouts require; rounding up keeps |x / sf| <= 448. Examples:
    amax 448 -> 1.0; amax 0 -> 1e-4 / 448 (UE8M0: 2^-22); amax 500 -> 1.116 (UE8M0: 2.0).
    """
    require_dtype("amax", amax, (torch.float32,), "compute amax in fp32")
    sf = amax.clamp_min(SCALE_AMAX_FLOOR) / FP8_E4M3_MAX
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def tma_aligned_mn(mn: int, element_size: int = 4) -> int:
    """MN rounded up so one MN-major column is a multiple of 16 bytes: align(MN, 4) for 4-byte elements."""
    return align(mn, TMA_ALIGN_BYTES // element_size)


def _as_grouped(name: str, sf: torch.Tensor, dtypes: tuple[torch.dtype, ...], fix: str) -> tuple[torch.Tensor, bool]:
    """Return (sf as [G, MN, KB], whether the caller passed a group dim)."""
    require_dtype(name, sf, dtypes, fix)
    require_ndim(name, sf, (2, 3), _SCALES_DOC)
    grouped = sf.dim() == 3
    return (sf if grouped else sf.unsqueeze(0)), grouped


def _mn_major_words(
    e: torch.Tensor, per_word: int, word_dtype: torch.dtype, mn: int, mn_stride: int, row_block: int = 1
) -> torch.Tensor:
    """Pack exponents e (int32 or uint8) [G, R, KB] into words [G, mn, ceil(KB/per_word)], MN-major.

    Row n of the result uses e[:, n // row_block] (row_block = 1: one exponent row per row), so
    block scales are broadcast while packing. Word (n, p) of group g holds e[g, n // row_block,
    per_word*p + j] in byte j (little-endian) and lives at element g*mn_stride*P + p*mn_stride + n.
    Pad rows (n >= mn) and missing trailing blocks are 0.
    """
    g, rows, kb = e.shape
    words = ceil_div(kb, per_word)
    if words == 0 or rows == 0:  # nothing to pack (K = 0 or no rows): zero storage of the right shape
        return torch.zeros((g, words, mn_stride), dtype=word_dtype, device=e.device)[:, :, :mn].transpose(1, 2)
    # Row-major words first: narrowing to bytes and padding K to whole words in one copy.
    row_bytes = torch.empty((g, rows, words * per_word), dtype=torch.uint8, device=e.device)
    row_bytes[:, :, :kb].copy_(e)
    row_bytes[:, :, kb:].zero_()
    by_word = row_bytes.view(word_dtype).transpose(1, 2)  # [G, words, R]
    # Then one transposing (and, for block scales, broadcasting) copy into the MN-major storage.
    storage = torch.empty((g, words, mn_stride), dtype=word_dtype, device=e.device)
    storage[:, :, mn:].zero_()
    full, rest = divmod(mn, row_block)
    if full:
        dst = storage[:, :, : full * row_block].unflatten(-1, (full, row_block))
        dst.copy_(by_word[:, :, :full, None].expand(g, words, full, row_block))
    if rest:
        storage[:, :, full * row_block : mn].copy_(by_word[:, :, full : full + 1].expand(g, words, rest))
    return storage[:, :, :mn].transpose(1, 2)


def _mn_major_exponents(
    name: str, packed: torch.Tensor, word_dtype: torch.dtype, per_word: int, num_k_blocks: int
) -> torch.Tensor:
    """Inverse of `_mn_major_words`: fp32 scales [(G,) MN, num_k_blocks] from packed words of any strides."""
    p, grouped = _as_grouped(name, packed, (word_dtype,), f"pass the {word_dtype} tensor returned by the encoder")
    if isinstance(num_k_blocks, bool) or not isinstance(num_k_blocks, int) or num_k_blocks < 0:
        raise LayoutConversionError(f"num_k_blocks must be an int >= 0, got {num_k_blocks!r}")
    g, mn, words = p.shape
    if words != ceil_div(num_k_blocks, per_word):
        raise LayoutConversionError(
            f"{name} has {words} words per row but num_k_blocks={num_k_blocks} needs "
            f"ceil({num_k_blocks}/{per_word}) = {ceil_div(num_k_blocks, per_word)}; "
            "pass the K-block count used to encode"
        )
    if words == 0 or mn == 0:
        sf = torch.empty((g, mn, num_k_blocks), dtype=torch.float32, device=p.device)
        return sf if grouped else sf[0]
    byte_rows = p.transpose(1, 2).contiguous().view(torch.uint8).view(g, words, mn, per_word)
    e = byte_rows.permute(0, 2, 1, 3).reshape(g, mn, words * per_word)
    if bool(e[:, :, num_k_blocks:].any()):
        raise LayoutConversionError(
            f"{name} holds non-zero exponents beyond num_k_blocks={num_k_blocks}; pass the K-block count used to encode"
        )
    sf = ue8m0_to_fp32(e[:, :, :num_k_blocks].contiguous())
    return sf if grouped else sf[0]


def _has_strides(t: torch.Tensor, expected: tuple[int, ...]) -> bool:
    """Strides match where they matter (dims of size 1 may carry any stride; an empty tensor any)."""
    if t.numel() == 0:
        return True
    return all(size == 1 or stride == want for size, stride, want in zip(t.shape, t.stride(), expected))


# ---------------------------------------------------------------------------------------------
# NVIDIA SM90 (Hopper)
# ---------------------------------------------------------------------------------------------


def sm90_sfa_encode(sf: torch.Tensor) -> torch.Tensor:
    """SM90 activation scales (SFA): fp32, MN-major, TMA-aligned.

    Input fp32 `[(G,) MN, sf_k]` (sf_k = ceil(K/128)). Output has the same logical shape and values,
    stored with strides (1, tma_mn), tma_mn = align(MN, 4) (16 bytes of 4-byte floats), so scale
    (m, kb) sits at float `kb*tma_mn + m`; grouped: stride(-3) = tma_mn*sf_k. Pad slots (rows MN..tma_mn)
    are written as 0 (the hardware ignores them; zero keeps the bytes deterministic).

    Worked example M = 3, K = 512 (sf_k = 4, tma_mn = 4), storage of 64 bytes, one cell = 4 bytes::

        float  0    1    2    3  | 4    5    6    7  | 8    9    10   11 | 12   13   14   15
               s00  s10  s20  0  | s01  s11  s21  0  | s02  s12  s22  0  | s03  s13  s23  0
    """
    s, grouped = _as_grouped("sf", sf, (torch.float32,), _FP32_FIX)
    g, mn, kb = s.shape
    tma_mn = tma_aligned_mn(mn)
    storage = torch.empty((g, kb, tma_mn), dtype=torch.float32, device=s.device)
    storage[:, :, mn:].zero_()
    storage[:, :, :mn].copy_(s.transpose(1, 2))
    out = storage[:, :, :mn].transpose(1, 2)
    return out if grouped else out[0]


def sm90_sfa_decode(t: torch.Tensor) -> torch.Tensor:
    """Plain contiguous fp32 `[(G,) MN, sf_k]` (a fresh tensor) from SM90 SFA of any strides."""
    require_dtype("t", t, (torch.float32,), "pass the fp32 tensor returned by sm90_sfa_encode")
    require_ndim("t", t, (2, 3), _SCALES_DOC)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def is_sm90_sfa_layout(t: torch.Tensor) -> bool:
    """True when `t` is fp32 `[(G,) MN, sf_k]` with strides (tma_mn*sf_k,) 1, tma_mn — what SM90 kernels read."""
    if t.dtype != torch.float32 or t.dim() not in (2, 3):
        return False
    mn, kb = t.shape[-2:]
    tma_mn = tma_aligned_mn(mn)
    return _has_strides(t, ((tma_mn * kb,) if t.dim() == 3 else ()) + (1, tma_mn))


def sm90_sfb_encode(sf: torch.Tensor) -> torch.Tensor:
    """SM90 weight scales (SFB, 128x128 blocks): fp32 `[(G,) ceil(N/128), ceil(K/128)]` contiguous, as is.

    K-major (row-major) with no padding; returns a fresh contiguous copy. Example N = 256, K = 384:
    6 floats `b00 b01 b02 | b10 b11 b12` (row = 128-row block of N, column = 128-block of K).
    """
    require_dtype("sf", sf, (torch.float32,), _FP32_FIX)
    require_ndim("sf", sf, (2, 3), "fp32 [ceil(N/128), ceil(K/128)] or [G, ceil(N/128), ceil(K/128)]")
    return torch.empty(sf.shape, dtype=sf.dtype, device=sf.device).copy_(sf)


def sm90_sfb_decode(t: torch.Tensor) -> torch.Tensor:
    """Plain contiguous fp32 copy of SM90 SFB (the format is the plain form)."""
    return sm90_sfb_encode(t)


def _check_block_rows(sf: torch.Tensor, mn: int, block_mn: int) -> None:
    require_positive_int("block_mn", block_mn)
    if isinstance(mn, bool) or not isinstance(mn, int) or mn < 0:
        raise LayoutConversionError(f"mn must be an int >= 0, got {mn!r}")
    if sf.shape[-2] != ceil_div(mn, block_mn):
        raise LayoutConversionError(
            f"sf has {sf.shape[-2]} block rows but mn={mn} with block_mn={block_mn} needs {ceil_div(mn, block_mn)}"
        )


def broadcast_block_scales_to_rows(sf: torch.Tensor, mn: int, block_mn: int = FP8_BLOCK_MN) -> torch.Tensor:
    """Per-row scales from per-(block_mn x K-block) scales: `[(G,) ceil(MN/block), kb] -> [(G,) MN, kb]`.

    Row n takes block n // block_mn (SM100 and Ascend carry one scale per row). Exact for any dtype.
    Example MN = 130, block 128: rows 0..127 take block row 0, rows 128 and 129 take block row 1.
    """
    require_ndim("sf", sf, (2, 3), "[ceil(MN/block), num_k_blocks] or [G, ceil(MN/block), num_k_blocks]")
    _check_block_rows(sf, mn, block_mn)
    rows = torch.arange(mn, device=sf.device) // block_mn
    return sf.index_select(-2, rows)


# ---------------------------------------------------------------------------------------------
# NVIDIA SM100 (Blackwell)
# ---------------------------------------------------------------------------------------------


def sm100_ue8m0_encode(sf: torch.Tensor) -> torch.Tensor:
    """SM100 scales: UE8M0 exponents packed four K-blocks per int32, MN-major, TMA-aligned.

    Input per-row power-of-two fp32 `[(G,) MN, sf_k]` (broadcast 128x128 weight scales first with
    `broadcast_block_scales_to_rows`). Output int32 logical `[(G,) MN, ceil(sf_k/4)]` with strides
    (1, align(MN, 4)); grouped stride(-3) = align(MN, 4)*ceil(sf_k/4). Word (m, p) is
    `e[4p] | e[4p+1] << 8 | e[4p+2] << 16 | e[4p+3] << 24` (little-endian bytes); missing trailing
    blocks and pad rows are 0. Raises LayoutConversionError unless every scale is a power of two.

    Worked example M = 3, K = 512 (four exponents per row -> one word per row), 16 bytes::

        byte  0    1    2    3  | 4    5    6    7  | 8    9    10   11 | 12 13 14 15
              e00  e01  e02  e03| e10  e11  e12  e13| e20  e21  e22  e23| 0  0  0  0
              word m=0          | word m=1          | word m=2          | pad row
    """
    s, grouped = _as_grouped("sf", sf, (torch.float32,), _FP32_FIX)
    mn = s.shape[1]
    out = _mn_major_words(checked_exponents_int32(s), SM100_BLOCKS_PER_WORD, torch.int32, mn, tma_aligned_mn(mn))
    return out if grouped else out[0]


def sm100_ue8m0_encode_from_blocks(sf: torch.Tensor, mn: int, block_mn: int = FP8_BLOCK_MN) -> torch.Tensor:
    """SM100 scales straight from (block_mn x 128) block scales `[(G,) ceil(MN/block_mn), sf_k]`.

    Same result as `sm100_ue8m0_encode(broadcast_block_scales_to_rows(sf, mn, block_mn))`, but the
    power-of-two check and packing run on the small block tensor and the broadcast happens in the
    final copy (the weight path at ingest).
    """
    s, grouped = _as_grouped("sf", sf, (torch.float32,), _FP32_FIX)
    _check_block_rows(s, mn, block_mn)
    e = checked_exponents_int32(s)
    out = _mn_major_words(e, SM100_BLOCKS_PER_WORD, torch.int32, mn, tma_aligned_mn(mn), block_mn)
    return out if grouped else out[0]


def sm100_ue8m0_decode(packed: torch.Tensor, num_k_blocks: int) -> torch.Tensor:
    """fp32 `[(G,) MN, num_k_blocks]` from SM100 packed int32 `[(G,) MN, ceil(num_k_blocks/4)]` (any strides).

    Raises LayoutConversionError if the word count does not match num_k_blocks or a byte past
    num_k_blocks is non-zero (a sign that num_k_blocks is wrong).
    """
    return _mn_major_exponents("packed", packed, torch.int32, SM100_BLOCKS_PER_WORD, num_k_blocks)


def is_sm100_ue8m0_layout(t: torch.Tensor) -> bool:
    """True when `t` is int32 `[(G,) MN, W]` with strides (align(MN,4)*W,) 1, align(MN, 4)."""
    if t.dtype != torch.int32 or t.dim() not in (2, 3):
        return False
    mn, words = t.shape[-2:]
    tma_mn = tma_aligned_mn(mn)
    return _has_strides(t, ((tma_mn * words,) if t.dim() == 3 else ()) + (1, tma_mn))


def regranularize_k(sf: torch.Tensor, k: int, from_gran: int, to_gran: int) -> torch.Tensor:
    """Change the K granularity of per-row scales `[(G,) MN, ceil(K/from_gran)] -> [(G,) MN, ceil(K/to_gran)]`.

    - Finer (to_gran divides from_gran), always exact: block j of the result takes block
      `j*to_gran // from_gran`. 128 -> 32 on K = 512: e32[m][j] = e128[m][j // 4], 16 blocks.
      With K = 200: ceil(200/128) = 2 blocks -> ceil(200/32) = 7 blocks [b0 b0 b0 b0 b1 b1 b1].
    - Coarser (from_gran divides to_gran): only if the merged blocks are bit-identical (a trailing
      partial group merges the blocks it has); otherwise LayoutConversionError, since picking one
      scale for unequal blocks would change the numbers.
    - Neither divides the other: LayoutConversionError.

    Works on any dtype (fp32 scales or uint8 exponents).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise LayoutConversionError(f"k must be an int >= 0, got {k!r}")
    for name, v in (("from_gran", from_gran), ("to_gran", to_gran)):
        require_positive_int(name, v)
    require_ndim("sf", sf, (2, 3), "[MN, ceil(K/from_gran)] or [G, MN, ceil(K/from_gran)]")
    n_in, n_out = ceil_div(k, from_gran), ceil_div(k, to_gran)
    if sf.shape[-1] != n_in:
        raise LayoutConversionError(
            f"sf has {sf.shape[-1]} K-blocks but k={k} with granularity {from_gran} "
            f"needs ceil({k}/{from_gran}) = {n_in}"
        )
    if from_gran % to_gran == 0:
        src = torch.arange(n_out, device=sf.device) * to_gran // from_gran
        return sf.index_select(-1, src)
    if to_gran % from_gran == 0:
        ratio = to_gran // from_gran
        leader = torch.arange(n_in, device=sf.device) // ratio * ratio
        bits = as_int_bits(sf) if sf.is_floating_point() else sf
        if not bool((bits == bits.index_select(-1, leader)).all()):
            raise LayoutConversionError(
                f"cannot coarsen scales from K granularity {from_gran} to {to_gran}: the {ratio} blocks merged "
                f"into one differ; requantize the data at granularity {to_gran} instead"
            )
        return sf.index_select(-1, torch.arange(n_out, device=sf.device) * ratio)
    raise LayoutConversionError(
        f"K granularity {from_gran} -> {to_gran}: one must divide the other; requantize at granularity {to_gran}"
    )


# ---------------------------------------------------------------------------------------------
# Ascend 950 (MX)
# ---------------------------------------------------------------------------------------------


def ascend_mx_encode(sf32: torch.Tensor) -> torch.Tensor:
    """Ascend MX scales: UE8M0 exponents two K-blocks per int16, MN-major, no padding.

    Input per-(1, 32) power-of-two fp32 `[(G,) MN, ceil(K/32)]` (from (1,128) scales use
    `regranularize_k(sf, K, 128, 32)`, exact: e32[m][k] = e128[m][k // 4]; weights are broadcast
    along N first). Output int16 logical `[(G,) MN, ceil(K/64)]`, stride(-2) = 1, stride(-1) = MN,
    grouped stride(-3) = MN*ceil(K/64): word (m, p) lives at element p*MN + m and is
    `e[2p] | e[2p+1] << 8` (even block in the low byte); an odd trailing block pairs with 0.
    Raises LayoutConversionError unless every scale is a power of two.

    As bytes this is `[ceil(K/64), MN, 2]` float8_e8m0fnu (`ascend_mx_byte_view`): CANN's MX quant
    matmul (aclnnQuantMatmulV5) takes this form only for MN-major data (x2 stored `(k, n)`, x1 stored
    `(k, m)`), since each scale tensor must share its data's transposition. K-major data (A [M, K],
    B [N, K]) takes `ascend_mx_kmajor_encode` instead.

    Worked example M = 3, K = 512 (16 blocks of 32 per row, 8 words per row), 48 bytes; byte
    `2*(3p + m) + j` holds e32[m][2p + j] = e[m][(2p + j) // 4]::

        byte   0   1   2   3   4   5 | 6   7   8   9   10  11 | 12  13  14  15  16  17 | ...
        word   (p0,m0) (p0,m1) (p0,m2) | (p1,m0) (p1,m1) (p1,m2) | (p2,m0) (p2,m1) (p2,m2) |
               e00 e00 e10 e10 e20 e20 | e00 e00 e10 e10 e20 e20 | e01 e01 e11 e11 e21 e21 |
        p = 3: e01.., p = 4, 5: e02 .., p = 6, 7: e03 ..
    """
    s, grouped = _as_grouped("sf32", sf32, (torch.float32,), _FP32_FIX)
    mn = s.shape[1]
    out = _mn_major_words(checked_exponents_int32(s), ASCEND_BLOCKS_PER_WORD, torch.int16, mn, mn)
    return out if grouped else out[0]


def ascend_mx_encode_from_blocks(
    sf: torch.Tensor, mn: int, k: int, block_mn: int = FP8_BLOCK_MN, block_k: int = FP8_BLOCK_K
) -> torch.Tensor:
    """Ascend MX scales straight from power-of-two block scales `[(G,) ceil(MN/block_mn), ceil(K/block_k)]`.

    Same result as `ascend_mx_encode(regranularize_k(broadcast_block_scales_to_rows(sf, mn, block_mn),
    k, block_k, 32))`; block_k must be a multiple of 32. Use block_mn = 1 for (1, 128) activation
    scales. The check, K refinement and packing run on the small block tensor.
    """
    s, grouped = _as_grouped("sf", sf, (torch.float32,), _FP32_FIX)
    _check_block_rows(s, mn, block_mn)
    e32 = regranularize_k(checked_exponents_int32(s), k, block_k, MX_BLOCK_K)
    out = _mn_major_words(e32, ASCEND_BLOCKS_PER_WORD, torch.int16, mn, mn, block_mn)
    return out if grouped else out[0]


def ascend_mx_decode(packed: torch.Tensor, num_k_blocks: int) -> torch.Tensor:
    """fp32 `[(G,) MN, num_k_blocks]` (blocks of 32) from Ascend packed int16 `[(G,) MN, ceil(num_k_blocks/2)]`."""
    return _mn_major_exponents("packed", packed, torch.int16, ASCEND_BLOCKS_PER_WORD, num_k_blocks)


def is_ascend_mx_layout(t: torch.Tensor) -> bool:
    """True when `t` is int16 `[(G,) MN, W]` with strides (MN*W,) 1, MN (no padding)."""
    if t.dtype != torch.int16 or t.dim() not in (2, 3):
        return False
    mn, words = t.shape[-2:]
    return _has_strides(t, ((mn * words,) if t.dim() == 3 else ()) + (1, mn))


def ascend_mx_byte_view(packed: torch.Tensor) -> torch.Tensor:
    """The same storage as float8_e8m0fnu `[(G,) ceil(K/64), MN, 2]` — a view, no copy.

    Element [p, m, j] is the exponent of K-block 2p + j of row m: the tensor CANN's MX quant matmul
    takes for an MN-major operand. `packed` must have the `ascend_mx_encode` strides.
    """
    require_dtype("packed", packed, (torch.int16,), "pass the int16 tensor returned by ascend_mx_encode")
    require_ndim("packed", packed, (2, 3), "int16 [MN, ceil(K/64)] or [G, MN, ceil(K/64)]")
    if not is_ascend_mx_layout(packed):
        raise LayoutConversionError(
            f"packed has strides {packed.stride()} for shape {tuple(packed.shape)}, not the Ascend MX layout "
            "(stride(-2) = 1, stride(-1) = MN); pass the tensor returned by ascend_mx_encode"
        )
    words_mn = packed.transpose(-1, -2)  # [(G,) P, MN], contiguous
    as_bytes = words_mn.view(torch.uint8)  # [(G,) P, 2*MN]
    return as_bytes.view(*words_mn.shape, ASCEND_BLOCKS_PER_WORD).view(torch.float8_e8m0fnu)


def ascend_mx_kmajor_encode(sf32: torch.Tensor) -> torch.Tensor:
    """Ascend MX scales for a K-major operand: float8_e8m0fnu `[(G,) MN, ceil(K/64), 2]`, contiguous.

    Byte [m, p, j] is the exponent of K-block 2p + j of row m; an odd trailing block pairs with 0.
    This is CANN's MX scale for K-major data (aclnnQuantMatmulV5, MX table): x1 `(m, k)` takes
    `(m, ceil(k/64), 2)`, a weight stored `(n, k)` (x2 transposed) takes `(n, ceil(k/64), 2)`, handed
    to torch_npu as its transposed view `(ceil(k/64), n, 2)`; `npu_dynamic_mx_quant(x, axis=-1)`
    returns the same form. Raises LayoutConversionError unless every scale is a power of two.

    For M = 3, K = 512 (scales e[m][kb] per 128, so each repeats for four blocks of 32), 48 bytes::

        byte  0   1   2   3   4   5   6   7   8 .. 11  12 .. 15 | 16 .. 31         | 32 .. 47
              e00 e00 e00 e00 e01 e01 e01 e01 e02 x4   e03 x4   | row 1: e10 .. e13 | row 2: e20 .. e23
              (pair 0)(pair 1)(pair 2)(pair 3) ...                (4 bytes per 128-block)

    K = 96 (three blocks of 32, e.g. exponents a b c for one row): bytes `a b | c 00`.
    """
    s, grouped = _as_grouped("sf32", sf32, (torch.float32,), _FP32_FIX)
    e = ue8m0_exponents(s)
    g, mn, kb = e.shape
    words = ceil_div(kb, ASCEND_BLOCKS_PER_WORD)
    out = torch.empty((g, mn, words * ASCEND_BLOCKS_PER_WORD), dtype=torch.uint8, device=e.device)
    out[:, :, :kb].copy_(e)
    out[:, :, kb:].zero_()
    out = out.view(g, mn, words, ASCEND_BLOCKS_PER_WORD).view(torch.float8_e8m0fnu)
    return out if grouped else out[0]


def ascend_mx_kmajor_encode_from_blocks(
    sf: torch.Tensor, mn: int, k: int, block_mn: int = FP8_BLOCK_MN, block_k: int = FP8_BLOCK_K
) -> torch.Tensor:
    """K-major Ascend MX scales straight from power-of-two block scales `[(G,) ceil(MN/block_mn), ceil(K/block_k)]`.

    Same bytes as `ascend_mx_kmajor_encode(regranularize_k(broadcast_block_scales_to_rows(sf, mn,
    block_mn), k, block_k, 32))`; block_k must be a multiple of 32 (exact refinement). Use
    block_mn = 1 for (1, 128) activation scales. Example: a weight N = 3, K = 128 with block scales
    per (2, 64) `[[a, b], [c, d]]` (exponent bytes) gives rows 0 and 1 = `a a b b`, row 2 = `c c d d`.
    """
    s, grouped = _as_grouped("sf", sf, (torch.float32,), _FP32_FIX)
    _check_block_rows(s, mn, block_mn)
    e32 = regranularize_k(checked_exponents_int32(s), k, block_k, MX_BLOCK_K)  # [G, rows, ceil(K/32)]
    rows = torch.arange(mn, device=s.device) // block_mn
    e = e32.index_select(1, rows)
    g, _, kb = e.shape
    words = ceil_div(kb, ASCEND_BLOCKS_PER_WORD)
    out = torch.zeros((g, mn, words * ASCEND_BLOCKS_PER_WORD), dtype=torch.uint8, device=s.device)
    out[:, :, :kb].copy_(e)
    out = out.view(g, mn, words, ASCEND_BLOCKS_PER_WORD).view(torch.float8_e8m0fnu)
    return out if grouped else out[0]


def ascend_mx_kmajor_decode(t: torch.Tensor, num_k_blocks: int) -> torch.Tensor:
    """fp32 `[(G,) MN, num_k_blocks]` from `ascend_mx_kmajor_encode`'s `[(G,) MN, ceil(K/64), 2]` e8m0 bytes."""
    require_dtype("t", t, (torch.float8_e8m0fnu,), "pass the tensor returned by ascend_mx_kmajor_encode")
    require_ndim("t", t, (3, 4), "float8_e8m0fnu [MN, ceil(K/64), 2] or [G, MN, ceil(K/64), 2]")
    if t.shape[-1] != ASCEND_BLOCKS_PER_WORD or t.shape[-2] != ceil_div(num_k_blocks, ASCEND_BLOCKS_PER_WORD):
        raise LayoutConversionError(
            f"t has shape {tuple(t.shape)} but num_k_blocks={num_k_blocks} needs [..., {ceil_div(num_k_blocks, 2)}, 2]"
        )
    e = t.contiguous().view(torch.uint8).flatten(-2)
    if bool(e[..., num_k_blocks:].any()):
        raise LayoutConversionError(
            f"t holds non-zero exponents beyond num_k_blocks={num_k_blocks}; pass the K-block count used to encode"
        )
    return ue8m0_to_fp32(e[..., :num_k_blocks].contiguous())


def ue8m0_words_to_fp32(words: torch.Tensor, num_k_blocks: int) -> torch.Tensor:
    """fp32 `[(G,) MN, num_k_blocks]` from UE8M0 exponents packed four per int32 `[(G,) MN, W]`,
    W = ceil(num_k_blocks / 4), in ANY strides: DeepGEMM's packed scale tensors, whether MN-major and
    TMA-aligned (its layout utilities, the SM100 bytes) or K-major (its casts' `use_packed_ue8m0`).

    Byte j of word p (little-endian) is the exponent of K-block 4p + j; bytes past num_k_blocks are
    padding and ignored (DeepGEMM fills them with 0, or with 127 = 1.0 in its FP4 cast). Exact:
    exponent e gives 2^(e - 127). Example: word 0x00407F7E, num_k_blocks 3 -> [0.5, 1.0, 2^-63].
    """
    require_dtype("words", words, (torch.int32,), "pass the int32 packed scale tensor")
    require_ndim("words", words, (2, 3), "int32 [MN, W] or [G, MN, W]")
    if isinstance(num_k_blocks, bool) or not isinstance(num_k_blocks, int) or num_k_blocks < 0:
        raise LayoutConversionError(f"num_k_blocks must be an int >= 0, got {num_k_blocks!r}")
    if words.shape[-1] != ceil_div(num_k_blocks, SM100_BLOCKS_PER_WORD):
        raise LayoutConversionError(
            f"words has {words.shape[-1]} int32 per row but num_k_blocks={num_k_blocks} needs "
            f"ceil({num_k_blocks}/{SM100_BLOCKS_PER_WORD}) = {ceil_div(num_k_blocks, SM100_BLOCKS_PER_WORD)}"
        )
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=words.device)
    exponents = ((words.unsqueeze(-1) >> shifts) & 0xFF).flatten(-2)[..., :num_k_blocks]
    return ue8m0_to_fp32(exponents.to(torch.uint8).contiguous())
