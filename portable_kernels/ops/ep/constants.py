"""Constants of the expert-parallel ops: the "no expert" marker, accepted dtypes, the FP8 scale
block, DeepEP's low-latency layout-range packing and the calc_diff bounds of the contracts."""

from __future__ import annotations

import torch

from ...layouts.constants import FP8_BLOCK_K

#: the marker of "no expert" in remapped topk_idx and of an unused slot in recv_src_info
NO_EXPERT = -1
TOPK_IDX_DTYPES = (torch.int64, torch.int32)
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WEIGHT_DTYPE = torch.float32
#: FP8 tokens travel with one fp32 scale per this many hidden channels (DeepEP: hidden // 128)
SCALE_BLOCK = FP8_BLOCK_K
#: DeepEP packs each low-latency layout range as (begin << 32) | count in one int64
LAYOUT_RANGE_SHIFT = 32
LAYOUT_RANGE_COUNT_MASK = (1 << LAYOUT_RANGE_SHIFT) - 1
#: calc_diff bound of a combine: fp32 sums in another order, rounded to a 16-bit output
COMBINE_BOUND = 1e-5
#: calc_diff bound of FP8 low-latency rows against the bf16 tokens (the per-token FP8 cast's)
FP8_DISPATCH_BOUND = 1e-3
