"""What one MoE layer moves per token: the model's MoE shape and the bytes of one row on the wire.

`MoEShape` is the model side of the cost model (hidden size, top-k, experts, tokens per rank,
FP8 or bf16 dispatch payload); `Exchange` says which bytes travel besides the token rows — the
distributed `Buffer`'s header exchange and per-row metadata (`BUFFER_EXCHANGE`), or nothing but
the rows (`ROWS_ONLY`, a bare `all_to_all_single` of pre-packed rows). Every byte count below is
the one `portable_kernels.ops.ep.Buffer` hands to its transport (see `normal_exchange.py`, `wire.py`).
"""

from __future__ import annotations

from typing import Literal

import attrs

from ...core.checks import check_int
from ...core.errors import ContractError, format_problem
from ...ops.ep.constants import SCALE_BLOCK
from ...ops.ep.wire import NUM_FIELDS

#: bytes of one bf16 / FP8 element, one fp32 scale, one int64 expert id, one fp32 weight, one int32 index
BF16_BYTES = 2
FP8_BYTES = 1
SCALE_BYTES = 4
EXPERT_ID_BYTES = 8
WEIGHT_BYTES = 4
SOURCE_INDEX_BYTES = 4
#: DeepEP's FP8 accounting: FP8 data plus one fp32 scale per 128 channels, relative to bf16
FP8_FACTOR = (1 + SCALE_BYTES / SCALE_BLOCK) / 2

Payload = Literal["fp8", "bf16"]
PAYLOADS: tuple[str, ...] = ("fp8", "bf16")


@attrs.frozen
class MoEShape:
    """One MoE layer as the expert-parallel exchange sees it.

    hidden: H, channels per token; num_topk: k experts per token; num_experts: E (a multiple of the
    EP degree); tokens_per_rank: T tokens each rank dispatches; payload: "fp8" (data + one fp32
    scale per 128 channels, DeepEP's FP8 dispatch) or "bf16". The combine always returns bf16 rows.
    """

    hidden: int
    num_topk: int
    num_experts: int
    tokens_per_rank: int
    payload: str = "fp8"

    def __attrs_post_init__(self) -> None:
        op = "MoEShape"
        check_int(op, "hidden", self.hidden, 1)
        check_int(op, "num_topk", self.num_topk, 1)
        check_int(op, "num_experts", self.num_experts, 1)
        check_int(op, "tokens_per_rank", self.tokens_per_rank, 1)
        if self.payload not in PAYLOADS:
            raise ContractError(format_problem(op, "payload", repr(self.payload), "'fp8' or 'bf16'",
                                               "pass payload='fp8' (data + per-128 scales) or 'bf16'"))
        if self.num_topk > self.num_experts:
            raise ContractError(format_problem(op, "num_topk", self.num_topk, f"<= num_experts ({self.num_experts})",
                                               "route each token to at most num_experts distinct experts"))
        if self.payload == "fp8" and self.hidden % SCALE_BLOCK:
            raise ContractError(format_problem(op, "hidden", self.hidden, f"a multiple of {SCALE_BLOCK} for FP8",
                                               f"FP8 rows carry one scale per {SCALE_BLOCK} channels; use bf16 or "
                                               f"a hidden size divisible by {SCALE_BLOCK}"))

    @property
    def dispatch_row_bytes(self) -> int:
        """Token bytes of one dispatched row: 2H for bf16, H + 4H/128 for FP8 (data + scales)."""
        if self.payload == "bf16":
            return self.hidden * BF16_BYTES
        return self.hidden * FP8_BYTES + (self.hidden // SCALE_BLOCK) * SCALE_BYTES

    @property
    def combine_row_bytes(self) -> int:
        """Token bytes of one returned row: bf16 expert outputs, 2H."""
        return self.hidden * BF16_BYTES

    def describe(self) -> str:
        return (f"hidden {self.hidden}, top-{self.num_topk} of {self.num_experts} experts, "
                f"{self.tokens_per_rank} tokens/rank, {self.payload} dispatch + bf16 combine")


@attrs.frozen
class Exchange:
    """Which bytes travel besides the token rows.

    header: each call starts with the Buffer's header exchange (one int64 vector per peer, a phase
    of its own before any payload); metadata: dispatch rows carry the k int64 expert ids and an
    int32 source index; dispatch_weights: ... and the k fp32 top-k weights; combine_weights: the
    combine also returns the fp32 top-k weights of each row.
    """

    name: str
    header: bool
    metadata: bool
    dispatch_weights: bool = True
    combine_weights: bool = False

    def dispatch_metadata_bytes(self, shape: MoEShape) -> int:
        if not self.metadata:
            return 0
        weights = shape.num_topk * WEIGHT_BYTES if self.dispatch_weights else 0
        return shape.num_topk * EXPERT_ID_BYTES + weights + SOURCE_INDEX_BYTES

    def combine_extra_bytes(self, shape: MoEShape) -> int:
        return shape.num_topk * WEIGHT_BYTES if self.combine_weights else 0


#: what `portable_kernels.ops.ep.Buffer.dispatch(x, topk_idx=..., topk_weights=...)` + `combine(x, handle)` move
BUFFER_EXCHANGE = Exchange("buffer", header=True, metadata=True, dispatch_weights=True, combine_weights=False)
#: a bare all_to_all_single of pre-packed token rows out and back (benchmarks/ep_bench.py's "raw")
ROWS_ONLY = Exchange("rows", header=False, metadata=False, dispatch_weights=False, combine_weights=False)
EXCHANGES = {e.name: e for e in (BUFFER_EXCHANGE, ROWS_ONLY)}


def header_bytes(num_ranks: int) -> int:
    """Bytes of the Buffer's header sent to each peer: int64 [NUM_FIELDS + 4R] (wire.header)."""
    return (NUM_FIELDS + 4 * num_ranks) * 8


#: DeepSeek-V3/R1 as DeepEP's published normal-kernel runs use it: 4096 tokens per rank, hidden
#: 7168, top-8 of 256 experts, FP8 dispatch, bf16 combine (DeepEP docs/legacy.md)
DEEPSEEK_V3 = MoEShape(hidden=7168, num_topk=8, num_experts=256, tokens_per_rank=4096, payload="fp8")
