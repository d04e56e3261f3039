"""What the expert-parallel ops return on one rank: frozen attrs result and handle classes that
unpack like DeepEP's tuples."""

from __future__ import annotations

from typing import Any, Iterator, Union

import attrs
import torch

from .constants import LAYOUT_RANGE_COUNT_MASK, LAYOUT_RANGE_SHIFT, NO_EXPERT

#: DeepEP's ranks per node (NUM_MAX_NVL_PEERS): a larger group spans nodes and its handle indexes
#: like DeepEP's internode tuple
RANKS_PER_NODE = 8

Rows = Union[torch.Tensor, "tuple[torch.Tensor, torch.Tensor]"]


@attrs.frozen(eq=False)
class DispatchHandle:
    """What `simulate_combine` (and a cached `simulate_dispatch`) needs from a normal dispatch, on one rank.

    rank:               this rank's index
    rank_prefix_matrix: int32 [R, R]; entry [i][j] = tokens ranks 0..i send to rank j (as DeepEP's
                        handle[0]): rank j's rows from source i are rows [m[i-1][j], m[i][j])
    recv_src_idx:       int32 [num_recv_tokens]; the source token index of each received row
    is_token_in_rank:   bool [num_tokens, R]; where this rank's own tokens went
    num_worst_tokens:   0, or the padded row count of a `num_worst_tokens` dispatch (its combine
                        takes that many rows and reads the first len(recv_src_idx))

    Indexes like DeepEP's handle tuple. Within one node (at most 8 ranks, DeepEP's NUM_MAX_NVL_PEERS)
    the intranode one: [0] rank_prefix_matrix, [3] recv_src_idx, [4] is_token_in_rank; the channel
    matrices [1], [2] and send_head [5] are None (an all-to-all transport has no channels). A group
    spanning nodes (more than 8 ranks) indexes like DeepEP's 10-entry internode handle: [0]
    is_token_in_rank, [4] recv_rdma_rank_prefix_sum (int32 [nodes]: rows received from the ranks of
    nodes 0..n), [6] recv_gbl_rank_prefix_sum (int32 [R]: rows received from ranks 0..i — DeepEP's
    `handle[-4]`), [7] recv_src_idx (in the place of DeepEP's recv_src_meta); the channel matrices
    [1], [2], [3], [5] and the send heads [8], [9] are None.
    """

    rank: int
    rank_prefix_matrix: torch.Tensor
    recv_src_idx: torch.Tensor
    is_token_in_rank: torch.Tensor
    num_worst_tokens: int = 0

    def __getitem__(self, index: int) -> torch.Tensor | None:
        return self._entries()[index]

    def __len__(self) -> int:
        return len(self._entries())

    def __iter__(self) -> Iterator[torch.Tensor | None]:
        return iter(self._entries())

    @property
    def spans_nodes(self) -> bool:
        return self.num_ranks > RANKS_PER_NODE

    @property
    def recv_gbl_rank_prefix_sum(self) -> torch.Tensor:
        """int32 [R]: rows this rank received from ranks 0..i (its column of rank_prefix_matrix)."""
        return self.rank_prefix_matrix[:, self.rank].contiguous()

    @property
    def recv_rdma_rank_prefix_sum(self) -> torch.Tensor:
        """int32 [nodes]: rows this rank received from the ranks of nodes 0..n (8 ranks a node)."""
        prefix = self.recv_gbl_rank_prefix_sum
        last_of_node = torch.arange(RANKS_PER_NODE - 1, self.num_ranks, RANKS_PER_NODE, device=prefix.device)
        return prefix[last_of_node].contiguous()

    def _entries(self) -> tuple[torch.Tensor | None, ...]:
        if not self.spans_nodes:
            return (self.rank_prefix_matrix, None, None, self.recv_src_idx, self.is_token_in_rank, None)
        return (self.is_token_in_rank, None, None, None, self.recv_rdma_rank_prefix_sum, None,
                self.recv_gbl_rank_prefix_sum, self.recv_src_idx, None, None)

    @property
    def num_ranks(self) -> int:
        return int(self.rank_prefix_matrix.shape[0])

    @property
    def num_tokens(self) -> int:
        """Tokens this rank dispatched (the rows its combine returns)."""
        return int(self.is_token_in_rank.shape[0])

    @property
    def recv_src_rank(self) -> torch.Tensor:
        """int32 [num_recv_tokens]: the source rank of each received row."""
        ends = self.rank_prefix_matrix[:, self.rank].long()
        counts = ends - torch.cat((ends.new_zeros(1), ends[:-1]))
        ranks = torch.arange(self.num_ranks, device=ends.device)
        return torch.repeat_interleave(ranks, counts).to(torch.int32)


@attrs.frozen(eq=False)
class DispatchResult:
    """What normal-mode `dispatch` returns on one rank (DeepEP's tuple without the event).

    recv_x:            [N, H] in x's dtype, or (fp8 [N, H], fp32 [N, H/128]) when x was FP8
    recv_topk_idx:     [N, k] in topk_idx's dtype: local expert ids, -1 where the expert lives elsewhere
    recv_topk_weights: fp32 [N, k], 0 where recv_topk_idx is -1 (None without weights)
    num_recv_tokens_per_expert_list: rows per local expert aligned up to expert_alignment, as a
                       tuple of ints (DeepEP returns a list); None in a cached dispatch
    handle:            the DispatchHandle for combine

    Unpacks like DeepEP's return: `recv_x, recv_topk_idx, recv_topk_weights, counts, handle = result`.
    """

    recv_x: Rows
    recv_topk_idx: torch.Tensor | None
    recv_topk_weights: torch.Tensor | None
    num_recv_tokens_per_expert_list: tuple[int, ...] | None
    handle: DispatchHandle

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_x, self.recv_topk_idx, self.recv_topk_weights,
                    self.num_recv_tokens_per_expert_list, self.handle)


@attrs.frozen(eq=False)
class CombineResult:
    """What normal-mode `combine` returns on one rank: combined_x [T, H] in x's dtype (the sum of
    the returned rows of each own token; 0 for a token sent nowhere) and combined_topk_weights
    fp32 [T, k] (the sum of the returned weight rows) or None."""

    combined_x: torch.Tensor
    combined_topk_weights: torch.Tensor | None

    def __iter__(self) -> Iterator[Any]:
        yield from (self.combined_x, self.combined_topk_weights)


@attrs.frozen(eq=False)
class LowLatencyHandle:
    """DeepEP's low-latency handle, field for field (it unpacks in DeepEP's order).

    recv_src_info:   int32 [L, M*R]; the source token index of each valid slot (-1 in unused slots
                     here; DeepEP leaves them unspecified)
    recv_layout_range: int64 [L, R]; (begin << 32) | count of the slots holding source rank s's tokens
    num_max_dispatch_tokens_per_rank (M), hidden (H), num_experts (E = R*L)
    """

    recv_src_info: torch.Tensor
    recv_layout_range: torch.Tensor
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_src_info, self.recv_layout_range, self.num_max_dispatch_tokens_per_rank,
                    self.hidden, self.num_experts)

    def __getitem__(self, index: int) -> Any:
        return tuple(self)[index]

    def __len__(self) -> int:
        return 5

    @property
    def num_ranks(self) -> int:
        return int(self.recv_layout_range.shape[1])

    @property
    def range_begin(self) -> torch.Tensor:
        """int64 [L, R]: first slot of each source rank's tokens."""
        return self.recv_layout_range >> LAYOUT_RANGE_SHIFT

    @property
    def range_count(self) -> torch.Tensor:
        """int64 [L, R]: how many tokens of each source rank the expert received."""
        return self.recv_layout_range & LAYOUT_RANGE_COUNT_MASK

    @property
    def recv_src_rank(self) -> torch.Tensor:
        """int32 [L, M*R]: the source rank of each slot, -1 in slots outside every range."""
        slots = torch.arange(self.recv_src_info.shape[1], device=self.recv_layout_range.device)
        begin, count = self.range_begin[..., None], self.range_count[..., None]
        member = (slots >= begin) & (slots < begin + count)  # [L, R, M*R]
        rank = member.to(torch.int32).argmax(dim=1).to(torch.int32)
        return torch.where(member.any(dim=1), rank, NO_EXPERT)


@attrs.frozen(eq=False)
class LowLatencyDispatchResult:
    """What `low_latency_dispatch` returns on one rank (DeepEP's tuple without event and hook).

    recv_x:     [L, M*R, H] in x's dtype, or (fp8 [L, M*R, H], fp32 [L, M*R, H/128]) with use_fp8;
                only the first recv_count[e] slots of expert e are valid (zeros elsewhere here)
    recv_count: int32 [L]; valid slots per local expert
    handle:     the LowLatencyHandle for combine

    Unpacks like DeepEP's return: `recv_x, recv_count, handle = result`.
    """

    recv_x: Rows
    recv_count: torch.Tensor
    handle: LowLatencyHandle

    def __iter__(self) -> Iterator[Any]:
        yield from (self.recv_x, self.recv_count, self.handle)

    def sorted_by_source(self) -> "LowLatencyDispatchResult":
        """The same receive in the canonical order: each expert's valid slots sorted by (source rank,
        source token), ranges rebuilt to match, unused slots zero (and -1 in recv_src_info). Two
        correct implementations give identical sorted results, whatever order they wrote."""
        h = self.handle
        src_rank = h.recv_src_rank.long()
        valid = src_rank >= 0
        num_slots = h.recv_src_info.shape[1]
        key = torch.where(valid, src_rank * num_slots + h.recv_src_info.long(), h.num_ranks * num_slots)
        order = key.argsort(dim=1, stable=True)
        keep = torch.take_along_dim(valid, order, dim=1)
        info = torch.where(keep, torch.take_along_dim(h.recv_src_info, order, dim=1), NO_EXPERT)
        count = h.range_count
        begin = count.cumsum(dim=1) - count
        handle = LowLatencyHandle(info.to(torch.int32), (begin << LAYOUT_RANGE_SHIFT) | count,
                                  h.num_max_dispatch_tokens_per_rank, h.hidden, h.num_experts)

        def reorder(t: torch.Tensor) -> torch.Tensor:
            moved = torch.take_along_dim(t, order[..., None], dim=1)
            return torch.where(keep[..., None], moved, torch.zeros((), dtype=t.dtype, device=t.device))

        if isinstance(self.recv_x, tuple):
            data, scales = self.recv_x
            recv_x: Rows = (reorder(data.view(torch.uint8)).view(data.dtype), reorder(scales))
        else:
            recv_x = reorder(self.recv_x)
        return LowLatencyDispatchResult(recv_x, self.recv_count, handle)
