"""The Triton routing-layout kernels (normalize_weight, get_fused_mapping, get_dispatch_layout)
against the contracts' references: bit for bit (the contracts ask for exact integers, and
normalize_weight's reference fixes its fp32 summation order)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.backends.nvidia.kernels import ep_layout, moe_mapping, moe_normalize  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.errors import ContractError  # noqa: E402
from portable_kernels.ops.ep import dispatch_layout_reference  # noqa: E402
from portable_kernels.ops.moe_routing import fused_mapping_reference, normalize_weight_reference  # noqa: E402
from portable_kernels.testing.generators import generator, randn  # noqa: E402
from portable_kernels.testing.moe_routing_cases import random_topk_idx  # noqa: E402


def _bits_equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.equal(got.view(torch.int32), want.view(torch.int32))


# -- normalize_weight -----------------------------------------------------------------------------

@pytest.mark.parametrize("t,k", [(1, 1), (33, 8), (65, 9), (200, 3)])
def test_normalize_is_the_reference_bit_for_bit(t, k):
    w = randn(t, k, seed=t * 31 + k, scale=3.0).abs() + 1e-3
    den, out = moe_normalize.normalize_weight(w)
    want_den, want_out = normalize_weight_reference(w)
    assert _bits_equal(den, want_den) and _bits_equal(out, want_out)


def test_normalize_reads_strided_weights():
    full = randn(40, 16, seed=4).abs() + 0.01
    w = full[:, ::2]  # stride 2 along the slots
    den, out = moe_normalize.normalize_weight(w)
    want_den, want_out = normalize_weight_reference(w.contiguous())
    assert _bits_equal(den, want_den) and _bits_equal(out, want_out)


def test_normalize_sums_in_slot_order():
    # 1 + 2^-24 + 2^-24 is 1 in slot order, 1 + 2^-23 in another order: only slot order gives the reference's bytes
    w = torch.tensor([[1.0, 2.0 ** -24, 2.0 ** -24], [2.0 ** -24, 2.0 ** -24, 1.0]])
    den, _ = moe_normalize.normalize_weight(w)
    assert _bits_equal(den, normalize_weight_reference(w)[0])
    assert den[0] == 1.0 and den[1] > 1.0


def test_normalize_keeps_nan_in_its_row():
    w = randn(8, 4, seed=5).abs() + 0.01
    w[3, 1] = float("nan")
    den, out = moe_normalize.normalize_weight(w)
    assert bool(out[3].isnan().all()) and bool(den[3].isnan())
    keep = torch.arange(8) != 3
    assert _bits_equal(out[keep], normalize_weight_reference(w)[1][keep])


def test_normalize_of_no_tokens_and_of_no_slots():
    den, out = moe_normalize.normalize_weight(torch.empty(0, 8))
    assert den.shape == (0,) and out.shape == (0, 8)
    den, out = moe_normalize.normalize_weight(torch.empty(5, 0))
    assert _bits_equal(den, normalize_weight_reference(torch.empty(5, 0))[0]) and out.shape == (5, 0)


def test_normalize_rejects_bf16_weights():
    with pytest.raises(ContractError, match="topk_weights"):
        moe_normalize.normalize_weight(randn(4, 4, seed=1).bfloat16())


# -- get_fused_mapping ----------------------------------------------------------------------------

def _rows_needed(idx: torch.Tensor, e: int, alignment: int) -> int:
    counts = torch.bincount(idx[idx >= 0].to(torch.int64), minlength=e)
    return int(((counts + alignment - 1) // alignment * alignment).sum())


MAPPINGS = [  # t, k, e, alignment, padding share; chunk, expert-block and chunk-block edges
    (8, 8, 16, 128, 0.1),     # one full chunk
    (13, 5, 7, 4, 0.3),       # a partial chunk
    (37, 8, 32, 128, 0.1),
    (300, 8, 300, 16, 0.05),  # E past several expert blocks of each pass
    (1100, 8, 64, 16, 0.05),  # more chunks than one scan tile (the prefix carries over)
    (512, 8, 256, 128, 0.02),  # DeepSeek-V3's 256 experts
    (6, 3, 4, 1, 1.0),        # every slot padding
    (50, 1, 3, 2, 0.0),
]


@pytest.mark.parametrize("spec,dtype", [(spec, torch.int64) for spec in MAPPINGS]
                         + [(spec, torch.int32) for spec in MAPPINGS[1:4]], ids=str)
def test_mapping_is_the_reference_bit_for_bit(spec, dtype):
    t, k, e, alignment, padding = spec
    idx = random_topk_idx(t, k, e, seed=t + e, padding=padding).to(dtype)
    rows = _rows_needed(idx, e, alignment) + 2 * alignment + 3  # trailing rows past the last segment
    got = moe_mapping.get_fused_mapping(idx, e, rows, alignment)
    want = fused_mapping_reference(idx, e, rows, alignment)
    for name, g, w in zip(("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos",
                           "expert_start", "expert_end", "num_tokens_per_expert"), got, want):
        assert g.dtype == torch.int32 and torch.equal(g, w), name


def test_mapping_orders_each_expert_by_token_then_slot():
    # every entry on one expert: rows follow (token, slot) across chunk boundaries
    idx = torch.zeros(70, 2, dtype=torch.int64)
    pte, ptt, pttk, ttp, *_ = moe_mapping.get_fused_mapping(idx, 1, 140, 1)
    assert torch.equal(pttk, torch.arange(140, dtype=torch.int32))
    assert torch.equal(ttp.reshape(-1), torch.arange(140, dtype=torch.int32))
    assert torch.equal(ptt, torch.arange(140, dtype=torch.int32) // 2) and bool((pte == 0).all())


def test_mapping_reads_a_transposed_index():
    idx = random_topk_idx(24, 8, 12, seed=9).T  # [8, 24], not contiguous
    rows = _rows_needed(idx, 12, 8)
    got = moe_mapping.get_fused_mapping(idx, 12, rows, 8)
    want = fused_mapping_reference(idx.contiguous(), 12, rows, 8)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_mapping_of_tokens_without_slots_is_all_padding():
    got = moe_mapping.get_fused_mapping(torch.empty(5, 0, dtype=torch.int64), 3, 8, 4)
    want = fused_mapping_reference(torch.empty(5, 0, dtype=torch.int64), 3, 8, 4)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_mapping_of_no_tokens_has_empty_segments():
    pte, ptt, pttk, ttp, start, end, aligned = moe_mapping.get_fused_mapping(
        torch.empty(0, 8, dtype=torch.int64), 5, 4, 128)
    assert ttp.shape == (0, 8) and bool((pte == -1).all() and (ptt == -1).all() and (pttk == -1).all())
    assert start.tolist() == end.tolist() == aligned.tolist() == [0] * 5


def test_mapping_skips_ids_past_the_experts():
    # what force_no_sync lets through unchecked: such slots count nowhere and map to -1
    idx = random_topk_idx(30, 4, 8, seed=11)
    bad = idx.clone()
    bad[torch.rand(30, 4, generator=generator(12)) < 0.2] = 8 + 2 ** 33  # also outside int32
    rows = _rows_needed(idx, 8, 4) + 16
    got = moe_mapping.get_fused_mapping(bad, 8, rows, 4)
    want = fused_mapping_reference(torch.where(bad >= 8, -1, bad), 8, rows, 4)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_mapping_writes_no_row_past_the_buffer():
    idx = random_topk_idx(40, 8, 16, seed=13, padding=0.0)
    needed = _rows_needed(idx, 16, 32)
    short = needed // 2
    pte, ptt, pttk, ttp, *_ = moe_mapping.get_fused_mapping(idx, 16, short, 32)
    want = fused_mapping_reference(idx, 16, needed, 32)
    assert torch.equal(pte, want[0][:short]) and torch.equal(ptt, want[1][:short])
    assert torch.equal(pttk, want[2][:short]) and torch.equal(ttp, want[3])


def test_mapping_rejects_a_zero_alignment():
    with pytest.raises(ContractError, match="alignment"):
        moe_mapping.get_fused_mapping(random_topk_idx(4, 2, 4, seed=1), 4, 64, 0)


def test_mapping_rejects_float_ids():
    with pytest.raises(ContractError, match="topk_idx"):
        moe_mapping.get_fused_mapping(randn(4, 2, seed=1), 4, 64, 4)


# -- get_dispatch_layout --------------------------------------------------------------------------

LAYOUTS = [(7, 3, 12, 3), (64, 8, 64, 8), (513, 6, 160, 16), (300, 8, 288, 8), (50, 2, 256, 64), (33, 9, 9, 1)]


@pytest.mark.parametrize("spec", LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_dispatch_layout_is_the_reference(spec, dtype):
    t, k, e, r = spec
    idx = random_topk_idx(t, k, e, seed=t + r, padding=0.2).to(dtype)
    per_rank, rdma, per_expert, in_rank = ep_layout.get_dispatch_layout(idx, e, r)
    want = dispatch_layout_reference(idx, e, r)
    assert rdma is None
    assert per_rank.dtype == per_expert.dtype == torch.int32 and in_rank.dtype == torch.bool
    assert torch.equal(per_rank, want[0]) and torch.equal(per_expert, want[2]) and torch.equal(in_rank, want[3])


def test_dispatch_layout_of_no_tokens_and_of_no_slots():
    for shape in ((0, 4), (6, 0)):
        got = ep_layout.get_dispatch_layout(torch.empty(shape, dtype=torch.int64), 8, 4)
        want = dispatch_layout_reference(torch.empty(shape, dtype=torch.int64), 8, 4)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])


def test_dispatch_layout_ignores_ids_past_the_experts():
    idx = random_topk_idx(20, 4, 16, seed=3)
    bad = torch.where(torch.rand(20, 4, generator=generator(4)) < 0.3, 16 + 2 ** 34, idx)
    got = ep_layout.get_dispatch_layout(bad, 16, 4)
    want = dispatch_layout_reference(torch.where(bad >= 16, -1, bad), 16, 4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])


def test_dispatch_layout_rejects_experts_not_split_evenly():
    with pytest.raises(ContractError, match="num_experts"):
        ep_layout.get_dispatch_layout(random_topk_idx(4, 2, 10, seed=1), 10, 4)


# -- the public ops on the nvidia backend ---------------------------------------------------------

def test_public_routing_layout_ops_run_on_triton():
    w = randn(12, 8, seed=21).abs() + 0.01
    idx = random_topk_idx(12, 8, 32, seed=22)
    with pk.use_backend("nvidia"), trace_providers() as ran:
        den, normalized = pk.normalize_weight(w)
        mapping = pk.get_fused_mapping(idx, 32, alignment=16)
        per_rank, _, per_expert, in_rank = pk.get_dispatch_layout(idx, 32, 4)
    assert ran == [("normalize_weight", "nvidia", "triton"), ("get_fused_mapping", "nvidia", "triton"),
                   ("get_dispatch_layout", "nvidia", "triton")]
    assert _bits_equal(normalized, normalize_weight_reference(w)[1])
    want = fused_mapping_reference(idx, 32, mapping.pos_to_expert.numel(), 16)
    assert all(torch.equal(g, x) for g, x in zip(mapping[:7], want))
    assert mapping.num_tokens_per_expert_list == want[6].tolist()
    want_layout = dispatch_layout_reference(idx, 32, 4)
    assert torch.equal(per_rank, want_layout[0]) and torch.equal(per_expert, want_layout[2])
    assert torch.equal(in_rank, want_layout[3])
