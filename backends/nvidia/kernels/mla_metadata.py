"""get_mla_metadata for the nvidia MLA decode kernel: a split-KV schedule over P "parts", computed
on the device with a few vectorized torch ops (no host sync, no Triton needed).

Work line: batch i costs cost_i = ceil(L_i / BLOCK_N) key tiles plus FIXED_OVERHEAD units (its
start-up and final write), laid end to end; part p takes the units [p·W, (p+1)·W) with
W = ceil(total / P). A batch cut by a part boundary is computed by several parts ("splits") whose
partial results the combine kernel merges; a batch inside one part is written directly. L_i is the
sequence length (dense) or topk (sparse). P fills the GPU: SMs // (V_SPLITS · h_kv · query-row tiles).

tile_scheduler_metadata int32 [P, 8], per part:
  0 begin_batch, 1 begin_tile, 2 end_batch (inclusive), 3 end_tile (exclusive, in end_batch),
  4 slot of the begin batch's partial result, 5 begin batch touched, 6 end batch touched, 7 unused
  (batches strictly between are touched whole; a part past the work has begin_batch = b).
num_splits int32 [b + 1]: prefix sums of the splits per batch (FlashMLA's layout); a batch with
one split is written directly, others through partial slots num_splits[i] ... num_splits[i+1]-1.
"""

from __future__ import annotations

import torch

#: KV tokens per key tile of the decode kernel (FlashMLA's page block size)
#: KV tokens per key tile of the decode kernel (16: what fits the registers, docs/nvidia.md)
BLOCK_N = 16
#: query rows (heads of one KV head, one query token) per decode program: the MMA's M, 64 per warp group
BLOCK_H = 128
#: programs sharing one (part, head tile), each owning LATENT / V_SPLITS output channels
V_SPLITS = 4
#: cost units of a batch's start-up and final write, in key tiles (FlashMLA uses 5 of its 64-token blocks)
FIXED_OVERHEAD = 5 * 64 // BLOCK_N
#: fields per part
META_FIELDS = 8
#: "SMs" of the CPU emulation: small, so tests see batches split over several parts (8 with one head tile)
EMULATED_SMS = 8 * V_SPLITS


def num_parts(device: torch.device, num_q_tokens_per_head_k: int, num_heads_k: int) -> int:
    """Parts P: one decode program per (part, V split, KV head, query-row tile) fills the SMs once."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else EMULATED_SMS
    row_tiles = -(-num_q_tokens_per_head_k // BLOCK_H)
    return max(1, sms // (V_SPLITS * num_heads_k * row_tiles))


def mla_schedule(work: torch.Tensor, parts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tile_scheduler_metadata int32 [parts, 8], num_splits int32 [b + 1]) for per-batch work
    lengths `work` (int [b], tokens: the sequence lengths, or topk for sparse decode)."""
    device = work.device
    b = work.shape[0]
    tiles = (work.to(torch.int64).clamp(min=0) + BLOCK_N - 1) // BLOCK_N          # [b]
    cost = tiles + FIXED_OVERHEAD
    end = torch.cumsum(cost, 0)                                                     # inclusive ends
    start = end - cost
    total = end[-1:] if b else torch.zeros(1, dtype=torch.int64, device=device)
    width = (total + parts - 1) // parts                                            # [1]
    p = torch.arange(parts, device=device)
    x = p * width                                                                   # part starts
    y = torch.minimum(x + width, total)                                             # part ends (exclusive)
    live = x < total
    begin = torch.searchsorted(end, x, right=True).clamp(max=max(b - 1, 0))
    last = torch.searchsorted(end, (y - 1).clamp(min=0), right=True).clamp(max=max(b - 1, 0))
    if b:
        begin_tile = (x - start[begin] - FIXED_OVERHEAD).clamp(min=0).minimum(tiles[begin])
        end_tile = (y - start[last] - FIXED_OVERHEAD).clamp(min=0).minimum(tiles[last])
        empty_batch = tiles == 0
        begin_hi = torch.where(begin == last, end_tile, tiles[begin])
        begin_touched = (begin_hi > begin_tile) | (empty_batch[begin] & (x == start[begin]))
        end_touched = (end_tile > 0) | empty_batch[last]
    else:
        begin_tile = end_tile = torch.zeros(parts, dtype=torch.int64, device=device)
        begin_touched = end_touched = torch.zeros(parts, dtype=torch.bool, device=device)
    begin_touched &= live
    end_touched &= live & (last != begin)
    # which parts touch which batch: [parts, b]
    i = torch.arange(b, device=device)
    touch = (live[:, None] & (i[None, :] > begin[:, None]) & (i[None, :] < last[:, None])) \
        | ((i[None, :] == begin[:, None]) & begin_touched[:, None]) \
        | ((i[None, :] == last[:, None]) & end_touched[:, None])
    splits = touch.sum(0)
    num_splits = torch.zeros(b + 1, dtype=torch.int64, device=device)
    num_splits[1:] = torch.cumsum(splits, 0)
    earlier = (torch.cumsum(touch.to(torch.int64), 0) - touch.to(torch.int64))     # parts before p touching i
    rank = earlier.gather(1, begin[:, None]).squeeze(1) if b else begin
    slot = num_splits[begin] + rank
    meta = torch.zeros(parts, META_FIELDS, dtype=torch.int32, device=device)
    meta[:, 0] = torch.where(live, begin, b)
    meta[:, 1] = begin_tile
    meta[:, 2] = torch.where(live, last, b - 1)
    meta[:, 3] = end_tile
    meta[:, 4] = slot
    meta[:, 5] = begin_touched.to(torch.int32)
    meta[:, 6] = end_touched.to(torch.int32)
    return meta, num_splits.to(torch.int32)


def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                     topk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode kernel's schedule: (tile_scheduler_metadata [P, 8], num_splits [b + 1]), on
    cache_seqlens' device. Dense decode splits over sequence tokens, sparse over the topk indices."""
    work = cache_seqlens if topk is None else torch.full_like(cache_seqlens, topk)
    return mla_schedule(work, num_parts(cache_seqlens.device, num_q_tokens_per_head_k, num_heads_k))
