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
[0, moe_expert_num) and distinct per row, moe_expert_num % ep_world_size, 0 < BS, comm_alg per chip
(A2 "" chooses fullmesh or hierarchy from HCCL_INTRA_PCIE_ENABLE / HCCL_INTRA_ROCE_ENABLE, A3 "" is
fullmesh_v1; combine on A3 takes "" or hierarchy), the per-chip, per-algorithm limits (`ALGORITHMS`:
A2 fullmesh: ep_world_size 2-8, 16, 32, 64, 128, 256, H in (0, 7168] a multiple of 32, BS <= 256;
A3 fullmesh_v1: ep_world_size [2, 768], H [1024, 8192], BS <= 512, local experts x world <= 2048;
moe_expert_num <= 1024, K <= 16), quant_mode in {0, 2}, global_bs 0 (equal BS on every rank) or at
least max_bs * ep_world_size, ep_rank_id equal to the rank in the group; on A2 dispatch returns
expand_scales (A,) float32 and combine requires it, and ep_recv_counts is
(moe_expert_num + 2 * global_bs * K * server_num,); on A3 with "" expand_scales is None both ways.
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


#: per (chip, communication algorithm): (world sizes (a tuple) or inclusive range (a pair tagged "range"), H range,
#: H multiple, max BS, max moe_expert_num, max K, max local experts x world) — torch_npu dispatch_v2 / combine_v2
#: pages, op-plugin master 517f2e7 (26.1.0 agrees), 参数说明 ep_world_size / moe_expert_num and 约束说明 H / BS / K /
#: local_expert_num. A2 "hierarchy" figures need driver >= 25.0.RC1.1 (the doc's condition, taken as met).
ALGORITHMS = {
    ("910b", "fullmesh"): ((2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256), (1, 7168), 32, 256, 1024, 16, None),
    ("910b", "hierarchy"): ((16, 32, 64), (1, 10240), 32, 512, 1024, 16, None),
    ("910c", "fullmesh_v1"): (("range", 2, 768), (1024, 8192), 1, 512, 1024, 16, 2048),
    ("910c", "fullmesh_v2"): (("range", 2, 768), (1024, 8192), 1, 256, 1024, 12, 2048),
    ("910c", "hierarchy"): (("range", 16, 256), (1024, 8192), 1, 256, 512, 16, 2048),
}
#: combine_v2's comm_alg per chip (A3 lists "" and "hierarchy" only)
COMBINE_ALGORITHMS = {"910b": ("", "fullmesh", "hierarchy"), "910c": ("", "hierarchy")}
DISPATCH_ALGORITHMS = {"910b": ("", "fullmesh", "hierarchy"), "910c": ("", "fullmesh_v1", "fullmesh_v2", "hierarchy")}


def resolve_algorithm(owner, op: str, comm_alg: str, allowed: dict) -> str:
    """The algorithm a comm_alg selects: A2 "" reads HCCL_INTRA_PCIE_ENABLE=1 and HCCL_INTRA_ROCE_ENABLE=0
    (hierarchy, else fullmesh; "不推荐"); A3 "" is fullmesh_v1."""
    require(owner.soc in allowed, f"{op}: the torch_npu docs list Atlas A2 and A3 only")
    require(comm_alg in allowed[owner.soc], f"{op}: comm_alg on this chip is one of {allowed[owner.soc]}")
    if comm_alg:
        return comm_alg
    if owner.soc == "910c":
        return "fullmesh_v1"
    import os
    hierarchy = os.environ.get("HCCL_INTRA_PCIE_ENABLE") == "1" and os.environ.get("HCCL_INTRA_ROCE_ENABLE") == "0"
    return "hierarchy" if hierarchy else "fullmesh"


def _limits(owner, op: str, alg: str, world: int, num_experts: int, hidden: int, bs: int, k: int) -> None:
    worlds, (h_lo, h_hi), h_mult, max_bs, max_experts, max_k, max_slots = ALGORITHMS[(owner.soc, alg)]
    chip = {"910b": "Atlas A2", "910c": "Atlas A3"}[owner.soc]
    require(1 <= num_experts <= max_experts, f"{op}: {chip} {alg}: moe_expert_num in [1, {max_experts}]")
    require(num_experts % world == 0, f"{op}: moe_expert_num % (ep_world_size - shared_expert_rank_num) == 0")
    require(0 < k <= max_k and k <= num_experts, f"{op}: {chip} {alg}: 0 < K <= {max_k} and K <= moe_expert_num")
    require(0 < bs <= max_bs, f"{op}: {chip} {alg}: 0 < BS <= {max_bs}")
    if worlds[0] == "range":
        ok = worlds[1] <= world <= worlds[2] and (alg != "hierarchy" or world % 16 == 0)
    else:
        ok = world in worlds
    require(ok, f"{op}: {chip} {alg}: ep_world_size {world} is not among {worlds}")
    require(h_lo <= hidden <= h_hi and hidden % h_mult == 0,
            f"{op}: {chip} {alg}: H in [{h_lo}, {h_hi}]" + (f", a multiple of {h_mult}" if h_mult > 1 else ""))
    require(max_slots is None or num_experts <= max_slots,
            f"{op}: {chip}: 0 < local_expert_num * ep_world_size <= {max_slots}")


def _server_num(world: int) -> int:
    """Servers of 8 NPUs (the A2 ep_recv_counts shape; the doc lists 2, 4, 8 and says nothing of one server:
    the stand-in takes 1 there)."""
    return max(1, -(-world // 8))


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
        require(x_active_mask is None and elastic_info is None,
                "stand-in: x_active_mask / elastic_info are not implemented")
        require(group_tp == "" and tp_world_size in (0, 1) and shared_expert_rank_num == 0
                and zero_expert_num == copy_expert_num == const_expert_num == 0,
                "stand-in: TP domains, shared and special experts are not implemented")
        bs, hidden = x.shape
        k = expert_ids.shape[1]
        world, rank, num_experts = ep_world_size, ep_rank_id, moe_expert_num
        alg = resolve_algorithm(self.owner, op, comm_alg, DISPATCH_ALGORITHMS)
        _limits(self.owner, op, alg, world, num_experts, hidden, bs, k)
        a2 = self.owner.soc == "910b"
        require(expert_scales is None or (a2 or alg == "hierarchy"),
                f"{op}: Atlas A3 takes expert_scales with comm_alg hierarchy only")
        require(expert_scales is None or (expert_scales.dtype == torch.float32
                                          and tuple(expert_scales.shape) == tuple(expert_ids.shape)),
                f"{op}: expert_scales is float32 (BS, K)")
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
        if a2:  # (moe_expert_num + 2 * global_bs * K * server_num,): the tail is the op's own (opaque) use
            tail = 2 * (global_bs or bs * world) * k * _server_num(world)
            ep_recv_counts = torch.cat([ep_recv_counts, torch.full((tail,), -7, dtype=torch.int32)])
        tp_recv_counts = torch.zeros(1, dtype=torch.int32)
        # expand_scales: A2 always (A,) float32; A3 only under hierarchy (else None). Its values are
        # opaque to callers ("模型其他业务逻辑不应对其存在依赖"): NaN here, so a caller that reads them shows it
        expand_scales = None
        if a2 or alg == "hierarchy":
            expand_scales = torch.full((rows_a,), float("nan"), dtype=torch.float32)
        return expand_x, None, assist, expert_token_nums, ep_recv_counts, tp_recv_counts, expand_scales


class CombineV2:
    def __init__(self, owner) -> None:
        self.owner = owner

    def __call__(self, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                 ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None,
                 expand_scales=None, shared_expert_x=None, group_tp="", tp_world_size=0, tp_rank_id=0,
                 expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0,
                 comm_alg=""):
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
        alg = resolve_algorithm(self.owner, op, comm_alg, COMBINE_ALGORITHMS)
        a2 = self.owner.soc == "910b"
        bs, k = expert_ids.shape
        tail = 2 * (global_bs or bs * ep_world_size) * k * _server_num(ep_world_size) if a2 else 0
        require(ep_send_counts.dtype == torch.int32 and ep_send_counts.numel() == moe_expert_num + tail,
                f"{op}: ep_send_counts is int32 (moe_expert_num + 2 * global_bs * K * server_num,) on Atlas A2, "
                f"(ep_world_size * local_expert_num,) on Atlas A3")
        if a2 or alg == "hierarchy":
            require(isinstance(expand_scales, torch.Tensor) and expand_scales.dtype == torch.float32
                    and tuple(expand_scales.shape) == (expand_x.shape[0],),
                    f"{op}: Atlas A2 requires expand_scales, dispatch_v2's (A,) float32 output (必选参数)")
        else:
            require(expand_scales is None, f"{op}: Atlas A3 with comm_alg \"\" does not take expand_scales")
        require(ep_world_size == dist.get_world_size(group) and ep_rank_id == dist.get_rank(group),
                f"{op}: ep_world_size / ep_rank_id of the group_ep communicator")
        require(comm_quant_mode == 0, "stand-in: comm_quant_mode 2 is not implemented")
        require(x_active_mask is None and shared_expert_x is None,
                "stand-in: x_active_mask / shared_expert_x are not implemented")
        hidden = expand_x.shape[1]
        _limits(self.owner, op, alg, ep_world_size, moe_expert_num, hidden, bs, k)
        total = int(ep_send_counts[moe_expert_num - 1])
        info = assist_info_for_combine[: 3 * total].view(total, 3).long()
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
