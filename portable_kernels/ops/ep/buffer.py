"""`Buffer`: DeepEP's expert-parallel communication buffer over any torch.distributed group.

Same constructor, method names, argument order, defaults and return tuples as `deep_ep.Buffer`,
so DeepEP model code ports by changing the import. Tokens move with `all_to_all_single` (counts
exchanged first) on Gloo, NCCL or HCCL; see `transport.py` (bytes on the wire), `agreement.py`
(the header every call starts with), `normal_exchange.py` and `low_latency_exchange.py` (the two
modes), `events.py` (EventOverlap) and `sizes.py` (hints and budgets). Results equal the
single-process contract of `simulate_dispatch` / `simulate_combine` /
`simulate_low_latency_dispatch` / `simulate_low_latency_combine`, rank by rank.

Every call is collective: all ranks of the group make the same Buffer calls in the same order.
A bad argument on any rank raises a typed error on every rank; a dead or absent rank raises
`EPTimeoutError` on every survivor within the timeout.
"""

from __future__ import annotations

import datetime
import os
import weakref
from typing import Any, Callable, Optional

import torch

from ...core.errors import ContractError, format_problem
from ...layouts.fp8_scales import sm100_ue8m0_encode
from ...core.dispatch import record_choice
from ...core.prepare import prepare_inputs
from ...core.registry import registry
from ...core.tensors import describe
from . import buffer_checks as chk
from .agreement import Proposal, propose
from .checks import _check_num_experts, _check_positive_int
from .dispatch_layout import get_dispatch_layout as _layout
from .events import EventHandle, EventOverlap, completed_event
from .low_latency_exchange import AllToAllLowLatencyEngine, CallInfo, LowLatencyEngine
from .normal_exchange import plan_combine, plan_dispatch, run_combine, run_dispatch, stage_dispatch, staging_need
from .results import DispatchHandle, LowLatencyHandle
from .sizes import NUM_MAX_NVL_PEERS, Config, default_config, get_low_latency_rdma_size_hint, num_rdma_ranks
from .workspace import Workspace
from .transport import DEFAULT_TIMEOUT_S, TorchDistributedTransport, Transport
from .wire import Field, OpCode

#: name of the built-in low-latency engine (all_to_all_single over the transport), for reports
ALL_TO_ALL_ENGINE = "all-to-all"
#: environment variable with the default collective timeout in seconds
TIMEOUT_ENV = "PK_EP_TIMEOUT_S"


def _version(t: torch.Tensor) -> int | None:
    """t's in-place version counter; None for inference tensors, which have none (never trusted)."""
    return None if t.is_inference() else t._version


def _noop_hook() -> None:
    """The receive hook: data has arrived when the call returns, so there is nothing left to do."""


def _default_device(group: Any) -> torch.device:
    try:
        backend = str(group.name()).lower()
    except Exception:  # a group without a backend name is treated as a CPU group
        backend = "gloo"
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "hccl" in backend and hasattr(torch, "npu"):
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device("cpu")


class Buffer:
    """DeepEP's Buffer (normal and low-latency modes) over a torch.distributed ProcessGroup.

    group: the ProcessGroup of the expert-parallel ranks (any backend: gloo, nccl, hccl)
    num_nvl_bytes: normal-mode budget — the bytes one rank may stage per dispatch/combine
        (max(rows sent, rows received) x row bytes); a call needing more raises ContractError on every
        rank. 0 disables normal mode. Size it like DeepEP (`Config.get_nvl_buffer_size_hint`) or larger.
    num_rdma_bytes: low-latency budget, at least `get_low_latency_rdma_size_hint(M, H, R, E)`; added to the
        normal-mode budget when the group spans more than one node (more than 8 ranks).
    low_latency_mode, num_qps_per_rank, allow_nvlink_for_low_latency_mode, allow_mnnvl: accepted for
        DeepEP compatibility (transport choices of NVSHMEM, meaningless for all_to_all_single).
    explicitly_destroy: as DeepEP, `destroy()` is allowed only when set.
    enable_shrink: DeepEP's rank masking; not supported (raises).
    comm: an mpi4py communicator instead of a group; not supported (raises).
    timeout: seconds (or a timedelta) each collective may take before EPTimeoutError; default
        $PK_EP_TIMEOUT_S or 300.
    transport: a custom Transport (default: TorchDistributedTransport(group, timeout)).
    low_latency_engine: a LowLatencyEngine, or a callable building one from this Buffer (e.g.
        `Mc2LowLatencyEngine.factory(...)` of the ascend backend); default: the first EP engine a
        backend registered (`Registry.add_ep_engine`) that serves this group — the ascend backend's
        MC2 engine (torch_npu's dispatch_v2 / combine_v2) on an HCCL group where torch_npu
        imports — else all-to-all over the transport. `low_latency_engine_name` says which.
    """

    num_sms: int = 20

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False, comm: Any = None, *,
                 timeout: float | datetime.timedelta | None = None, transport: Transport | None = None,
                 low_latency_engine: LowLatencyEngine | Callable[["Buffer"], LowLatencyEngine] | None = None) -> None:
        op = "Buffer"
        if group is None:
            fix = ("mpi4py communicators are not supported; pass a torch.distributed ProcessGroup"
                   if comm is not None else "pass the expert-parallel torch.distributed ProcessGroup")
            raise ContractError(format_problem(op, "group", "None", "a torch.distributed ProcessGroup", fix))
        if not (callable(getattr(group, "rank", None)) and callable(getattr(group, "size", None))):
            raise ContractError(format_problem(op, "group", describe(group), "a torch.distributed ProcessGroup",
                                               "pass e.g. torch.distributed.new_group(...) or dist.group.WORLD"))
        for arg, value in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ContractError(format_problem(op, arg, repr(value), "an int >= 0", f"pass {arg} in bytes"))
        chk.check_flags(op, low_latency_mode=low_latency_mode, explicitly_destroy=explicitly_destroy,
                        enable_shrink=enable_shrink)
        if enable_shrink:
            raise ContractError(format_problem(op, "enable_shrink", True, "False",
                                               "rank masking (low_latency_update_mask_buffer) is not supported by the "
                                               "all-to-all transport; rebuild the group without the failed rank"))
        if timeout is None:
            timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        self.group = group
        self.rank = int(group.rank())
        self.group_size = int(group.size())
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.num_qps_per_rank = num_qps_per_rank
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = enable_shrink
        self.device = _default_device(group)
        self.transport: Transport = transport or TorchDistributedTransport(group, timeout)
        self._workspace = Workspace()
        self.low_latency_engine: LowLatencyEngine = self._engine(low_latency_engine)
        self._seq = 0
        self._combine_buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        #: what the last get_dispatch_layout took and returned (weak references and versions)
        self._layout_seen: tuple[int, tuple[Any, ...]] | None = None
        self._destroyed = False

    def _engine(self, given: Any) -> LowLatencyEngine:
        """The given engine (or what a factory builds on this Buffer); by default the first registered
        EP engine that serves the group (the registry's choice, traced), else the all-to-all engine."""
        if given is not None:
            self.low_latency_engine_name, self.low_latency_engine_reasons = "given", {}
            return given if hasattr(given, "dispatch") else given(self)
        engine, self.low_latency_engine_reasons = registry().select_ep_engine(self.group)
        if engine is None:
            self.low_latency_engine_name = ALL_TO_ALL_ENGINE
            record_choice("ep_low_latency_engine", "portable_kernels", ALL_TO_ALL_ENGINE)
            return AllToAllLowLatencyEngine(self.transport, lambda: self.num_rdma_bytes, self._workspace)
        self.low_latency_engine_name = f"{engine.backend}.{engine.name}"
        record_choice("ep_low_latency_engine", engine.backend, engine.name)
        return engine.build(self)

    # ------------------------------------------------------------------ DeepEP's static helpers

    @staticmethod
    def is_sm90_compiled() -> bool:
        """True: FP8 payloads work on every device here (DeepEP reports whether its SM90 kernels exist)."""
        return True

    @staticmethod
    def set_num_sms(new_num_sms: int) -> None:
        """Recorded for compatibility (the all-to-all transport launches no SM-bound kernels)."""
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or new_num_sms < 2 or new_num_sms % 2:
            raise ContractError(format_problem("Buffer.set_num_sms", "new_num_sms", repr(new_num_sms),
                                               "an even int >= 2", "pass an even SM count"))
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture() -> EventOverlap:
        """An event on the current stream of the current accelerator (a completed marker on CPU)."""
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return EventOverlap(EventHandle(accelerator))

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """Bytes of num_rdma_bytes a low-latency Buffer needs (DeepEP's figure; see sizes.py)."""
        return get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return default_config(num_ranks)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return default_config(num_ranks)

    # ------------------------------------------------------------------ plumbing

    def _next_call(self, op: str, code: OpCode, device: torch.device, error: BaseException | None) -> CallInfo:
        if self._destroyed:
            raise ContractError(f"{op}: this Buffer was destroyed. Fix: build a new Buffer.")
        self._seq += 1
        return CallInfo(op, self._seq, int(code), device, error)

    def _normal_budget(self) -> int:
        spans_nodes = self.group_size > NUM_MAX_NVL_PEERS
        return self.num_nvl_bytes + (self.num_rdma_bytes if spans_nodes else 0)

    @staticmethod
    def _wait(previous_event: Optional[EventOverlap]) -> None:
        if previous_event is not None and previous_event.event is not None:
            previous_event.event.current_stream_wait()

    def _device_of(self, x: Any) -> torch.device:
        if isinstance(x, torch.Tensor):
            return x.device
        if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
            return x[0].device
        return self.device

    # ------------------------------------------------------------------ layout (local)

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int,
                            previous_event: Optional[EventOverlap] = None, async_finish: bool = False,
                            allocate_on_comm_stream: bool = False
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, torch.Tensor, EventOverlap]:
        """Where this rank's tokens go (no communication).

        topk_idx: int64 [T, k] expert ids (negative = none); num_experts: E, a multiple of the group size.
        Returns (num_tokens_per_rank int32 [R], num_tokens_per_rdma_rank int32 [R/8] when the group
        spans more than one node (8 ranks per node) else None, num_tokens_per_expert int32 [E],
        is_token_in_rank bool [T, R], event).
        """
        op = "Buffer.get_dispatch_layout"
        chk.check_event(op, previous_event)
        chk.check_flags(op, async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream)
        self._wait(previous_event)
        per_rank, _, per_expert, in_rank = _layout(topk_idx, num_experts, self.group_size)
        self._layout_seen = (num_experts, tuple((weakref.ref(t), _version(t)) for t in (topk_idx, per_rank, per_expert,
                                                                                          in_rank)))
        return per_rank, rdma_rank_counts(in_rank), per_expert, in_rank, completed_event(topk_idx.device)

    def _layout_verified(self, topk_idx: Any, num_tokens_per_rank: Any, num_tokens_per_expert: Any,
                         is_token_in_rank: Any) -> bool:
        """Whether these are the very tensors this Buffer's last get_dispatch_layout took and
        returned, none changed in place since (their version counters): then dispatch checks only
        their dtypes and shapes, not their values again (DeepEP's flow: layout, then dispatch)."""
        seen = self._layout_seen
        if seen is None or not isinstance(num_tokens_per_expert, torch.Tensor):
            return False
        num_experts, refs = seen
        given = (topk_idx, num_tokens_per_rank, num_tokens_per_expert, is_token_in_rank)
        return num_tokens_per_expert.shape[0] == num_experts and all(
            isinstance(t, torch.Tensor) and ref() is t and version is not None and _version(t) == version
            for (ref, version), t in zip(refs, given))

    # ------------------------------------------------------------------ normal mode

    def dispatch(self, x: Any, handle: Optional[DispatchHandle] = None,
                 num_tokens_per_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_rdma_rank: Optional[torch.Tensor] = None,
                 is_token_in_rank: Optional[torch.Tensor] = None,
                 num_tokens_per_expert: Optional[torch.Tensor] = None, topk_idx: Optional[torch.Tensor] = None,
                 topk_weights: Optional[torch.Tensor] = None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Optional[Config] = None, previous_event: Optional[EventOverlap] = None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False) -> tuple[Any, ...]:
        """Send each token once to every rank holding any of its experts (DeepEP's normal dispatch).

        x: bf16 [T, H] or an FP8 pair (fp8 [T, H], fp32 [T, H/128]); the layout tensors come from
        get_dispatch_layout (num_tokens_per_rdma_rank is accepted and not needed); topk_idx int64 [T, k]
        and fp32 topk_weights [T, k] are optional; handle: a previous dispatch's handle to reuse its
        layout (then no topk/layout arguments). num_worst_tokens > 0 pads the outputs to that many rows.
        Returns (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event);
        a cached dispatch returns (recv_x, None, None, None, None, event) like DeepEP.
        """
        op = "Buffer.dispatch"
        plan, error = None, None
        device = self._device_of(x)
        try:
            plan = self._plan_dispatch(op, x, handle, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
                                       topk_idx, topk_weights, expert_alignment, num_worst_tokens, config,
                                       previous_event, async_finish, allocate_on_comm_stream)
        except Exception as exc:  # shared with the peers before it is raised here (see agreement.py)
            error = exc
        call = self._next_call(op, OpCode.CACHED_DISPATCH if handle is not None else OpCode.DISPATCH, device, error)
        proposal = self._propose(call, plan, staging_need)
        self._wait(previous_event)
        staged = stage_dispatch(plan, self._workspace, self.rank)  # packs the rows while the header is in flight
        agreement = proposal.settle()
        out = run_dispatch(self.transport, op, plan, staged, agreement, self._workspace)
        return (*out, completed_event(device))

    def _plan_dispatch(self, op, x, handle, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, topk_idx,
                       topk_weights, expert_alignment, num_worst_tokens, config, previous_event, async_finish,
                       allocate_on_comm_stream):
        data, scales = chk.check_x(op, x)
        chk.check_flags(op, async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream)
        chk.check_event(op, previous_event)
        chk.check_config(op, config)
        _check_positive_int(op, "expert_alignment", expert_alignment)
        if isinstance(num_worst_tokens, bool) or not isinstance(num_worst_tokens, int) or num_worst_tokens < 0:
            raise ContractError(format_problem(op, "num_worst_tokens", repr(num_worst_tokens), "an int >= 0",
                                               "pass 0, or the most rows any rank may receive"))
        if self._normal_budget() == 0:
            raise ContractError(format_problem(op, "num_nvl_bytes", 0, "> 0 for normal-mode dispatch/combine",
                                               "build the Buffer with num_nvl_bytes (e.g. int(1e9))"))
        tokens, device = data.shape[0], data.device
        if handle is not None:
            for arg, value in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
                if value is not None:
                    raise ContractError(format_problem(op, arg, "given with a handle", "None in a cached dispatch",
                                                       "pass either handle (reuse a layout) or topk_idx (a new one)"))
            handle = chk.check_dispatch_handle(op, handle, self.rank, self.group_size, tokens, device)
            return plan_dispatch(data, scales, handle.is_token_in_rank, None, None, 0, None, expert_alignment,
                                 num_worst_tokens, handle, self._normal_budget())
        if topk_weights is not None and topk_idx is None:
            raise ContractError(format_problem(op, "topk_weights", "given without topk_idx", "None, or topk_idx too",
                                               "pass topk_idx with its weights"))
        verified = topk_idx is not None and self._layout_verified(topk_idx, num_tokens_per_rank, num_tokens_per_expert,
                                                                  is_token_in_rank)
        num_experts = chk.check_layout_inputs(op, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, None,
                                              tokens, self.group_size, device, values=not verified)
        if topk_idx is not None:
            chk.check_topk(op, topk_idx, topk_weights, num_experts, tokens, device, values=not verified)
            if not verified:
                chk.check_layout_inputs(op, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, topk_idx,
                                        tokens, self.group_size, device)
        return plan_dispatch(data, scales, is_token_in_rank, topk_idx, topk_weights, num_experts, num_tokens_per_expert,
                             expert_alignment, num_worst_tokens, None, self._normal_budget())

    def _propose(self, call: CallInfo, plan: Any, need: Callable[..., int] | None) -> Proposal:
        """Start the header exchange; with a local error it settles at once (and raises there)."""
        fields = {Field.OP: call.op_code, Field.SEQ: call.seq}
        if plan is None:
            propose(self.transport, call.op, fields, [0] * self.group_size, None, call.device, (),
                    call.local_error).settle()
        return propose(self.transport, call.op, {**plan.fields, **fields}, plan.send_rows, plan.expect_rows,
                       call.device, plan.must_match, None, need, getattr(plan, "send_marks", None),
                       getattr(plan, "expect_marks", None))

    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: Optional[torch.Tensor] = None,
                bias: Any = None, config: Optional[Config] = None, previous_event: Optional[EventOverlap] = None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False
                ) -> tuple[torch.Tensor, Optional[torch.Tensor], EventOverlap]:
        """Return each received row to its source rank and add them per token in fp32, without
        weights (DeepEP's normal combine); plus 0, 1 or 2 bias tensors [T, H].

        x: [N, H] rows in the order dispatch returned them; topk_weights: fp32 [N, k] or None.
        Returns (combined_x [T, H] in x's dtype, combined_topk_weights fp32 [T, k] or None, event).
        """
        op = "Buffer.combine"
        plan, error = None, None
        device = self._device_of(x)
        try:
            chk.check_flags(op, async_finish=async_finish, allocate_on_comm_stream=allocate_on_comm_stream)
            chk.check_event(op, previous_event)
            chk.check_config(op, config)
            if self._normal_budget() == 0:
                raise ContractError(format_problem(op, "num_nvl_bytes", 0, "> 0 for normal-mode dispatch/combine",
                                                   "build the Buffer with num_nvl_bytes (e.g. int(1e9))"))
            given = chk.check_dispatch_handle(op, handle, self.rank, self.group_size,
                                              getattr(handle, "num_tokens", -1), device)
            biases = chk.check_combine_args(op, x, given, topk_weights, bias)
            plan = plan_combine(x, given, topk_weights, biases, self._normal_budget())
        except Exception as exc:
            error = exc
        call = self._next_call(op, OpCode.COMBINE, device, error)
        proposal = self._propose(call, plan, staging_need)
        self._wait(previous_event)
        agreement = proposal.settle()
        combined, weights = run_combine(self.transport, op, plan, agreement, self._workspace)
        return combined, weights, completed_event(device)

    # ------------------------------------------------------------------ low-latency mode

    def low_latency_dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, num_max_dispatch_tokens_per_rank: int,
                             num_experts: int, cumulative_local_expert_recv_stats: Optional[torch.Tensor] = None,
                             dispatch_wait_recv_cost_stats: Optional[torch.Tensor] = None, use_fp8: bool = True,
                             round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                             return_recv_hook: bool = False, *, prepare_for: Optional[str] = None
                             ) -> tuple[Any, torch.Tensor, LowLatencyHandle, EventOverlap, Callable[[], None]]:
        """One copy of each token per chosen expert, in the masked layout of
        `m_grouped_fp8_gemm_nt_masked` (DeepEP's low-latency dispatch).

        x: bf16 [T, H], T <= num_max_dispatch_tokens_per_rank (M, same on every rank); topk_idx int64 [T, k].
        use_fp8: per-token FP8 cast (1 x 128 blocks) before sending; round_scale: power-of-two scales;
        use_ue8m0: scales packed four per int32 (needs round_scale).
        Returns (recv_x, recv_count int32 [L], handle, event, hook): recv_x is bf16 [L, M*R, H], or
        (fp8 [L, M*R, H], fp32 [L, M*R, H/128] MN-major) with use_fp8, or (fp8, int32 [L, M*R, H/512])
        with use_ue8m0; only the first recv_count[e] slots of expert e are valid. The data has
        arrived when the call returns, so the hook is a no-op. cumulative_local_expert_recv_stats
        (int32 [L]) is incremented by recv_count; dispatch_wait_recv_cost_stats is accepted, not filled.
        prepare_for (our extension, keyword only): an op name such as "m_grouped_fp8_gemm_nt_masked";
        recv_x is then a PreparedTensor in the bytes that op's backend reads for its argument "a"
        (prepare_inputs), so the GEMM converts nothing — the raw DeepEP pair is converted (and
        counted as an implicit conversion) by any backend whose format is not SM90's.
        """
        op = "Buffer.low_latency_dispatch"
        error = None
        device = self._device_of(x)
        try:
            chk.check_low_latency_dispatch_args(op, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                                                self.group_size, cumulative_local_expert_recv_stats,
                                                dispatch_wait_recv_cost_stats, use_fp8, round_scale, use_ue8m0,
                                                async_finish, return_recv_hook, prepare_for)
        except Exception as exc:
            error = exc
        call = self._next_call(op, OpCode.LOW_LATENCY_DISPATCH, device, error)
        recv_x, recv_count, handle = self.low_latency_engine.dispatch(
            call, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8, round_scale, use_ue8m0)
        if cumulative_local_expert_recv_stats is not None:
            cumulative_local_expert_recv_stats += recv_count
        if prepare_for is not None:
            recv_x = prepare_inputs(prepare_for, a=recv_x)["a"]
        elif use_ue8m0:
            recv_x = (recv_x[0], sm100_ue8m0_encode(recv_x[1]))
        return recv_x, recv_count, handle, completed_event(device), _noop_hook

    def low_latency_combine(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                            handle: LowLatencyHandle, use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False,
                            out: Optional[torch.Tensor] = None,
                            combine_wait_recv_cost_stats: Optional[torch.Tensor] = None
                            ) -> tuple[torch.Tensor, EventOverlap, Callable[[], None]]:
        """Return each expert output row to its token and add them WITH the top-k weights (fp32).

        x: bf16 [L, M*R, H] expert outputs in the dispatch's slots (unused slots are never read);
        topk_idx, topk_weights: this rank's [T, k] ids (as dispatched) and fp32 weights; handle: from
        this rank's low_latency_dispatch. use_logfmt is accepted and ignored (rows travel as exact
        bf16); zero_copy accepts the tensor get_next_low_latency_combine_buffer returned.
        Returns (combined_x [T, H] in x's dtype (written into out when given), event, hook).
        """
        op = "Buffer.low_latency_combine"
        error = None
        device = self._device_of(x)
        try:
            chk.check_low_latency_combine_args(op, x, topk_idx, topk_weights, handle, self.group_size, out,
                                               use_logfmt, zero_copy, async_finish, return_recv_hook)
        except Exception as exc:
            error = exc
        call = self._next_call(op, OpCode.LOW_LATENCY_COMBINE, device, error)
        combined = self.low_latency_engine.combine(call, x, topk_idx, topk_weights, handle)
        if out is not None:
            out.copy_(combined)
            combined = out
        return combined, completed_event(device), _noop_hook

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Nothing to clean: this transport keeps no signalling state between calls (arguments checked)."""
        op = "Buffer.clean_low_latency_buffer"
        _check_positive_int(op, "num_max_dispatch_tokens_per_rank", num_max_dispatch_tokens_per_rank)
        _check_positive_int(op, "hidden", hidden)
        _check_num_experts(op, num_experts, self.group_size)

    def get_next_low_latency_combine_buffer(self, handle: LowLatencyHandle) -> torch.Tensor:
        """A bf16 [L, M*R, H] tensor to write expert outputs into, then pass as x with zero_copy=True."""
        given = chk.check_low_latency_handle("Buffer.get_next_low_latency_combine_buffer", handle, self.group_size)
        shape = (given.num_experts // self.group_size, given.num_max_dispatch_tokens_per_rank * self.group_size,
                 given.hidden)
        key = (shape, given.recv_src_info.device)
        if key not in self._combine_buffers:
            self._combine_buffers[key] = torch.empty(shape, dtype=torch.bfloat16, device=given.recv_src_info.device)
        return self._combine_buffers[key]

    def destroy(self) -> None:
        """Release the Buffer (DeepEP: only with explicitly_destroy=True). The group stays the caller's."""
        if not self.explicitly_destroy:
            raise ContractError(format_problem("Buffer.destroy", "explicitly_destroy", False, True,
                                               "build the Buffer with explicitly_destroy=True to call destroy()"))
        self._workspace.clear()
        self._combine_buffers.clear()
        self._destroyed = True


def rdma_rank_counts(is_token_in_rank: torch.Tensor) -> Optional[torch.Tensor]:
    """DeepEP's num_tokens_per_rdma_rank: tokens sent to any rank of each node (8 ranks a node), or
    None when the group fits on one node."""
    tokens, num_ranks = is_token_in_rank.shape
    nodes = num_rdma_ranks(num_ranks)
    if nodes == 1:
        return None
    padded = torch.zeros((tokens, nodes * NUM_MAX_NVL_PEERS), dtype=torch.bool, device=is_token_in_rank.device)
    padded[:, :num_ranks] = is_token_in_rank
    return padded.view(tokens, nodes, NUM_MAX_NVL_PEERS).any(dim=2).sum(dim=0, dtype=torch.int32)
