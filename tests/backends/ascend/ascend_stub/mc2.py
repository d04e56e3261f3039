"""Stand-in for the MC2 pair `npu_moe_distribute_dispatch_v2` / `npu_moe_distribute_combine_v2`
(torch_npu docs, op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md and
torch_npu-npu_moe_distribute_combine_v2.md; the facts used are listed in docs/ep.md, "Ascend MC2").

It runs over a torch.distributed group of CPU tensors (Gloo in the tests): `register_group(group)`
gives the name passed as `group_ep` (on an NPU that is the group's HCCL communicator name), and the
rows move with `all_to_all_single`. What it implements is what the documentation states:
- dispatch (quant_mode 0, no TP domain, no shared/special experts): every (token, expert) pair
  travels once to the rank holding the expert; `expand_x` [A, H] holds the rows received, grouped
  by local expert; `expert_token_nums` int64 [L] the per-expert counts (type 1) or their prefix
  sums (type 0); `dynamic_scales` None; A = global_bs * min(L, K) (or BS * R * min(L, K));
- combine: each row goes back the way it came and the source adds expert_scales[t, k] * row in
  fp32, returned in expand_x's dtype, shape (BS, H).
The documentation does NOT say in which order rows of one expert arrive; this stand-in writes
them by source rank, then source token (what `Mc2LowLatencyEngine` assumes; see docs/ep.md).
`assist_info_for_combine` and `ep_recv_counts` are documented as opaque ("pass them to combine_v2,
do not depend on their values"): here they hold this stand-in's own bookkeeping, and rows past the
received count are poisoned so a caller that reads them is caught.
Documented constraints it raises StandInError on: dtypes and ranks of x / expert_ids, expert ids in
[0, moe_expert_num) and distinct per row, moe_expert_num % ep_world_size, K <= 16, 0 < BS, the
per-chip limits (A2: ep_world_size 16/32/64, <= 24 local experts, H % 32 == 0 and H <= 7168,
BS <= 256; A3: ep_world_size in [2, 384], H in [1024, 7168], BS <= 512), quant_mode in {0, 2},
global_bs 0 (equal BS on every rank) or at least max_bs * ep_world_size, ep_rank_id equal to the
rank in the group.
Not implemented (StandInError): quant_mode 2 (per-token int8), TP domains, shared and special
experts, x_active_mask, elastic_info, comm_quant_mode != 0.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from ._common import require

MAX_TOPK = 16
#: poison for expand_x rows past the received count (the docs leave them unspecified)
POISON = 3.0e38

_GROUPS: dict[str, object] = {}
_NAMES = itertools.count()


def register_group(group) -> str:
    """A `group_ep` name for `group` (what get_hccl_comm_name returns on an NPU)."""
    name = f"stand-in-hccl-{next(_NAMES)}"
    _GROUPS[name] = group
    return name


def _group(name: str, op: str):
    require(isinstance(name, str) and 1 <= len(name) < 128, f"{op}: group_ep is a name of length [1, 128)")
    require(name in _GROUPS, f"{op}: unknown group_ep {name!r} (stand-in: register_group(group) first)")
    return _GROUPS[name]


def _limits(owner, op: str, world: int, num_experts: int, hidden: int, bs: int, k: int) -> None:
    require(1 <= num_experts <= 512, f"{op}: moe_expert_num in [1, 512] (combine_v2 docs)")
    require(num_experts % world == 0, f"{op}: moe_expert_num % (ep_world_size - shared_expert_rank_num) == 0")
    require(0 < k <= MAX_TOPK and k <= num_experts, f"{op}: 0 < K <= 16 and K <= moe_expert_num")
    require(bs > 0, f"{op}: 0 < BS")
    if owner.soc == "910b":
        require(world in (16, 32, 64), f"{op}: Atlas A2 ep_world_size 16, 32 or 64")
        require(num_experts // world <= 24, f"{op}: Atlas A2 moe_expert_num / ep_world_size <= 24")
        require(hidden % 32 == 0 and 0 < hidden <= 7168, f"{op}: Atlas A2 H in (0, 7168], a multiple of 32")
        require(bs <= 256, f"{op}: Atlas A2 BS <= 256")
    elif owner.soc == "910c":
        require(2 <= world <= 384, f"{op}: Atlas A3 ep_world_size in [2, 384]")
        require(1024 <= hidden <= 7168, f"{op}: Atlas A3 H in [1024, 7168]")
        require(bs <= 512, f"{op}: Atlas A3 BS <= 512")
    else:
        require(False, f"{op}: the torch_npu docs list Atlas A2 and A3 only")


def _exchange(group, rows: torch.Tensor, send: list[int]) -> tuple[torch.Tensor, list[int]]:
    """All-to-all of byte rows with uneven splits (counts exchanged first)."""
    world = dist.get_world_size(group)
    counts = torch.tensor(send, dtype=torch.int64)
    recv_counts = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(recv_counts, counts, group=group)
    recv = recv_counts.tolist()
    out = torch.empty((sum(recv), rows.shape[1]), dtype=torch.uint8)
    dist.all_to_all_single(out, rows.contiguous(), recv, send, group=group)
    return out, recv


class DispatchV2:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
                 x_active_mask=None, expert_scales=None, elastic_info=None, group_tp="", tp_world_size=0,
                 tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0,
                 global_bs=0, expert_token_nums_type=1, comm_alg="", zero_expert_num=0, copy_expert_num=0,
                 const_expert_num=0):
        op = "npu_moe_distribute_dispatch_v2"
        self.owner.record(op)
        group = _group(group_ep, op)
        require(isinstance(x, torch.Tensor) and x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float16),
                f"{op}: x is 2-D (BS, H) bfloat16/float16")
        require(isinstance(expert_ids, torch.Tensor) and expert_ids.dim() == 2 and expert_ids.dtype == torch.int32
                and expert_ids.shape[0] == x.shape[0], f"{op}: expert_ids is 2-D (BS, K) int32")
        require(ep_world_size == dist.get_world_size(group) and ep_rank_id == dist.get_rank(group),
                f"{op}: ep_world_size / ep_rank_id of the group_ep communicator")
        require(quant_mode in (0, 2), f"{op}: quant_mode 0 (none) or 2 (dynamic)")
        require(quant_mode == 0, "stand-in: quant_mode 2 (per-token int8) is not implemented")
        require(scales is None, f"{op}: scales are not passed without quantization")
        require(expert_token_nums_type in (0, 1), f"{op}: expert_token_nums_type 0 or 1")
        require(x_active_mask is None and expert_scales is None and elastic_info is None,
                "stand-in: x_active_mask / expert_scales / elastic_info are not implemented")
        require(group_tp == "" and tp_world_size in (0, 1) and shared_expert_rank_num == 0
                and zero_expert_num == copy_expert_num == const_expert_num == 0,
                "stand-in: TP domains, shared and special experts are not implemented")
        bs, hidden = x.shape
        k = expert_ids.shape[1]
        world, rank, num_experts = ep_world_size, ep_rank_id, moe_expert_num
        _limits(self.owner, op, world, num_experts, hidden, bs, k)
        ids = expert_ids.long()
        require(bool(((ids >= 0) & (ids < num_experts)).all()), f"{op}: expert_ids values in [0, moe_expert_num)")
        require(bool((ids.sort(dim=1).values.diff(dim=1) != 0).all()), f"{op}: the K ids of a row are distinct")
        max_bs = torch.tensor([bs], dtype=torch.int64)
        dist.all_reduce(max_bs, dist.ReduceOp.MAX, group=group)
        # docs: max_bs * ep_world_size; an upper bound (vLLM-Ascend: max tokens per rank * R) is
        # accepted, since global_bs must also stay the same across layers
        require(global_bs == 0 or global_bs >= int(max_bs) * world, f"{op}: global_bs 0 or max_bs * ep_world_size")
        if global_bs == 0:
            sizes = torch.empty(world, dtype=torch.int64)
            dist.all_gather_into_tensor(sizes, torch.tensor([bs], dtype=torch.int64), group=group)
            require(bool((sizes == bs).all()), f"{op}: global_bs = max_bs * ep_world_size when BS differs per rank")
        local = num_experts // world
        rows_a = (global_bs or bs * world) * min(local, k)

        # one row per (token, k): x's bytes, then (token, k, global expert) as int32
        token, slot = torch.meshgrid(torch.arange(bs), torch.arange(k), indexing="ij")
        token, slot, expert = token.reshape(-1), slot.reshape(-1), ids.reshape(-1)
        order = torch.sort(expert // local, stable=True).indices  # by destination rank, then (token, k)
        token, slot, expert = token[order], slot[order], expert[order]
        meta = torch.stack([token, slot, expert], dim=1).to(torch.int32)
        rows = torch.cat([x[token].contiguous().view(torch.uint8), meta.view(torch.uint8)], dim=1)
        send = torch.bincount(expert // local, minlength=world).tolist()
        got, recv = _exchange(group, rows, send)
        data_bytes = hidden * x.element_size()
        meta = got[:, data_bytes:].contiguous().view(torch.int32).long()
        src_rank = torch.repeat_interleave(torch.arange(world), torch.tensor(recv, dtype=torch.int64))
        local_expert = meta[:, 2] - rank * local
        # grouped by local expert; within one expert by source rank, then source token (our choice)
        key = (local_expert * world + src_rank) * int(max_bs) + meta[:, 0]
        order = torch.sort(key, stable=True).indices
        require(got.shape[0] <= rows_a, f"{op}: more rows arrived than A = {rows_a}")
        expand_x = torch.full((rows_a, hidden), POISON, dtype=x.dtype)
        expand_x[: got.shape[0]] = got[order, :data_bytes].contiguous().view(x.dtype)
        counts = torch.bincount(local_expert, minlength=local)
        expert_token_nums = (counts if expert_token_nums_type == 1 else counts.cumsum(0)).to(torch.int64)
        # stand-in bookkeeping, opaque to callers: per row (source rank, source token, k slot)
        assist = torch.full((rows_a * 128,), -1, dtype=torch.int32)
        info = torch.stack([src_rank[order], meta[order, 0], meta[order, 1]], dim=1).to(torch.int32)
        assist[: info.numel()] = info.reshape(-1)
        per_rank = torch.bincount(local_expert * world + src_rank, minlength=local * world)
        ep_recv_counts = per_rank.cumsum(0).to(torch.int32)
        tp_recv_counts = torch.zeros(1, dtype=torch.int32)
        return expand_x, None, assist, expert_token_nums, ep_recv_counts, tp_recv_counts, None


class CombineV2:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                 ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None,
                 expand_scales=None, shared_expert_x=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                 expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0):
        op = "npu_moe_distribute_combine_v2"
        self.owner.record(op)
        group = _group(group_ep, op)
        require(isinstance(expand_x, torch.Tensor) and expand_x.dim() == 2
                and expand_x.dtype in (torch.bfloat16, torch.float16), f"{op}: expand_x is 2-D bfloat16/float16")
        require(isinstance(expert_ids, torch.Tensor) and expert_ids.dim() == 2 and expert_ids.dtype == torch.int32,
                f"{op}: expert_ids is 2-D (BS, K) int32")
        require(isinstance(expert_scales, torch.Tensor) and expert_scales.dtype == torch.float32
                and expert_scales.shape == expert_ids.shape, f"{op}: expert_scales is float32 (BS, K)")
        require(assist_info_for_combine.dtype == torch.int32 and assist_info_for_combine.dim() == 1
                and assist_info_for_combine.numel() == expand_x.shape[0] * 128,
                f"{op}: assist_info_for_combine is int32 (A * 128,)")
        require(ep_send_counts.dtype == torch.int32 and ep_send_counts.numel() == moe_expert_num,
                f"{op}: ep_send_counts is int32 (ep_world_size * local_expert_num,) on Atlas A3")
        require(ep_world_size == dist.get_world_size(group) and ep_rank_id == dist.get_rank(group),
                f"{op}: ep_world_size / ep_rank_id of the group_ep communicator")
        require(comm_quant_mode == 0, "stand-in: comm_quant_mode 2 is not implemented")
        require(x_active_mask is None and shared_expert_x is None and expand_scales is None,
                "stand-in: x_active_mask / shared_expert_x / expand_scales are not implemented")
        bs, k = expert_ids.shape
        hidden = expand_x.shape[1]
        _limits(self.owner, op, ep_world_size, moe_expert_num, hidden, bs, k)
        info = assist_info_for_combine.view(-1, 3)[: int(ep_send_counts[-1])].long()
        src_rank, token, slot = info.unbind(1)
        order = torch.sort(src_rank, stable=True).indices
        meta = torch.stack([token[order], slot[order]], dim=1).to(torch.int32)
        rows = torch.cat([expand_x[order].contiguous().view(torch.uint8), meta.view(torch.uint8)], dim=1)
        send = torch.bincount(src_rank, minlength=ep_world_size).tolist()
        got, _ = _exchange(group, rows, send)
        data_bytes = hidden * expand_x.element_size()
        back = got[:, :data_bytes].contiguous().view(expand_x.dtype).float()
        meta = got[:, data_bytes:].contiguous().view(torch.int32).long()
        weight = expert_scales[meta[:, 0], meta[:, 1]]
        out = torch.zeros((bs, hidden), dtype=torch.float32)
        out.index_add_(0, meta[:, 0], back * weight[:, None])  # xOut = Sum(expertScales * ataOut)
        return out.to(expand_x.dtype)
