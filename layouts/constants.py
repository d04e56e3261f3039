"""Numbers that define the byte formats, named once.

Every other module in this package imports its constants from here, so a value stated in
FORMATS.md appears in exactly one place.
"""

from __future__ import annotations

__all__ = [
    "TMA_ALIGN_BYTES",
    "FP8_E4M3_MAX",
    "FP4_E2M1_MAX",
    "SCALE_AMAX_FLOOR",
    "FP8_BLOCK_K",
    "FP8_BLOCK_MN",
    "MX_BLOCK_K",
    "SM100_BLOCKS_PER_WORD",
    "ASCEND_BLOCKS_PER_WORD",
    "NVIDIA_MOE_ALIGNMENT",
    "ASCEND_MOE_ALIGNMENT",
    "NZ_FRACTAL_ROWS",
    "NZ_FRACTAL_BYTES",
    "ACL_FORMAT_ND",
    "ACL_FORMAT_FRACTAL_NZ",
    "KV_LATENT_DIM",
    "KV_ROPE_DIM",
    "KV_HEAD_DIM",
    "KV_SCALE_TILE",
    "KV_NUM_SCALES",
    "KV_SCALES_OFFSET",
    "KV_ROPE_OFFSET",
    "KV_FP8_BYTES_PER_TOKEN",
    "KV_PAGE_BLOCK_SIZE",
    "ASCEND_KV_ROPE_OFFSET",
    "ASCEND_KV_SCALES_OFFSET",
]

# TMA (Tensor Memory Accelerator) needs every MN-major column of scales to start on 16 bytes.
TMA_ALIGN_BYTES = 16

# Largest finite float8_e4m3fn value (same bytes on NVIDIA and Ascend).
FP8_E4M3_MAX = 448.0
# Largest E2M1 (FP4) magnitude.
FP4_E2M1_MAX = 6.0
# Block quantizers clamp amax to at least this before dividing, so an all-zero block gets a
# finite, non-zero scale.
SCALE_AMAX_FLOOR = 1e-4

# DeepGEMM FP8 recipe (1, 128, 128): activations per (1, 128), weights per (128, 128).
FP8_BLOCK_K = 128
FP8_BLOCK_MN = 128
# MX (Ascend 950, and FP4 scales) granularity along K.
MX_BLOCK_K = 32

# UE8M0 exponents per packed word.
SM100_BLOCKS_PER_WORD = 4  # int32
ASCEND_BLOCKS_PER_WORD = 2  # int16

# MoE contiguous layout: every expert segment is padded up to this many rows.
NVIDIA_MOE_ALIGNMENT = 128
ASCEND_MOE_ALIGNMENT = 256

# Ascend FRACTAL_NZ: tiles of 16 rows x 32 bytes.
NZ_FRACTAL_ROWS = 16
NZ_FRACTAL_BYTES = 32
# torch_npu format ids (npu_format_cast).
ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29

# FlashMLA V3.2 FP8 KV cache, one token = 656 bytes.
KV_LATENT_DIM = 512
KV_ROPE_DIM = 64
KV_HEAD_DIM = KV_LATENT_DIM + KV_ROPE_DIM  # 576
KV_SCALE_TILE = 128
KV_NUM_SCALES = KV_LATENT_DIM // KV_SCALE_TILE  # 4
KV_SCALES_OFFSET = KV_LATENT_DIM  # 512: fp8 latent bytes come first
KV_ROPE_OFFSET = KV_SCALES_OFFSET + 4 * KV_NUM_SCALES  # 528
KV_FP8_BYTES_PER_TOKEN = KV_ROPE_OFFSET + 2 * KV_ROPE_DIM  # 656
KV_PAGE_BLOCK_SIZE = 64
# CANN's npu_kv_quant_sparse_flash_attention orders the same 656 bytes [nope | rope | scales]
# ("KV_D = nope + rope*2 + dequant_scale*4 = 512 + 64*2 + 4*4").
ASCEND_KV_ROPE_OFFSET = KV_LATENT_DIM  # 512
ASCEND_KV_SCALES_OFFSET = ASCEND_KV_ROPE_OFFSET + 2 * KV_ROPE_DIM  # 640
