"""The Buffer's own passes over the rows of a normal-mode call, as internal ops of the registry.

The transport moves bytes; around it a rank does three local passes whose cost on CPU is of the
order of the transfer itself (docs/ep.md, Benchmark):
- `ep_pack_dispatch_rows`: the dispatch's send side — every token row once per destination rank,
  destination-major, and beside it one metadata row (FP8 scales, top-k ids, weights, source index);
- `ep_unpack_dispatch_meta`: the received metadata rows back to recv_x_scales, recv_topk_idx
  (local ids, -1 elsewhere), recv_topk_weights (0 where not local), the per-local-expert counts and
  the source indices, padded to num_worst_tokens rows;
- `ep_combine_rows`: the combine's sum — each own token's returned rows added in fp32 (this rank's
  own row first, then the other ranks' in rank order, from a zero), then the biases, rounded once.

Each is a contract without a public op: its reference kernel here is the torch code the Buffer
ran before (and runs wherever no backend registers a provider, e.g. CUDA/NPU tensors); a backend
may register providers for it (the cpu backend: "reference" and a native C++ "native",
backends/cpu/providers/ep_rows.py). A provider must give the reference's bytes exactly: the
tests compare dispatch and combine outputs bit for bit.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from ...core.contract import OpContract, Tolerance, register_contract
from ...core.dispatch import plan_for, run_plan
from ...core.errors import BackendUnavailableError, NoKernelError
from ...core.providers import Inputs
from .constants import NO_EXPERT
from .wire import as_bytes, pack_rows, unpack_rows

# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class PackInputs(Inputs):
    """One dispatch's send side: x's rows at dest_token into the blocks of the destinations; the
    metadata parts (and, with with_src, the int32 token index) side by side at dest_token into `meta`.

    x: [T, H] any dtype (fp8 data for an FP8 pair); parts: contiguous per-token tensors [T, ...];
    is_token_in_rank bool [T, R]; dest_token int64 [S]: the token of each sent row,
    destination-major (= is_token_in_rank.T.nonzero()[1]); counts: its rows per destination;
    blocks: per destination d a contiguous uint8 [counts[d], row bytes of x] to fill, or None to
    leave its rows out (the own block, copied straight into recv_x later); meta uint8 [S, metadata
    bytes] or None (no parts and no source index, or not in this call)."""

    x: torch.Tensor
    parts: tuple[torch.Tensor, ...]
    with_src: bool
    is_token_in_rank: torch.Tensor
    dest_token: torch.Tensor
    counts: tuple[int, ...]
    blocks: tuple[torch.Tensor | None, ...]
    meta: torch.Tensor | None
    device_field = "x"


@attrs.frozen(eq=False)
class UnpackInputs(Inputs):
    """Received metadata rows uint8 [N, bytes]: per row num_scales fp32, then (topk_dtype not None)
    num_topk ids of topk_dtype, then (has_weights) num_topk fp32 weights, then (has_src) one int32
    source index. rank owns experts [rank * per_rank, (rank + 1) * per_rank); outputs have
    `rows` >= N rows (the padding: scales 0, ids -1, weights 0)."""

    meta: torch.Tensor
    num_scales: int
    topk_dtype: torch.dtype | None
    num_topk: int
    has_weights: bool
    has_src: bool
    rank: int
    per_rank: int
    rows: int
    device_field = "meta"


@attrs.frozen(eq=False)
class CombineInputs(Inputs):
    """One combine's sum on the source rank `me`. own: the rows this rank returns to itself [n_me, H];
    others: the rows the other ranks returned [sum of the others' splits, H], in rank order, each
    block in this rank's token order (sent_tokens, the dispatch order); recv_splits: rows from each
    rank; is_token_in_rank bool [T, R] and sent_tokens int64 [sum of splits] (is_token_in_rank.T
    .nonzero()[1]); biases: 0..2 tensors [T, H] of own's dtype. `wait` completes the collective
    that fills `others` (a kernel calls it before reading others; the reference adds own first).
    workspace: the Buffer's scratch areas (portable_kernels.ops.ep.workspace)."""

    own: torch.Tensor
    others: torch.Tensor
    recv_splits: tuple[int, ...]
    me: int
    sent_tokens: torch.Tensor
    is_token_in_rank: torch.Tensor
    biases: tuple[torch.Tensor, ...]
    wait: Callable[[], None]
    workspace: Any
    device_field = "own"


# --------------------------------------------------------------------------------------------
# Reference kernels (the torch path)
# --------------------------------------------------------------------------------------------

def pack_reference(call: PackInputs) -> None:
    data, start = as_bytes(call.x), 0
    for count, block in zip(call.counts, call.blocks):
        if block is not None and count:
            torch.index_select(data, 0, call.dest_token[start:start + count], out=block)
        start += count
    if call.meta is None:
        return
    parts = list(call.parts)
    if call.with_src:
        parts.append(torch.arange(call.x.shape[0], dtype=torch.int32, device=call.x.device))
    pack_rows(parts, call.dest_token, out=call.meta)


def unpack_reference(call: UnpackInputs) -> tuple[Any, ...]:
    """-> (scales fp32 [rows, S] | None, ids [rows, k] | None, weights fp32 [rows, k] | None,
    counts int64 [per_rank] | None (with ids), src int32 [N] | None)."""
    meta, device = call.meta, call.meta.device
    received = meta.shape[0]
    specs: list[tuple[torch.dtype, tuple[int, ...]]] = []
    if call.num_scales:
        specs.append((torch.float32, (call.num_scales,)))
    if call.topk_dtype is not None:
        specs.append((call.topk_dtype, (call.num_topk,)))
        if call.has_weights:
            specs.append((torch.float32, (call.num_topk,)))
    if call.has_src:
        specs.append((torch.int32, (1,)))
    unpacked = unpack_rows(meta, specs)

    def padded(t: torch.Tensor, fill: float | int) -> torch.Tensor:
        if call.rows == received:
            return t
        out = torch.full((call.rows, *t.shape[1:]), fill, dtype=t.dtype, device=device)
        out[:received] = t
        return out

    scales = padded(unpacked.pop(0), 0) if call.num_scales else None
    idx = weights = counts = src = None
    if call.topk_dtype is not None:
        ids = unpacked.pop(0)
        local = ids.long() - call.rank * call.per_rank
        is_local = (local >= 0) & (local < call.per_rank)
        idx = padded(torch.where(is_local, local, NO_EXPERT).to(ids.dtype), NO_EXPERT)
        if call.has_weights:
            w = unpacked.pop(0)
            weights = padded(torch.where(is_local, w, torch.zeros((), dtype=w.dtype, device=device)), 0)
        counts = torch.bincount(local[is_local], minlength=call.per_rank)
    if call.has_src:
        src = unpacked.pop(0).view(-1)
    return scales, idx, weights, counts, src


#: rows per fp32 chunk of the reference combine's accumulation
COMBINE_CHUNK_ROWS = 64


def _accumulate(out: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, chunk: torch.Tensor) -> None:
    """out[tokens[i]] += fp32(rows[i]), through the reused fp32 `chunk` so the converted rows stay
    cache-sized (no [S, H] fp32 copy)."""
    for start in range(0, rows.shape[0], chunk.shape[0]):
        stop = min(start + chunk.shape[0], rows.shape[0])
        converted = chunk[:stop - start]
        converted.copy_(rows[start:stop])
        out.index_add_(0, tokens[start:stop], converted)


def combine_reference(call: CombineInputs) -> torch.Tensor:
    """-> combined [T, H] in own's dtype (fresh)."""
    me, splits = call.me, call.recv_splits
    own = sum(splits[:me])
    own_end = own + splits[me]
    num_tokens, hidden = call.is_token_in_rank.shape[0], call.own.shape[1]
    returned = sum(splits)
    out = call.workspace.take("combine-sum", (num_tokens, hidden), torch.float32, call.own.device).zero_()
    chunk = call.workspace.take("combine-chunk", (max(min(COMBINE_CHUNK_ROWS, returned), 1), hidden), torch.float32,
                                call.own.device)
    _accumulate(out, call.own, call.sent_tokens[own:own_end], chunk)  # while the others are on the wire
    call.wait()
    _accumulate(out, call.others[:own], call.sent_tokens[:own], chunk)
    _accumulate(out, call.others[own:], call.sent_tokens[own_end:], chunk)
    for bias in call.biases:
        out += bias.float()
    return out.to(call.own.dtype)


# kernel=None: no backend gets these as oracles automatically; the cpu backend registers its own
PACK_DISPATCH_ROWS = register_contract(OpContract("ep_pack_dispatch_rows", pack_reference, Tolerance(dequantized=0.0)))
UNPACK_DISPATCH_META = register_contract(OpContract("ep_unpack_dispatch_meta", unpack_reference,
                                                    Tolerance(dequantized=0.0)))
COMBINE_ROWS = register_contract(OpContract("ep_combine_rows", combine_reference, Tolerance(dequantized=0.0)))

#: each internal op's reference kernel (what runs where the call's backend registers no provider)
REFERENCE_KERNELS: dict[str, Callable[[Any], Any]] = {
    PACK_DISPATCH_ROWS.name: pack_reference, UNPACK_DISPATCH_META.name: unpack_reference,
    COMBINE_ROWS.name: combine_reference,
}


def run_rows(contract: OpContract, inputs: Inputs) -> Any:
    """The registry's provider for this call, or the reference kernel where the call's backend has
    none (the nvidia and ascend backends register nothing for these ops)."""
    try:
        plan = plan_for(contract, inputs)
    except (NoKernelError, BackendUnavailableError):
        return REFERENCE_KERNELS[contract.name](inputs)
    if not plan.candidates:
        return REFERENCE_KERNELS[contract.name](inputs)
    return run_plan(plan, inputs)
