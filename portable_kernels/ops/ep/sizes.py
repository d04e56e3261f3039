"""Buffer sizes of the distributed Buffer: DeepEP's hints, its `Config`, and what one call needs.

- Normal mode: a rank's staging for one dispatch or combine is max(rows it sends, rows it
  receives) x bytes per row (payload plus per-row metadata). It must fit in `num_nvl_bytes`, plus
  `num_rdma_bytes` when the group spans more than one node (DeepEP's internode buffers carry
  normal-mode traffic too). `Config.get_nvl_buffer_size_hint` sizes a budget the DeepEP way: the
  rows DeepEP's ring of that config holds (channels x NVLink peers x chunked receive tokens) at the
  largest row (hidden + 128 top-k ids, weights and scales).
- Low-latency mode: `num_rdma_bytes` must be at least `get_low_latency_rdma_size_hint(M, H, R, E)`,
  DeepEP's figure for two send and two receive buffers of M tokens per rank (checked on every rank
  before any payload moves).
- Nodes: DeepEP puts 8 ranks on a node (`NUM_MAX_NVL_PEERS`); a group of more than 8 ranks spans
  several nodes, which decides `num_tokens_per_rdma_rank` and the internode budget.
"""

from __future__ import annotations

from ...core.errors import ContractError, format_problem
from .constants import SCALE_BLOCK

#: ranks on one scale-up (NVLink) domain in DeepEP's model
NUM_MAX_NVL_PEERS = 8
#: DeepEP's sizing assumptions: at most this many top-k entries and scales per row
MAX_TOPK = 128
MAX_SCALES = 128
#: DeepEP rounds buffer sizes to this many bytes
BUFFER_ALIGNMENT_BYTES = 128
#: low-latency message header (DeepEP: one int4 of control data per message)
LL_MESSAGE_HEADER_BYTES = 16


def num_rdma_ranks(num_ranks: int) -> int:
    """Nodes the group spans: 1 up to 8 ranks, else ceil(R / 8)."""
    return 1 if num_ranks <= NUM_MAX_NVL_PEERS else -(-num_ranks // NUM_MAX_NVL_PEERS)


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                   num_experts: int) -> int:
    """Bytes of RDMA buffer a low-latency Buffer needs (DeepEP's figure, counted with bf16 rows).

    Per message: dispatch = 16 + max(2H, H + 4·H/128) (a bf16 row or an FP8 row with its scales),
    combine = 4·H/128 + 2H. Two send buffers of max(M dispatch messages, E·M combine messages),
    two receive buffers of E·M messages, two signalling areas of E ints (aligned to 128), rounded
    up to the next multiple of 128 bytes.
    """
    for arg, value in (("num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank), ("hidden", hidden),
                       ("num_ranks", num_ranks), ("num_experts", num_experts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ContractError(format_problem("get_low_latency_rdma_size_hint", arg, repr(value), "a positive int",
                                               f"pass {arg} as a Python int >= 1"))
    num_scales = hidden // SCALE_BLOCK
    dispatch_msg = LL_MESSAGE_HEADER_BYTES + max(hidden * 2, hidden + num_scales * 4)
    combine_msg = num_scales * 4 + hidden * 2
    tokens = num_max_dispatch_tokens_per_rank
    send = max(tokens * dispatch_msg, num_experts * tokens * combine_msg)
    recv = num_experts * tokens * max(dispatch_msg, combine_msg)
    signalling = _align(num_experts * 4, BUFFER_ALIGNMENT_BYTES)
    total = 2 * send + 2 * recv + 2 * signalling
    return (total + BUFFER_ALIGNMENT_BYTES) // BUFFER_ALIGNMENT_BYTES * BUFFER_ALIGNMENT_BYTES


def _max_row_bytes(hidden_bytes: int) -> int:
    """The largest normal-mode row DeepEP sizes for: hidden bytes, 128 ids, weights and scales, a source index."""
    return hidden_bytes + MAX_TOPK * (8 + 4) + MAX_SCALES * 4 + 4


class Config:
    """DeepEP's performance config (same constructor). Accepted by dispatch/combine for porting;
    the all-to-all transport has no SM or chunk knobs, so only the size hints use it."""

    def __init__(self, num_sms: int = 20, num_max_nvl_chunked_send_tokens: int = 6,
                 num_max_nvl_chunked_recv_tokens: int = 256, num_max_rdma_chunked_send_tokens: int = 6,
                 num_max_rdma_chunked_recv_tokens: int = 256) -> None:
        for arg, value in (("num_sms", num_sms), ("num_max_nvl_chunked_send_tokens", num_max_nvl_chunked_send_tokens),
                           ("num_max_nvl_chunked_recv_tokens", num_max_nvl_chunked_recv_tokens),
                           ("num_max_rdma_chunked_send_tokens", num_max_rdma_chunked_send_tokens),
                           ("num_max_rdma_chunked_recv_tokens", num_max_rdma_chunked_recv_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if arg == "num_sms" else 1):
                raise ContractError(format_problem("Config", arg, repr(value), "a positive int",
                                                   "pass the values DeepEP's Config takes"))
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def __repr__(self) -> str:
        return (f"Config({self.num_sms}, {self.num_max_nvl_chunked_send_tokens}, "
                f"{self.num_max_nvl_chunked_recv_tokens}, {self.num_max_rdma_chunked_send_tokens}, "
                f"{self.num_max_rdma_chunked_recv_tokens})")

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes for the rows DeepEP's NVLink ring of this config holds, at the largest row."""
        rows = max(self.num_sms // 2, 1) * min(num_ranks, NUM_MAX_NVL_PEERS) * self.num_max_nvl_chunked_recv_tokens
        return _align(rows * _max_row_bytes(hidden_bytes), BUFFER_ALIGNMENT_BYTES)

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """0 within one node; else bytes for DeepEP's RDMA ring (send and receive halves)."""
        if num_ranks <= NUM_MAX_NVL_PEERS:
            return 0
        rows = max(self.num_sms // 2, 1) * num_rdma_ranks(num_ranks) * self.num_max_rdma_chunked_recv_tokens
        return _align(2 * rows * _max_row_bytes(hidden_bytes), BUFFER_ALIGNMENT_BYTES)


def default_config(num_ranks: int) -> Config:
    """The config `Buffer.get_dispatch_config` / `get_combine_config` return (DeepEP's defaults)."""
    return Config()
