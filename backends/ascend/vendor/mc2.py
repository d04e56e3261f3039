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
1024 experts, the per-chip limits of the communication algorithm the engine passes (`CHIP_LIMITS`:
Atlas A2 comm_alg "fullmesh": R in {2..8, 16, 32, 64, 128, 256}, H % 32 == 0 and H <= 7168,
M <= 256; Atlas A3 comm_alg "" (dispatch: fullmesh_v1): R in [2, 768], H in [1024, 8192], M <= 512,
local experts x R <= 2048), other chips, and any rank's argument error (which the all-to-all engine
then reports on every rank). Tokens routed to no expert at all are left out of the MC2 call and get
zeros back, as in DeepEP. The figures are the torch_npu pages' (op-plugin master 517f2e7 and 26.1.0
agree), cited in `CHIP_LIMITS`. On Atlas A2 dispatch returns `expand_scales` (A,) float32 and combine
requires it; the engine passes it through untouched (on A3 with comm_alg "" it is None both ways).

The row-order assumption above is checked by `row_order_self_test` (2 ranks and more; what the
device check runs on an NPU with HCCL).

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

#: the MC2 pair's pages: op-plugin master 517f2e7 docs/zh/custom_APIs/torch_npu/<page>.md (26.1.0 agrees)
DISPATCH_PAGE = "torch_npu-npu_moe_distribute_dispatch_v2.md"
COMBINE_PAGE = "torch_npu-npu_moe_distribute_combine_v2.md"
#: 约束说明 K: 0 < K <= 16 (12 only for A3's fullmesh_v2, which the engine does not use)
MAX_TOPK = 16
#: 参数说明 moe_expert_num: [1, 1024] on A2 and on A3 (A3 hierarchy: 512, not used)
MAX_EXPERTS = 1024


@attrs.frozen
class ChipLimits:
    """What one chip's MC2 pair takes under the comm_alg the engine passes, with the doc's words."""

    comm_alg: str
    world_sizes: tuple[int, ...] | None     # an explicit list, or None for world_range
    world_range: tuple[int, int] | None
    hidden_range: tuple[int, int]           # inclusive
    hidden_multiple: int
    max_bs: int
    max_expert_slots: int | None            # local_expert_num * ep_world_size
    source: str


CHIP_LIMITS = {
    "a2": ChipLimits(
        "fullmesh", (2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256), None, (1, 7168), 32, 256, None,
        f"{DISPATCH_PAGE} / {COMBINE_PAGE}, Atlas A2, comm_alg \"fullmesh\": ep_world_size 2-8, 16, 32, 64, 128, "
        f"256; H in (0, 7168], a multiple of 32; 0 < BS <= 256 (comm_alg \"\" picks fullmesh or hierarchy from "
        f"HCCL_INTRA_* variables, 不推荐, so the engine names fullmesh)"),
    "a3": ChipLimits(
        "", None, (2, 768), (1024, 8192), 1, 512, 2048,
        f"{DISPATCH_PAGE} / {COMBINE_PAGE}, Atlas A3, comm_alg \"\" (dispatch: fullmesh_v1): ep_world_size "
        f"[2, 768]; H [1024, 8192]; 0 < BS <= 512; 0 < local_expert_num * ep_world_size <= 2048"),
}
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


def limits_reason(chip: str | None, ranks: int, hidden: int, max_tokens: int, num_experts: int,
                  num_topk: int) -> str | None:
    """Why MC2 cannot take this call on `chip` ("a2" / "a3"), with the doc's words; None when it can."""
    if chip not in CHIP_LIMITS:
        return f"the MC2 pair's pages list Atlas A2 and A3 only, not {chip or 'this chip'}"
    if not 0 < num_topk <= MAX_TOPK or num_topk > num_experts:
        return f"K = {num_topk}: 0 < K <= {MAX_TOPK} and K <= moe_expert_num ({DISPATCH_PAGE} 约束说明)"
    if not 1 <= num_experts <= MAX_EXPERTS or num_experts % ranks:
        return (f"moe_expert_num = {num_experts}: [1, {MAX_EXPERTS}] and a multiple of ep_world_size {ranks} "
                f"({DISPATCH_PAGE} 参数说明)")
    lim = CHIP_LIMITS[chip]
    in_world = ranks in lim.world_sizes if lim.world_sizes else lim.world_range[0] <= ranks <= lim.world_range[1]
    problems = []
    if not in_world:
        problems.append(f"ep_world_size {ranks}")
    if not (lim.hidden_range[0] <= hidden <= lim.hidden_range[1] and hidden % lim.hidden_multiple == 0):
        problems.append(f"H {hidden}")
    if not 0 < max_tokens <= lim.max_bs:
        problems.append(f"BS up to {max_tokens}")
    if lim.max_expert_slots is not None and num_experts > lim.max_expert_slots:
        problems.append(f"local experts x ranks {num_experts}")
    return None if not problems else f"{', '.join(problems)} outside {lim.source}"


#: what the engine assumes about the rows of one expert in expand_x (undocumented; row_order_self_test)
ROW_ORDER = "grouped by local expert; inside an expert by source rank, then source token"


@attrs.frozen
class RowOrderReport:
    """What `row_order_self_test` saw on one rank: whether every expert's block of expand_x followed
    ROW_ORDER, and the (source rank, source token) pairs of each local expert in arrival order."""

    ok: bool
    chip: str | None
    observed: tuple[tuple[tuple[int, int], ...], ...]
    expected: tuple[tuple[tuple[int, int], ...], ...]
    detail: str


def row_order_self_test(group: Any, npu: Any = None, group_name: str | None = None, device: Any = None,
                        hidden: int = 1024, tokens: int = 8, experts_per_rank: int = 2,
                        topk: int = 2) -> RowOrderReport:
    """Dispatch tokens that carry their own (rank, token) in their first three columns through
    npu_moe_distribute_dispatch_v2, read the rows back out of expand_x and compare with ROW_ORDER.

    Every rank of `group` must call it (it runs one dispatch and one combine, which also returns the
    tokens so the MC2 buffers are left as a normal call leaves them). The values are small integers,
    exact in bf16. On the stand-in it checks the test's own choice; on an NPU it checks CANN's.
    The sizes default to a call both chips' documented limits accept (H 1024, 2 experts per rank)."""
    import torch.distributed as dist
    npu = npu if npu is not None else torch_npu_module()
    if npu is None:
        raise ContractError(format_problem("row_order_self_test", "npu", "None (torch_npu does not import)",
                                           "torch_npu, or a module with its MC2 ops", "install torch_npu with CANN"))
    chip = chip_of(npu)
    ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    name = group_name if group_name is not None else hccl_comm_name(group)
    num_experts = experts_per_rank * ranks
    why = limits_reason(chip, ranks, hidden, tokens, num_experts, topk)
    if why is not None:
        return RowOrderReport(False, chip, (), (), f"not run: {why}")
    if device is None:  # the real module takes NPU tensors; a stand-in takes CPU ones
        device = "npu" if getattr(npu, "__name__", None) == "torch_npu" else "cpu"
    device = torch.device(device)
    gen = torch.Generator().manual_seed(1234 + rank)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:topk] for _ in range(tokens)]).to(torch.int32)
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)  # columns: rank // 128, rank % 128, token
    x[:, 0], x[:, 1] = rank // 128, rank % 128
    x[:, 2] = torch.arange(tokens, dtype=torch.bfloat16)
    ids_dev = ids.to(device)  # collectives take the group's device tensors (HCCL: NPU tensors)
    every = [torch.empty_like(ids_dev) for _ in range(ranks)]
    dist.all_gather(every, ids_dev, group=group)
    every = [t.cpu() for t in every]
    expand_x, _, assist, counts, ep_recv, tp_recv, expand_scales = npu.npu_moe_distribute_dispatch_v2(
        x.to(device), ids.to(device), name, ranks, rank, num_experts, quant_mode=0, global_bs=tokens * ranks,
        expert_token_nums_type=1, comm_alg=CHIP_LIMITS[chip].comm_alg)
    rows = expand_x.cpu().float()
    counts = counts.cpu().long().tolist()
    observed, expected, start = [], [], 0
    for local in range(experts_per_rank):
        expert = rank * experts_per_rank + local
        block = rows[start:start + counts[local]]
        start += counts[local]
        observed.append(tuple((int(r[0]) * 128 + int(r[1]), int(r[2])) for r in block))
        expected.append(tuple((src, t) for src in range(ranks) for t in range(tokens)
                              if bool((every[src][t] == expert).any())))
    back = npu.npu_moe_distribute_combine_v2(
        expand_x, ids.to(device), assist, ep_recv, torch.ones(tokens, topk, device=device), name, ranks, rank,
        num_experts, tp_send_counts=tp_recv, expand_scales=expand_scales, global_bs=tokens * ranks,
        comm_alg=CHIP_LIMITS[chip].comm_alg)
    combined_ok = bool(torch.equal(back.cpu().float()[:, :3], x[:, :3].float() * topk))
    same_sets = all(sorted(o) == sorted(e) for o, e in zip(observed, expected))
    ok = same_sets and observed == expected and combined_ok
    if ok:
        detail = f"expand_x rows in the order the engine assumes ({ROW_ORDER})"
    elif not same_sets:
        detail = "expand_x does not hold the routed (rank, token) rows per expert: the dispatch itself is off"
    elif observed != expected:
        detail = (f"rows arrive in another order than the engine assumes ({ROW_ORDER}): the MC2 handle's "
                  f"recv_src_info would be wrong; report it with this output (combine_v2 "
                  f"{'returned' if combined_ok else 'did not return'} each token times its K unit weights)")
    else:
        detail = "combine_v2 did not return each token times its K unit weights"
    return RowOrderReport(ok, chip, tuple(observed), tuple(expected), detail)


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
        return limits_reason(self.chip, self.transport.num_ranks, hidden, max_tokens, num_experts, num_topk) is None

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
                expert_token_nums_type=1, comm_alg=CHIP_LIMITS[self.chip].comm_alg)

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
            global_bs=state.global_bs, comm_alg=CHIP_LIMITS[self.chip].comm_alg)
        out = torch.zeros((state.num_tokens, x.shape[-1]), dtype=x.dtype, device=x.device)
        out[state.active] = back.to(x.dtype)
        return out
