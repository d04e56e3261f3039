"""The shapes the indexer-logits kernels (mqa_logits.py, paged_mqa_logits.py) take, kept apart
from them so that the providers can decline a call without importing Triton."""

from __future__ import annotations

#: head dims: powers of two (the dot's K), 32 the smallest K of an FP8 tl.dot
HEAD_DIMS = (32, 64, 128, 256)
#: heads, padded to a power of two, go into the dot's M tile with the query rows
MAX_HEADS = 128
#: rows of one sequence (MTP draft tokens + 1) the paged kernel unrolls, at most
MAX_NEXT_N = 8
