"""Ascend MC2 low-latency engine: DeepEP's low-latency pair on torch_npu's fused collectives
`npu_moe_distribute_dispatch_v2` / `npu_moe_distribute_combine_v2` (one op each, on the group's
HCCL communicator), converted to and from DeepEP's masked layout.

What it relies on (facts and sources in docs/ep.md, "Ascend MC2"):
- dispatch_v2(x bf16/fp16 [BS, H], expert_ids int32 [BS, K] (ids in [0, E), distinct per row),
  group_ep, ep_world_size, ep_rank_id, moe_expert_num, quant_mode=0, global_bs=M * R,
  expert_token_nums_type=1) -> (expand_x [A, H], dynamic_scales, assist_info_for_combine,
  expert_token_nums int64 [L], ep_recv_counts, tp_recv_counts, expand_scales); expand_x holds the
  received rows grouped by local expert, expert_token_nums[e] of them for expert e (how the
  grouped matmul consumes them);
- combine_v2(expand_x, expert_ids, assist_info_for_combine, ep_send_counts=ep_recv_counts,
  expert_scales fp32 [BS, K], group_ep, ...) -> [BS, H]: the rows go back the way they came and are
  summed with the weights;
- the opaque outputs (assist_info_for_combine, ep_recv_counts, tp_recv_counts, expand_scales) are
  passed to combine_v2 untouched.
What the docs do not say, and this engine assumes for the handle only: rows of one expert arrive
ordered by source rank, then source token. The handle's recv_src_info / recv_layout_range are
computed from every rank's topk_idx under that assumption (one small all-gather); MC2's combine
does not read them, so the combine is right whatever the order.

Calls outside MC2's documented contract run on the all-to-all engine instead (decided on every rank
from one small all-gather, so all ranks take the same path): FP8 (MC2's quant_mode 2 is a per-token
int8 cast, not DeepEP's per-128 FP8 blocks), fp32 tokens, a token with some but not all top-k
entries -1 (the ids must lie in [0, E)), a rank with no routed token (BS > 0), K > 16, more than
512 experts, the per-chip limits (Atlas A2: R in {16, 32, 64}, <= 24 local experts, H % 32 == 0 and
H <= 7168, M <= 256; Atlas A3: R in [2, 384], H in [1024, 7168], M <= 512), other chips, and any
rank's argument error (which the all-to-all engine then reports on every rank). Tokens routed to no
expert at all are left out of the MC2 call and get zeros back, as in DeepEP.

torch_npu is imported lazily (`torch_npu_module`); tests pass a documented-semantics stand-in as
`npu` and the name of a Gloo group it knows as `group_name`. Not run on an NPU.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
from typing import Any, Callable

import attrs
import torch

from portable_kernels.core.errors import ContractError, format_problem
from portable_kernels.ops.ep.constants import LAYOUT_RANGE_SHIFT, NO_EXPERT
from portable_kernels.ops.ep.low_latency_exchange import AllToAllLowLatencyEngine, CallInfo
from portable_kernels.ops.ep.results import LowLatencyHandle, Rows
from portable_kernels.ops.ep.sizes import get_low_latency_rdma_size_hint
from portable_kernels.ops.ep.transport import Transport
from portable_kernels.ops.ep.workspace import Workspace

#: top-k, expert-count and per-chip limits of the MC2 pair (torch_npu docs; see docs/ep.md)
MAX_TOPK = 16
MAX_EXPERTS = 512
A2_WORLD_SIZES = (16, 32, 64)
A2_MAX_LOCAL_EXPERTS, A2_MAX_HIDDEN, A2_MAX_BS = 24, 7168, 256
A3_WORLD_RANGE, A3_HIDDEN_RANGE, A3_MAX_BS = (2, 384), (1024, 7168), 512
#: npu.get_soc_version() ranges (vLLM-Ascend): 220-225 Atlas A2, 250-255 Atlas A3
SOC_RANGES = {"a2": range(220, 226), "a3": range(250, 256)}
MC2_DTYPES = (torch.bfloat16, torch.float16)


def torch_npu_module() -> Any | None:
    """torch_npu when it imports (lazily; never at module import), else None."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # a broken CANN install must not break the library
        return None


def hccl_comm_name(group: Any) -> str:
    """The group's HCCL communicator name, as the torch_npu MC2 example gets it."""
    import torch.distributed as dist
    return group._get_backend(torch.device("npu")).get_hccl_comm_name(dist.get_rank())


def group_backend(group: Any) -> str:
    try:
        return str(group.name()).lower()
    except Exception:
        return ""


def chip_of(npu: Any) -> str | None:
    """"a2", "a3", or None for a chip the MC2 docs do not cover."""
    try:
        version = int(npu.npu.get_soc_version())
    except Exception:
        return None
    return next((chip for chip, versions in SOC_RANGES.items() if version in versions), None)


@attrs.frozen(eq=False)
class Mc2State:
    """MC2's own dispatch outputs, passed back to combine_v2 untouched, and what produced them."""

    expand_rows: int
    assist_info_for_combine: torch.Tensor
    ep_recv_counts: torch.Tensor
    tp_recv_counts: torch.Tensor | None
    expand_scales: torch.Tensor | None
    expert_token_nums: torch.Tensor
    active: torch.Tensor       # int64 [BS]: the tokens given to MC2 (those routed to any expert)
    expert_ids: torch.Tensor   # int32 [BS, K]: their ids, as dispatched
    num_tokens: int
    global_bs: int


@attrs.frozen(eq=False)
class Mc2LowLatencyHandle(LowLatencyHandle):
    """DeepEP's low-latency handle plus the MC2 state its combine needs (it still unpacks as the
    5-tuple, and the all-to-all engine can combine with it)."""

    mc2: Mc2State | None = None


class Mc2LowLatencyEngine:
    """A LowLatencyEngine on torch_npu's MC2 dispatch_v2 / combine_v2 (see the module docstring)."""

    def __init__(self, group: Any, transport: Transport, budget: Callable[[], int],
                 workspace: Workspace | None = None, *, npu: Any = None, group_name: str | None = None) -> None:
        self.group = group
        self.transport = transport
        self.budget = budget
        self.fallback = AllToAllLowLatencyEngine(transport, budget, workspace)
        self.npu = npu if npu is not None else torch_npu_module()
        if self.npu is None:
            raise ContractError(format_problem("Mc2LowLatencyEngine", "npu", "None (torch_npu does not import)",
                                               "torch_npu, or a module with its MC2 ops",
                                               "install torch_npu with CANN, or use the default all-to-all engine"))
        self._group_name = group_name
        self.chip = chip_of(self.npu)
        #: where the latest calls ran, "mc2" or "all_to_all", and how many ran on each (diagnostics)
        self.paths: collections.deque[str] = collections.deque(maxlen=16)
        self.path_counts = {"mc2": 0, "all_to_all": 0}

    @classmethod
    def factory(cls, *, npu: Any = None, group_name: str | None = None) -> Callable[[Any], "Mc2LowLatencyEngine"]:
        """For Buffer(..., low_latency_engine=Mc2LowLatencyEngine.factory(...)): builds the engine on
        the Buffer's group, transport, budget and workspace."""
        def build(buffer: Any) -> Mc2LowLatencyEngine:
            return cls(buffer.group, buffer.transport, lambda: buffer.num_rdma_bytes, buffer._workspace, npu=npu,
                       group_name=group_name)
        return build

    @property
    def group_name(self) -> str:
        if self._group_name is None:
            self._group_name = hccl_comm_name(self.group)
        return self._group_name

    def _ran(self, path: str) -> None:
        self.paths.append(path)
        self.path_counts[path] += 1

    # ---------------------------------------------------------------- shared decision

    def _agree(self, call: CallInfo, fields: list[int]) -> torch.Tensor | None:
        """All-gather [ok, *fields] from every rank: the fields of all ranks when every rank can take
        the MC2 path and the fields agree where they must, else None (every rank gets the same answer)."""
        mine = torch.tensor([int(call.local_error is None and fields[0] == 1), *fields[1:]], dtype=torch.int64)
        every = self.transport.all_gather(mine, call.op)
        return every if bool((every[:, 0] == 1).all()) else None

    def _limits_ok(self, hidden: int, max_tokens: int, num_experts: int, num_topk: int) -> bool:
        ranks = self.transport.num_ranks
        local = num_experts // ranks
        if num_topk > MAX_TOPK or num_experts > MAX_EXPERTS or num_topk > num_experts:
            return False
        if self.chip == "a2":
            return (ranks in A2_WORLD_SIZES and local <= A2_MAX_LOCAL_EXPERTS and hidden % 32 == 0
                    and hidden <= A2_MAX_HIDDEN and max_tokens <= A2_MAX_BS)
        if self.chip == "a3":
            return (A3_WORLD_RANGE[0] <= ranks <= A3_WORLD_RANGE[1]
                    and A3_HIDDEN_RANGE[0] <= hidden <= A3_HIDDEN_RANGE[1] and max_tokens <= A3_MAX_BS)
        return False

    # ---------------------------------------------------------------- dispatch

    def dispatch(self, call: CallInfo, x: Any, topk_idx: Any, num_max_dispatch_tokens_per_rank: int,
                 num_experts: int, use_fp8: bool, round_scale: bool, use_ue8m0: bool
                 ) -> tuple[Rows, torch.Tensor, LowLatencyHandle]:
        ranks, max_tokens = self.transport.num_ranks, num_max_dispatch_tokens_per_rank
        fields = [0, -1, -1, -1, -1, -1, -1]
        if call.local_error is None:
            idx = topk_idx.long()
            routed = idx >= 0
            active = routed.any(dim=1)
            hidden, num_topk = x.shape[1], idx.shape[1]
            need = get_low_latency_rdma_size_hint(max_tokens, hidden, ranks, num_experts)
            ok = (not use_fp8 and x.dtype in MC2_DTYPES and bool((routed == active[:, None]).all())
                  and bool(active.any()) and self.budget() >= need
                  and self._limits_ok(hidden, max_tokens, num_experts, num_topk))
            fields = [int(ok), num_experts, hidden, max_tokens, num_topk, int(active.sum()), int(x.dtype == torch.bfloat16)]
        every = self._agree(call, fields)
        if every is None or bool((every[:, 1:5] != every[0, 1:5]).any()) or bool((every[:, 6] != every[0, 6]).any()):
            self._ran("all_to_all")
            return self.fallback.dispatch(call, x, topk_idx, max_tokens, num_experts, use_fp8, round_scale, use_ue8m0)
        self._ran("mc2")
        return self._dispatch_mc2(call, x, idx, active, max_tokens, num_experts)

    def _dispatch_mc2(self, call: CallInfo, x: torch.Tensor, idx: torch.Tensor, active: torch.Tensor,
                      max_tokens: int, num_experts: int) -> tuple[Rows, torch.Tensor, LowLatencyHandle]:
        ranks, rank = self.transport.num_ranks, self.transport.rank
        local, hidden, num_topk = num_experts // ranks, x.shape[1], idx.shape[1]
        device = x.device
        # every rank's routing, padded to M tokens: the handle's source-token bookkeeping
        padded = torch.full((max_tokens, num_topk), NO_EXPERT, dtype=torch.int64, device=device)
        padded[: idx.shape[0]] = idx
        every_idx = self.transport.all_gather(padded.reshape(-1), call.op).view(ranks, max_tokens, num_topk)

        tokens = active.nonzero().squeeze(1)
        expert_ids = idx[tokens].to(torch.int32)
        # M * R: an upper bound of every rank's BS that stays the same from call to call (the docs
        # require global_bs to be equal across layers; vLLM-Ascend passes max tokens per rank * R)
        global_bs = max_tokens * ranks
        expand_x, _, assist, expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales = \
            self.npu.npu_moe_distribute_dispatch_v2(
                x[tokens], expert_ids, self.group_name, ranks, rank, num_experts, quant_mode=0, global_bs=global_bs,
                expert_token_nums_type=1)

        mine = torch.arange(local, device=device) + rank * local
        hits = (every_idx[..., None] == mine).any(dim=2)            # [R, M, L]
        expert, source, token = hits.permute(2, 0, 1).nonzero(as_tuple=True)  # expert, then (source, token)
        count = hits.sum(dim=1).T                                   # [L, R]
        recv_count = count.sum(dim=1)
        if not torch.equal(recv_count.cpu(), expert_token_nums.long().cpu()):
            raise ContractError(format_problem(call.op, "npu_moe_distribute_dispatch_v2",
                                               f"returning expert_token_nums {expert_token_nums.tolist()}",
                                               f"the counts the ranks' topk_idx route here, {recv_count.tolist()}",
                                               "report this torch_npu / CANN version; pass low_latency_engine="
                                               "AllToAllLowLatencyEngine meanwhile"))
        num_slots = max_tokens * ranks
        pos = torch.arange(expert.numel(), device=device) - (recv_count.cumsum(0) - recv_count)[expert]
        recv_x = torch.empty((local, num_slots, hidden), dtype=x.dtype, device=device)
        recv_x[expert, pos] = expand_x[: expert.numel()]
        info = torch.full((local, num_slots), NO_EXPERT, dtype=torch.int32, device=device)
        info[expert, pos] = token.to(torch.int32)
        layout_range = ((count.cumsum(1) - count) << LAYOUT_RANGE_SHIFT) | count
        state = Mc2State(expand_x.shape[0], assist, ep_recv_counts, tp_recv_counts, expand_scales, expert_token_nums,
                         tokens, expert_ids, idx.shape[0], global_bs)
        handle = Mc2LowLatencyHandle(info, layout_range, max_tokens, hidden, num_experts, state)
        return recv_x, recv_count.to(torch.int32), handle

    # ---------------------------------------------------------------- combine

    def combine(self, call: CallInfo, x: Any, topk_idx: Any, topk_weights: Any, handle: Any) -> torch.Tensor:
        fields = [0]
        state = getattr(handle, "mc2", None) if call.local_error is None else None
        if state is not None:
            idx = topk_idx.long()
            same = (idx.shape[0] == state.num_tokens and x.dtype in MC2_DTYPES
                    and torch.equal(idx[state.active].to(torch.int32), state.expert_ids)
                    and bool((idx[~torch.isin(torch.arange(idx.shape[0], device=idx.device), state.active)] < 0).all()))
            fields = [int(same)]
        if self._agree(call, fields) is None:
            self._ran("all_to_all")
            return self.fallback.combine(call, x, topk_idx, topk_weights, handle)
        self._ran("mc2")
        ranks, rank = self.transport.num_ranks, self.transport.rank
        count = handle.range_count.sum(dim=1)
        expert = torch.repeat_interleave(torch.arange(count.numel(), device=x.device), count)
        pos = torch.arange(expert.numel(), device=x.device) - (count.cumsum(0) - count)[expert]
        expand_x = torch.zeros((state.expand_rows, x.shape[-1]), dtype=x.dtype, device=x.device)
        expand_x[: expert.numel()] = x[expert, pos]
        scales = topk_weights[state.active].float()
        back = self.npu.npu_moe_distribute_combine_v2(
            expand_x, state.expert_ids, state.assist_info_for_combine, state.ep_recv_counts, scales, self.group_name,
            ranks, rank, handle.num_experts, tp_send_counts=state.tp_recv_counts, expand_scales=state.expand_scales,
            global_bs=state.global_bs)
        out = torch.zeros((state.num_tokens, x.shape[-1]), dtype=x.dtype, device=x.device)
        out[state.active] = back.to(x.dtype)
        return out
