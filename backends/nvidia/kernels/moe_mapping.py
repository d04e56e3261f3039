"""get_fused_mapping (TileKernels' name) in Triton: the expert-major fused layout of (token, slot)
pairs, bit for bit the contract's reference (rows of one expert in (token, slot) order).

Positions must come out in one fixed order, so there are no atomics; three launches, each a pass:
1. count: the flat (token, slot) entries are cut into CHUNK-entry chunks; program c writes chunk
   c's per-expert counts into a scratch [C, E]. The programs after the chunk programs fill the
   three row arrays with -1 (padding, and the rows past the last segment).
2. scan (a program per SCAN_E_BLOCK experts): per expert, the exclusive prefix of the chunk counts
   over the chunks, in place in the scratch ("entries of expert e in chunks before c"), and the
   aligned total (num_tokens_per_expert).
3. place: program c sums the aligned totals of the experts before each of its entries' expert
   (the segment start; program 0 also writes expert_start / expert_end), gives each valid entry
   the row start[e] + prefix[c, e] + (entries of e earlier in the chunk, a pairwise count), and
   scatters token, slot and expert to that row.
Entries outside [0, E) are padding (-1): the public op rejects ids >= E where it reads values;
with force_no_sync they are skipped, and a row past P is never written (memory-safe either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _checks
from ._common import serialized

OP = "get_fused_mapping"
#: flat (token, slot) entries per chunk: the place pass compares every pair of a chunk
CHUNK = 64
#: experts per tile in the count and place passes; experts x chunks per tile (and program) in the scan
COUNT_E_BLOCK = 64
SCAN_E_BLOCK = 32
SCAN_C_BLOCK = 128
#: rows per fill program
FILL_ROWS = 1024


@triton.jit
def _expert_of(v, E):
    """Expert id of raw ids `v` (int32 or int64), or E for padding / ids outside [0, E)."""
    return tl.where((v >= 0) & (v < E), v, E).to(tl.int32)


@triton.jit
def moe_mapping_count_kernel(idx_ptr, prefix_ptr, pte_ptr, ptt_ptr, pttk_ptr, N, E, P, CHUNKS,
                             CHUNK: tl.constexpr, E_BLOCK: tl.constexpr, FILL_ROWS: tl.constexpr):
    pid = tl.program_id(0)
    if pid < CHUNKS:
        n = pid * CHUNK + tl.arange(0, CHUNK)
        e = _expert_of(tl.load(idx_ptr + n, mask=n < N, other=-1), E)
        for e0 in range(0, E, E_BLOCK):
            ex = e0 + tl.arange(0, E_BLOCK)
            count = tl.sum((e[:, None] == ex[None, :]).to(tl.int32), axis=0)
            tl.store(prefix_ptr + pid.to(tl.int64) * E + ex, count, mask=ex < E)
    else:
        rows = (pid - CHUNKS).to(tl.int64) * FILL_ROWS + tl.arange(0, FILL_ROWS)
        pad = tl.full((FILL_ROWS,), -1, tl.int32)
        tl.store(pte_ptr + rows, pad, mask=rows < P)
        tl.store(ptt_ptr + rows, pad, mask=rows < P)
        tl.store(pttk_ptr + rows, pad, mask=rows < P)


@triton.jit
def moe_mapping_scan_kernel(prefix_ptr, aligned_ptr, E, CHUNKS, ALIGN, E_BLOCK: tl.constexpr, C_BLOCK: tl.constexpr):
    ex = tl.program_id(0) * E_BLOCK + tl.arange(0, E_BLOCK)
    emask = ex < E
    running = tl.zeros((E_BLOCK,), tl.int32)
    for c0 in range(0, CHUNKS, C_BLOCK):
        cs = c0 + tl.arange(0, C_BLOCK)
        m = (cs[:, None] < CHUNKS) & emask[None, :]
        at = prefix_ptr + cs[:, None].to(tl.int64) * E + ex[None, :]
        count = tl.load(at, mask=m, other=0)
        tl.store(at, tl.cumsum(count, axis=0) - count + running[None, :], mask=m)
        running += tl.sum(count, axis=0)
    tl.store(aligned_ptr + ex, (running + ALIGN - 1) // ALIGN * ALIGN, mask=emask)


@triton.jit
def moe_mapping_place_kernel(idx_ptr, prefix_ptr, aligned_ptr, start_ptr, end_ptr, ttp_ptr, pte_ptr, ptt_ptr,
                             pttk_ptr, N, K, E, P, CHUNK: tl.constexpr, E_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lane = tl.arange(0, CHUNK)
    n = pid * CHUNK + lane
    inside = n < N
    e = _expert_of(tl.load(idx_ptr + n, mask=inside, other=-1), E)
    valid = inside & (e < E)
    # each entry's segment start: the aligned rows of every expert before its own
    carry = tl.sum(tl.zeros((E_BLOCK,), tl.int32), axis=0)
    start = tl.zeros((CHUNK,), tl.int32)
    for e0 in range(0, E, E_BLOCK):
        ex = e0 + tl.arange(0, E_BLOCK)
        emask = ex < E
        aligned = tl.load(aligned_ptr + ex, mask=emask, other=0)
        first = carry + tl.cumsum(aligned, axis=0) - aligned
        if pid == 0:
            tl.store(start_ptr + ex, first, mask=emask)
            tl.store(end_ptr + ex, first + aligned, mask=emask)
        start += tl.sum(tl.where(e[:, None] == ex[None, :], first[None, :], 0), axis=1)
        carry += tl.sum(aligned, axis=0)
    # entries of the same expert earlier in this chunk (padding entries share the id E; unused)
    earlier = tl.sum(((e[None, :] == e[:, None]) & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    before = tl.load(prefix_ptr + pid.to(tl.int64) * E + tl.where(valid, e, 0), mask=valid, other=0)
    pos = start + before + earlier
    tl.store(ttp_ptr + n, tl.where(valid, pos, -1), mask=inside)
    row = valid & (pos < P)
    tl.store(pte_ptr + pos, e, mask=row)
    tl.store(ptt_ptr + pos, n // K, mask=row)
    tl.store(pttk_ptr + pos, n, mask=row)


@serialized
def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int,
                      alignment: int) -> tuple[torch.Tensor, ...]:
    """topk_idx int32/int64 [T, k] -> the seven int32 tensors of fused_mapping_reference
    (pos_to_expert, pos_to_token, pos_to_token_topk [P], token_topk_to_pos [T, k], expert_start,
    expert_end, num_tokens_per_expert [E]) for P = num_expanded_tokens rows."""
    _checks.tensor(OP, "topk_idx", topk_idx, (torch.int32, torch.int64), (None, None))
    for arg, value, low in (("num_experts", num_experts, 1), ("num_expanded_tokens", num_expanded_tokens, 0),
                            ("alignment", alignment, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            _checks.fail(OP, arg, repr(value), f"an int >= {low}", "pass the validated call's value")
    idx = topk_idx.contiguous()
    t, k = idx.shape
    n, e, p = t * k, num_experts, num_expanded_tokens
    if n >= 2 ** 31 or p >= 2 ** 31:
        _checks.fail(OP, "topk_idx", f"{n} entries for {p} rows", "fewer than 2^31 of each (int32 positions)",
                     "split the batch")
    device = idx.device
    rows = [torch.empty(p, dtype=torch.int32, device=device) for _ in range(3)]
    token_topk_to_pos = torch.empty(t, k, dtype=torch.int32, device=device)
    per_expert = [torch.empty(e, dtype=torch.int32, device=device) for _ in range(3)]
    chunks = triton.cdiv(n, CHUNK)
    prefix = torch.empty(max(chunks, 1), e, dtype=torch.int32, device=device)
    if chunks + p:
        moe_mapping_count_kernel[(chunks + triton.cdiv(p, FILL_ROWS),)](
            idx, prefix, *rows, n, e, p, chunks, CHUNK=CHUNK, E_BLOCK=COUNT_E_BLOCK, FILL_ROWS=FILL_ROWS)
    moe_mapping_scan_kernel[(triton.cdiv(e, SCAN_E_BLOCK),)](prefix, per_expert[2], e, chunks, alignment,
                                                             E_BLOCK=SCAN_E_BLOCK, C_BLOCK=SCAN_C_BLOCK)
    # at least one place program: program 0 writes expert_start / expert_end even without entries
    moe_mapping_place_kernel[(max(chunks, 1),)](idx, prefix, per_expert[2], per_expert[0], per_expert[1],
                                                token_topk_to_pos, *rows, n, max(k, 1), e, p, CHUNK=CHUNK,
                                                E_BLOCK=COUNT_E_BLOCK)
    return (*rows, token_topk_to_pos, *per_expert)
