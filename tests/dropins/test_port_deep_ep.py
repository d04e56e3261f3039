"""DeepEP call sites ported to `portable_kernels.deep_ep`, in the style of DeepEP's legacy tests
(the bodies of test_intranode.py and test_low_latency.py, written here): every rank of a Gloo
group runs the body on CPU tensors and asserts what DeepEP's test asserts, with its thresholds
(combine calc_diff < 5e-6, weights < 1e-9; low latency 1e-5 bf16, 9e-4 FP8, 0.007 with
round_scale), including `recv_num_tokens_per_expert_list == [...]` (a list) and `handle[0]`.
"""

from __future__ import annotations

import inspect
import random
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import portable_kernels as pk
from portable_kernels import deep_ep
from portable_kernels.layouts import ue8m0_to_fp32
from portable_kernels.testing.ep_distributed import run_ranks

calc_diff = pk.calc_diff
LAUNCH_TIMEOUT_S = 240

# Upstream signatures (DeepEP legacy Buffer, deepseek-ai/DeepEP at dd758ca): the port must take these
# arguments the same way; it may add keyword-only extensions after them.
SIGNATURES = {
    "__init__": "self group num_nvl_bytes=0 num_rdma_bytes=0 low_latency_mode=False num_qps_per_rank=24 "
                "allow_nvlink_for_low_latency_mode=True allow_mnnvl=False explicitly_destroy=False "
                "enable_shrink=False comm=None",
    "destroy": "self",
    "is_sm90_compiled": "",
    "set_num_sms": "new_num_sms",
    "capture": "",
    "get_low_latency_rdma_size_hint": "num_max_dispatch_tokens_per_rank hidden num_ranks num_experts",
    "get_dispatch_config": "num_ranks",
    "get_combine_config": "num_ranks",
    "get_dispatch_layout": "self topk_idx num_experts previous_event=None async_finish=False "
                           "allocate_on_comm_stream=False",
    "dispatch": "self x handle=None num_tokens_per_rank=None num_tokens_per_rdma_rank=None is_token_in_rank=None "
                "num_tokens_per_expert=None topk_idx=None topk_weights=None expert_alignment=1 num_worst_tokens=0 "
                "config=None previous_event=None async_finish=False allocate_on_comm_stream=False",
    "combine": "self x handle topk_weights=None bias=None config=None previous_event=None async_finish=False "
               "allocate_on_comm_stream=False",
    "clean_low_latency_buffer": "self num_max_dispatch_tokens_per_rank hidden num_experts",
    "low_latency_dispatch": "self x topk_idx num_max_dispatch_tokens_per_rank num_experts "
                            "cumulative_local_expert_recv_stats=None dispatch_wait_recv_cost_stats=None use_fp8=True "
                            "round_scale=False use_ue8m0=False async_finish=False return_recv_hook=False",
    "low_latency_combine": "self x topk_idx topk_weights handle use_logfmt=False zero_copy=False async_finish=False "
                           "return_recv_hook=False out=None combine_wait_recv_cost_stats=None",
    "get_next_low_latency_combine_buffer": "self handle",
}
#: Buffer methods of DeepEP the port does not provide (docs/porting.md says why)
NOT_PROVIDED_METHODS = ("get_comm_stream", "get_local_buffer_tensor", "internode_dispatch", "internode_combine",
                        "low_latency_update_mask_buffer", "low_latency_query_mask_buffer",
                        "low_latency_clean_mask_buffer")


def _upstream_part(fn) -> str:
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    return " ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params)


@pytest.mark.parametrize("method", sorted(SIGNATURES))
def test_buffer_method_has_deep_eps_signature(method):
    assert _upstream_part(getattr(deep_ep.Buffer, method)) == SIGNATURES[method]


def test_module_names_and_refusals():
    assert deep_ep.topk_idx_t == torch.int64
    assert deep_ep.Buffer is pk.ep.Buffer and isinstance(deep_ep.Buffer.capture(), deep_ep.EventOverlap)
    assert isinstance(deep_ep.Buffer.get_dispatch_config(8), deep_ep.Config)
    for name in deep_ep.NOT_PROVIDED:
        with pytest.raises(AttributeError, match="not provided"):
            getattr(deep_ep, name)
    for method in NOT_PROVIDED_METHODS:
        assert not hasattr(deep_ep.Buffer, method)


# ------------------------------------------------------------------------------------------------ helpers


def per_token_cast_back(x_fp8: torch.Tensor, x_scales: torch.Tensor) -> torch.Tensor:
    """DeepEP's test helper: FP8 rows with per-128 scales (fp32, or int32 words of UE8M0 bytes) to bf16."""
    if x_scales.dtype == torch.int32:
        words = torch.empty(x_scales.shape, dtype=torch.int32).copy_(x_scales)  # fresh strides for .view
        x_scales = ue8m0_to_fp32(words.view(torch.uint8))
    return (x_fp8.float() * x_scales.repeat_interleave(128, dim=-1)).to(torch.bfloat16)


def _all_gather(t: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t, group=group)
    return torch.stack(parts)


# ------------------------------------------------------------------------------------------------ intranode


def intranode_body(rank: int, num_ranks: int, group, num_tokens: int, hidden: int, num_topk: int,
                   num_experts: int, seed: int) -> str:
    torch.manual_seed(seed + rank)
    buffer = deep_ep.Buffer(group, int(1e8), 0)
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16) * rank
    x_pure_rand = torch.randn((num_tokens, hidden), dtype=torch.bfloat16)
    x_e4m3_data, x_e4m3_scales = pk.per_token_cast_to_fp8(x)
    x_e4m3 = (x_e4m3_data, x_e4m3_scales.T.contiguous().T)  # DeepEP's test passes column-major scales
    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32).abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)[1].to(deep_ep.topk_idx_t)
    topk_weights = torch.ones((num_tokens, num_topk), dtype=torch.float32) * rank
    topk_weights_pure_rand = torch.randn((num_tokens, num_topk), dtype=torch.float32)
    rank_idx = torch.div(topk_idx, num_experts // num_ranks, rounding_mode="floor")

    # expert and rank layout, computed by hand
    num_tokens_per_expert = torch.bincount(topk_idx.flatten(), minlength=num_experts).to(torch.int)
    gbl_num_tokens_per_expert = num_tokens_per_expert.clone()
    dist.all_reduce(gbl_num_tokens_per_expert, group=group)
    is_token_in_rank = torch.stack([(rank_idx == i).any(dim=1) for i in range(num_ranks)], dim=1)
    num_tokens_per_rank = is_token_in_rank.sum(dim=0).to(torch.int)
    gbl_num_tokens_per_rank = num_tokens_per_rank.clone()
    dist.all_reduce(gbl_num_tokens_per_rank, group=group)

    ref_num_tokens_per_rank, rdma, ref_num_tokens_per_expert, ref_is_token_in_rank, event = \
        buffer.get_dispatch_layout(topk_idx, num_experts)
    assert torch.allclose(ref_num_tokens_per_rank, num_tokens_per_rank)
    assert torch.allclose(ref_num_tokens_per_expert, num_tokens_per_expert)
    assert torch.equal(ref_is_token_in_rank, is_token_in_rank)
    assert rdma is None and isinstance(event, deep_ep.EventOverlap)  # intranode: no RDMA split

    config = deep_ep.Config(20, 8, 256)

    def check_data(check_x, rank_prefix_matrix):
        assert torch.allclose(check_x.amin(dim=1), check_x.amax(dim=1))
        check_start = 0
        for i in range(num_ranks):
            check_end = rank_prefix_matrix[i][rank].item()
            assert (check_x[check_start:check_end, :].int() - i).sum().item() == 0
            check_start = check_end

    for previous_mode in (False, True):
        for async_mode in (False, True):
            for current_x in (x_pure_rand, x, x_e4m3):
                for with_topk in (False, True):
                    dispatch_args = {"x": current_x, "num_tokens_per_rank": num_tokens_per_rank,
                                     "is_token_in_rank": is_token_in_rank,
                                     "num_tokens_per_expert": num_tokens_per_expert, "config": config,
                                     "async_finish": async_mode}
                    if with_topk:
                        dispatch_args.update({"topk_idx": topk_idx, "topk_weights": topk_weights_pure_rand
                                              if current_x is x_pure_rand else topk_weights})
                    if previous_mode:
                        dispatch_args.update({"previous_event": buffer.capture()})
                    recv_x, recv_topk_idx, recv_topk_weights, recv_num_tokens_per_expert_list, handle, event = \
                        buffer.dispatch(**dispatch_args)
                    event.current_stream_wait() if async_mode else ()
                    recv_x = per_token_cast_back(*recv_x) if isinstance(recv_x, tuple) else recv_x

                    rank_prefix_matrix = handle[0]
                    assert gbl_num_tokens_per_rank[rank].item() == recv_x.size(0)
                    assert gbl_num_tokens_per_expert.view(num_ranks, -1)[rank].tolist() == \
                        recv_num_tokens_per_expert_list
                    if current_x is not x_pure_rand:
                        check_data(recv_x, rank_prefix_matrix)
                    recv_topk_weights_clone = None
                    if with_topk:
                        local = num_experts // num_ranks
                        assert (recv_topk_idx.eq(-1) | ((recv_topk_idx >= 0) & (recv_topk_idx < local))).sum().item() \
                            == recv_topk_idx.numel()
                        for i, count in enumerate(recv_num_tokens_per_expert_list):
                            assert recv_topk_idx.eq(i).sum().item() == count
                        recv_topk_weights_clone = recv_topk_weights.clone()
                        if current_x is not x_pure_rand:
                            recv_topk_weights[recv_topk_idx.eq(-1)] = recv_topk_weights.amax(
                                dim=1, keepdim=True).expand_as(recv_topk_weights)[recv_topk_idx.eq(-1)]
                            check_data(recv_topk_weights, rank_prefix_matrix)

                    if with_topk:  # num_worst_tokens pads every output to that many rows
                        num_worst_tokens = num_tokens * num_ranks
                        dispatch_args.update({"num_worst_tokens": num_worst_tokens})
                        recv_worst_x, recv_worst_topk_idx, recv_worst_topk_weights, empty_list, _, event = \
                            buffer.dispatch(**dispatch_args)
                        event.current_stream_wait() if async_mode else ()
                        if isinstance(recv_worst_x, tuple):
                            recv_worst_x = per_token_cast_back(*recv_worst_x)
                        assert len(empty_list) == 0
                        assert num_worst_tokens == recv_worst_x.size(0) == recv_worst_topk_idx.size(0)
                        assert num_worst_tokens == recv_worst_topk_weights.size(0)
                        assert torch.equal(recv_x, recv_worst_x[:recv_x.size(0)])
                        assert torch.equal(recv_topk_idx, recv_worst_topk_idx[:recv_x.size(0)])
                        assert torch.equal(recv_topk_weights_clone, recv_worst_topk_weights[:recv_x.size(0)])
                        assert torch.all(recv_worst_topk_idx[recv_x.size(0):] == -1).item()

                    if not with_topk:  # cached dispatch: the handle's layout, no top-k arguments
                        cached_args = {"x": current_x, "handle": handle, "config": config, "async_finish": async_mode}
                        if previous_mode:
                            cached_args.update({"previous_event": buffer.capture()})
                        cached_x, _, _, _, _, event = buffer.dispatch(**cached_args)
                        event.current_stream_wait() if async_mode else ()
                        cached_x = per_token_cast_back(*cached_x) if isinstance(cached_x, tuple) else cached_x
                        if current_x is not x_pure_rand:
                            check_data(cached_x, rank_prefix_matrix)

                    combine_args = {"x": recv_x, "handle": handle, "config": config, "async_finish": async_mode}
                    if with_topk:
                        combine_args.update({"topk_weights": recv_topk_weights})
                    if previous_mode:
                        combine_args.update({"previous_event": buffer.capture()})
                    combined_x, combined_topk_weights, event = buffer.combine(**combine_args)
                    event.current_stream_wait() if async_mode else ()
                    check_x = combined_x.float() / is_token_in_rank.sum(dim=1).unsqueeze(1)
                    ref_x = x_pure_rand if current_x is x_pure_rand else x
                    assert calc_diff(check_x, ref_x) < 5e-6
                    if with_topk:
                        check_topk_weights = combined_topk_weights if current_x is x_pure_rand else \
                            combined_topk_weights / is_token_in_rank.sum(dim=1).unsqueeze(1)
                        ref_topk_weights = topk_weights_pure_rand if current_x is x_pure_rand else topk_weights
                        assert calc_diff(check_topk_weights, ref_topk_weights) < 1e-9
    return "passed"


# ------------------------------------------------------------------------------------------------ low latency


def low_latency_body(rank: int, num_ranks: int, group, num_tokens: int, hidden: int, num_topk: int,
                     num_experts: int, seed: int) -> str:
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    num_local_experts = num_experts // num_ranks
    num_rdma_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(num_tokens, hidden, num_ranks, num_experts)
    buffer = deep_ep.Buffer(group, num_rdma_bytes=num_rdma_bytes, low_latency_mode=True,
                            num_qps_per_rank=num_local_experts)
    rank_offset = 128  # integers above 256 are not exact in bf16
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16) * (rank - rank_offset)
    x[:, -128:] = torch.arange(num_tokens).to(torch.bfloat16).view(-1, 1)
    x_list = [x, torch.randn((num_tokens, hidden), dtype=torch.bfloat16) * 0.1]
    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32).abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=True)[1].to(deep_ep.topk_idx_t)
    topk_weights = torch.randn((num_tokens, num_topk), dtype=torch.float32).abs()
    for _ in range(10):  # randomly mask some positions
        topk_idx[random.randint(0, num_tokens - 1), random.randint(0, num_topk - 1)] = -1
    all_topk_idx = _all_gather(topk_idx, group)

    for current_x in x_list:
        for return_recv_hook in (False, True):
            for use_fp8 in (False, True):
                for round_scale in (False, True) if use_fp8 else (False,):
                    for use_ue8m0 in (False, True) if round_scale else (False,):
                        stats = torch.zeros((num_local_experts,), dtype=torch.int)
                        packed_recv_x, packed_recv_count, handle, event, hook = buffer.low_latency_dispatch(
                            current_x, topk_idx, num_tokens, num_experts, use_fp8=use_fp8, round_scale=round_scale,
                            use_ue8m0=use_ue8m0, cumulative_local_expert_recv_stats=stats,
                            async_finish=not return_recv_hook, return_recv_hook=return_recv_hook)
                        hook() if return_recv_hook else event.current_stream_wait()
                        packed_recv_x = (packed_recv_x[0], packed_recv_x[1].contiguous()) if use_fp8 else packed_recv_x
                        simulated_gemm_x = per_token_cast_back(*packed_recv_x) if use_fp8 else packed_recv_x.clone()
                        for i in range(num_local_experts):
                            expert_id = rank * num_local_experts + i
                            recv_x = simulated_gemm_x[i]
                            recv_count, recv_src_info, recv_layout_range = packed_recv_count[i], handle[0][i], \
                                handle[1][i]
                            int_mask = (2 ** 32) - 1
                            num_valid_tokens = recv_count.item()
                            assert stats[i].item() == num_valid_tokens
                            assert num_valid_tokens == (recv_layout_range & int_mask).sum().item()
                            assert num_valid_tokens == (all_topk_idx == expert_id).sum().item()
                            if num_valid_tokens == 0 or current_x is not x:
                                continue
                            recv_x = recv_x[:num_valid_tokens]
                            recv_x_amin = recv_x[:, :-128].amin(dim=-1)
                            recv_src_info = recv_src_info[:num_valid_tokens]
                            assert torch.equal(recv_x_amin, recv_x[:, :-128].amax(dim=-1))
                            if round_scale:
                                assert calc_diff(recv_x[:, -1], recv_src_info.view(-1)) < 0.007
                            else:
                                assert (recv_x[:, -128:] - recv_src_info.view(-1, 1) % num_tokens).sum().item() == 0
                            for j in range(num_ranks):
                                begin_idx = (recv_layout_range[j] >> 32).item()
                                count = (recv_layout_range[j] & int_mask).item()
                                if not round_scale:
                                    assert (recv_x_amin == j - rank_offset).sum().item() == \
                                        (all_topk_idx[j] == expert_id).sum().item()
                                    assert (recv_x[begin_idx:begin_idx + count, :-128] - j + rank_offset).sum().item() \
                                        == 0
                        for zero_copy in (False, True):
                            if zero_copy:
                                buffer.get_next_low_latency_combine_buffer(handle)[:, :, :] = simulated_gemm_x
                            out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16)
                            combined_x, event, hook = buffer.low_latency_combine(
                                simulated_gemm_x, topk_idx, topk_weights, handle, async_finish=not return_recv_hook,
                                zero_copy=zero_copy, return_recv_hook=return_recv_hook, out=out)
                            hook() if return_recv_hook else event.current_stream_wait()
                            weight = topk_weights.masked_fill(topk_idx == -1, 0).sum(dim=1).view(-1, 1)
                            diff = calc_diff(current_x * weight, combined_x)
                            assert torch.isnan(combined_x).sum().item() == 0
                            if not round_scale:
                                assert diff < (9e-4 if use_fp8 else 1e-5), f"{diff=} {use_fp8=} {zero_copy=}"
    buffer.clean_low_latency_buffer(num_tokens, hidden, num_experts)
    return "passed"


# ------------------------------------------------------------------------------------------------ launches


def _launch(body, num_ranks: int, num_experts: int) -> None:
    outcomes = run_ranks(num_ranks, body, (32, 512, 4, num_experts, 7), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok and o.value == "passed" for o in outcomes), "\n".join(o.describe() for o in outcomes)


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_intranode(num_ranks):
    _launch(intranode_body, num_ranks, 4 * num_ranks)


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_low_latency(num_ranks):
    _launch(low_latency_body, num_ranks, 4 * num_ranks)


def test_porting_doc_lists_every_name():
    text = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    section = text.split("## DeepEP", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for cell in rows for name in re.findall(r"`(?:Buffer\.)?(\w+)`", cell)}
    methods = {m for m in SIGNATURES if m != "__init__"} | set(NOT_PROVIDED_METHODS)
    names = {"Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t"} | set(deep_ep.NOT_PROVIDED)
    assert listed == methods | names
    provided = len(listed) - len(deep_ep.NOT_PROVIDED) - len(NOT_PROVIDED_METHODS)
    assert f"Provided: {provided} of {len(listed)} names" in section
    after = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0].split("# after", 1)[1]
    exec(after, {})

# ------------------------------------------------------------------------------------------------ internode


def internode_body(rank: int, num_ranks: int, group, num_tokens: int, hidden: int, num_topk: int,
                   num_experts: int, seed: int) -> str:
    """DeepEP's test_internode checks at 16 ranks (2 nodes of 8): the node-level counts from
    get_dispatch_layout and the internode handle (`handle[-4]` = recv_gbl_rank_prefix_sum)."""
    torch.manual_seed(seed + rank)
    num_nodes = num_ranks // 8
    buffer = deep_ep.Buffer(group, int(1e8), int(1e8))
    x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16) * rank
    scores = torch.randn((num_tokens, num_experts), dtype=torch.float32).abs() + 1
    topk_idx = torch.topk(scores, num_topk, dim=-1, sorted=False)[1].to(deep_ep.topk_idx_t)
    topk_weights = torch.ones((num_tokens, num_topk), dtype=torch.float32) * rank
    rank_idx = torch.div(topk_idx, num_experts // num_ranks, rounding_mode="floor")
    is_token_in_rank = torch.stack([(rank_idx == i).any(dim=1) for i in range(num_ranks)], dim=1)
    per_node = torch.stack([is_token_in_rank[:, n * 8:(n + 1) * 8].any(dim=1) for n in range(num_nodes)], 1)
    gbl_num_tokens_per_rank = is_token_in_rank.sum(dim=0).to(torch.int)
    dist.all_reduce(gbl_num_tokens_per_rank, group=group)

    per_rank, per_rdma_rank, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    assert torch.equal(in_rank, is_token_in_rank)
    assert per_rdma_rank is not None and torch.equal(per_rdma_rank, per_node.sum(dim=0).to(torch.int))
    recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
    assert len(handle) == 10 and handle[0] is not None and torch.equal(handle[0], is_token_in_rank)
    recv_gbl_rank_prefix_sum = handle[-4]
    assert gbl_num_tokens_per_rank[rank].item() == recv_x.size(0) == int(recv_gbl_rank_prefix_sum[-1])
    start = 0
    for i in range(num_ranks):  # DeepEP's check_data: rows from rank i carry the value i
        end = int(recv_gbl_rank_prefix_sum[i])
        assert (recv_x[start:end].int() - i).abs().sum().item() == 0
        start = end
    assert torch.equal(handle[4], recv_gbl_rank_prefix_sum[7::8])  # per source node
    cached, *_ = buffer.dispatch(x, handle=handle)
    assert torch.equal(cached, recv_x)
    combined, _, _ = buffer.combine(recv_x, handle)
    assert torch.equal(combined.float() / is_token_in_rank.sum(dim=1, keepdim=True), x.float())
    return "passed"


def test_internode_handle_at_16_ranks():
    outcomes = run_ranks(16, internode_body, (24, 256, 4, 64, 11), timeout_s=LAUNCH_TIMEOUT_S)
    assert all(o.ok and o.value == "passed" for o in outcomes), "\n".join(o.describe() for o in outcomes)
