"""TileKernels call sites ported to `portable_kernels.tile_kernels` (written here in the style of
TileKernels' own tests: parameter grids, a reference, assert_equal / calc_diff with its thresholds).

Byte-exact casts are checked against `tile_kernels_oracle` — TileKernels' documented math written
independently of portable_kernels — on random and on tie-heavy inputs (values within 2 ulp of
rounding ties, where TileKernels' x · (max/amax) and the top-level x / sf round differently).
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
from tile_kernels_oracle import near_midpoints, packed_words, tile_cast, tile_reduce, tile_swiglu

import portable_kernels as pk
from portable_kernels import tile_kernels
from portable_kernels.layouts import SM90, SM100
from portable_kernels.core.numerics import calc_diff
from portable_kernels.testing.moe_gate_cases import _routed_ids
from portable_kernels.testing.moe_routing_cases import check_gate

# Upstream signatures (TileKernels, deepseek-ai/TileKernels at 36d9e45): name -> parameters in order
# (a default is written name=value). The port must take the same arguments the same way.
SIGNATURES = {
    "moe.get_fused_mapping": "topk_idx num_experts num_expanded_tokens alignment force_no_sync=False",
    "moe.reduce_fused": "x topk_weights token_topk_to_pos fp8_format='' sf=None out=None",
    "moe.expand_to_fused": "x token_topk_to_pos pos_to_expert",
    "moe.expand_to_fused_with_sf": "x num_per_channels token_topk_to_pos pos_to_expert "
                                   "use_tma_aligned_col_major_sf=False",
    "moe.inplace_unique_group_indices": "group_indices num_groups",
    "moe.aux_fi": "topk_idx num_experts num_aux_topk",
    "moe.group_count": "group_idx num_groups",
    "moe.mask_indices_by_tp": "indices n num_ep_ranks tp_rank num_tp_ranks",
    "moe.normalize_weight": "topk_weights",
    "moe.top2_sum_gate": "logits bias num_topk num_topk_groups num_groups use_shared_as_routed num_shared_experts "
                         "routed_scaling_factor ep_rank num_ep_ranks tp_rank num_tp_ranks scoring_func mask=None "
                         "fix_routing_mask=None to_physical_map=None logical_count=None unmapped_topk_idx=None",
    "moe.topk_gate": "scores num_topk",
    "moe.topk_sum_and_topk_group_idx": "scores num_topk_sum num_topk_groups",
    "quant.per_token_cast": "x fmt num_per_channels x_block_size=None use_tma_aligned_col_major_sf=False "
                            "round_sf=False use_packed_ue8m0=False",
    "quant.per_token_cast_with_sf_only": "x fmt num_per_channels x_block_size=None "
                                         "use_tma_aligned_col_major_sf=False round_sf=False use_packed_ue8m0=False",
    "quant.per_token_cast_with_precomputed_sf": "x fmt num_per_channels sf x_block_size=None "
                                                "use_tma_aligned_col_major_sf=False round_sf=False "
                                                "use_packed_ue8m0=False",
    "quant.per_block_cast": "x fmt block_size use_tma_aligned_col_major_sf=False round_sf=False "
                            "use_packed_ue8m0=False",
    "quant.per_block_cast_with_sf_only": "x fmt block_size use_tma_aligned_col_major_sf=False round_sf=False "
                                         "use_packed_ue8m0=False",
    "quant.per_block_cast_with_precomputed_sf": "x fmt block_size sf use_tma_aligned_col_major_sf=False "
                                                "round_sf=False use_packed_ue8m0=False",
    "quant.per_channel_cast": "x fmt num_per_tokens round_sf=False",
    "quant.per_channel_cast_and_transpose": "x fmt num_per_tokens round_sf=False",
    "quant.per_channel_cast_fused": "x fmt num_per_tokens round_sf=False num_per_channels=None pos_to_token=None",
    "quant.cast_back": "x fmt x_block_size x_special_fmt=None",
    "quant.per_token_cast_back": "x fmt num_per_channels x_special_fmt=None",
    "quant.swiglu_forward_and_per_token_cast": "x fmt num_per_channels pos_to_token_topk=None topk_weights=None "
                                               "pos_to_expert=None use_tma_aligned_col_major_sf=False round_sf=False "
                                               "use_packed_ue8m0=False swiglu_clamp_value=None clamped_count=None "
                                               "sf_clamp_min=None",
    "quant.swiglu_forward_and_per_channel_cast_and_transpose": "x fmt num_per_tokens round_sf=False "
                                                               "without_transpose=False swiglu_clamp_value=None",
    "quant.unpack_from_e2m1fn_x2": "x out_dtype=torch.float32",
    "quant.per_block_cast_lossless": "x fmt x_block_size out_block_size use_tma_aligned_col_major_sf=False "
                                     "round_sf=False use_packed_ue8m0=False",
    "quant.swiglu_backward_and_per_token_cast": "x grad_out weight pos_to_token_topk token_topk_to_pos "
                                                "num_per_channels round_sf=False swiglu_clamp_value=None",
    "transpose.transpose": "x",
    "transpose.batched_transpose": "x",
    "config.set_num_sms": "num_sms",
    "config.get_num_sms": "",
    "config.get_device_num_sms": "",
}


def _signature(fn) -> str:
    parts = []
    for p in inspect.signature(fn).parameters.values():
        parts.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return " ".join(parts)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_upstream_name_has_upstream_signature(name):
    module, attr = name.split(".")
    fn = getattr(getattr(tile_kernels, module), attr)
    assert _signature(fn) == SIGNATURES[name]


# ------------------------------------------------------------------------------------------- quant

CAST_PARAMS = [
    dict(num_tokens=t, hidden=h, fmt=fmt, storage=storage, num_per_channels=per, dtype=dtype)
    for t, h in ((37, 576), (4, 2048))
    for fmt in ("e4m3", "e2m1")
    # TileKernels' test grid pairs the storage flags so: (col-major, round_sf, packed)
    for storage in ((False, True, False), (True, True, True), (False, False, False), (True, False, False))
    for per in (32, 128, h)
    for dtype in (torch.float32, torch.bfloat16)
]


def _id(p: dict) -> str:
    return "-".join(f"{k}={str(v).replace('torch.', '')}" for k, v in p.items())


def _check_storage(sf: torch.Tensor, want: torch.Tensor, col_major: bool, packed: bool) -> None:
    rows = want.shape[0]
    if packed:
        assert sf.dtype == torch.int32 and torch.equal(sf, packed_words(want))
    else:
        assert sf.dtype == torch.float32 and torch.equal(sf, want)
    if col_major and rows:
        assert sf.stride() == (1, -(-rows // 4) * 4)


@pytest.mark.parametrize("params", CAST_PARAMS, ids=_id)
def test_per_token_cast(params):
    torch.manual_seed(0)
    col_major, round_sf, packed = params["storage"]
    x = (torch.randn(params["num_tokens"], params["hidden"]) * 3).to(params["dtype"])
    x[1] = 0  # an all-zero token: the amax floor decides its scale (2^-126 for FP4)
    data, sf = tile_kernels.quant.per_token_cast(x, params["fmt"], params["num_per_channels"], None, col_major,
                                                 round_sf, packed)
    want, want_sf = tile_cast(x, params["fmt"], (1, params["num_per_channels"]), round_sf)
    assert data.dtype == want.dtype and torch.equal(data.view(torch.uint8), want.view(torch.uint8))
    _check_storage(sf, want_sf, col_major, packed)
    back = tile_kernels.quant.per_token_cast_back((data, sf), "fp32", params["num_per_channels"])
    assert calc_diff(back, x) < (2e-2 if params["fmt"] == "e2m1" else 1e-3)  # TileKernels' cast_back bar
    assert torch.equal(tile_kernels.quant.per_token_cast_with_sf_only(x, params["fmt"], params["num_per_channels"],
                                                                      None, col_major, round_sf, packed), sf)
    again = tile_kernels.quant.per_token_cast_with_precomputed_sf(x, params["fmt"], params["num_per_channels"], sf)
    want_again, _ = tile_cast(x, params["fmt"], (1, params["num_per_channels"]), sf=want_sf)
    assert torch.equal(again.view(torch.uint8), want_again.view(torch.uint8))
    if round_sf:  # x · 1/sf is x · (max/amax) exactly when sf is a power of two (TileKernels' test)
        assert torch.equal(again.view(torch.uint8), data.view(torch.uint8))


@pytest.mark.parametrize("fmt,round_sf", itertools.product(("e4m3", "e2m1"), (False, True)))
def test_casts_are_byte_exact_on_rounding_ties(fmt, round_sf):
    x = near_midpoints(96, 512, fmt, seed=7)
    for block in ((1, 128), (128, 128), (32, 1)):
        if fmt == "e2m1" and block[1] == 1:
            continue
        data, sf = tile_kernels.quant.per_block_cast(x, fmt, block, round_sf=round_sf)
        want, want_sf = tile_cast(x, fmt, block, round_sf)
        assert torch.equal(data.view(torch.uint8), want.view(torch.uint8)) and torch.equal(sf, want_sf)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_tile_kernels_rule_differs_from_the_top_level_cast_at_ties(fmt):
    """The tile_kernels names must not fall back to the top-level rule (x / sf)."""
    x = near_midpoints(64, 256, fmt, seed=3)
    data, _ = tile_kernels.quant.per_token_cast(x, fmt, 128)
    top = pk.per_token_cast_to_fp8(x) if fmt == "e4m3" else pk.per_token_cast_to_fp4(x, gran_k=128, use_ue8m0=False)
    assert (data.view(torch.uint8) != top.data.view(torch.uint8)).sum() > 0


def test_fp4_bytes_tile_kernels_style():
    x = torch.tensor([[0.0] * 32, [-1e-30, 0.75, 1.75, 3.5, 5.0, 0.25, -2.5, 6.0] * 4])
    data, sf = tile_kernels.quant.per_token_cast(x, "e2m1", 32, round_sf=True)
    assert data.dtype == torch.int8 and sf[0, 0].item() == 2.0 ** -126  # all-zero block: TileKernels' floor
    assert pk.per_token_cast_to_fp4(x).scale[0, 0].item() == 2.0 ** -15  # the top-level choice differs
    codes = tile_kernels.quant.unpack_from_e2m1fn_x2(data)[1, :8]
    assert codes.tolist() == [-0.0, 1.0, 2.0, 4.0, 4.0, 0.0, -2.0, 6.0]  # ties to even
    assert torch.signbit(codes[0])  # a tiny negative gives -0


@pytest.mark.parametrize("x_block,fmt,in_fmt", itertools.product(((128, 128), (32, 32)), ("e4m3", "e2m1"),
                                                                  ("e4m3", "e2m1")))
def test_per_token_cast_of_a_quantized_input(x_block, fmt, in_fmt):
    torch.manual_seed(1)
    x = torch.randn(130, 256, dtype=torch.bfloat16)
    quantized = tile_kernels.quant.per_block_cast(x, in_fmt, x_block, True, True, True)
    data, sf = tile_kernels.quant.per_token_cast(quantized, fmt, 32, x_block, round_sf=True)
    values = tile_kernels.quant.cast_back(quantized, "fp32", x_block)
    want, want_sf = tile_cast(values, fmt, (1, 32), True)
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8)) and torch.equal(sf, want_sf)


@pytest.mark.parametrize("round_sf", [False, True])
def test_per_channel_cast(round_sf):
    torch.manual_seed(2)
    x = torch.randn(256, 576, dtype=torch.bfloat16)
    data, sf = tile_kernels.quant.per_channel_cast(x, "e4m3", 128, round_sf)
    want, want_sf = tile_cast(x, "e4m3", (128, 1), round_sf)
    assert sf.shape == (2, 576) and torch.equal(sf, want_sf)
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))
    t_data, t_sf = tile_kernels.quant.per_channel_cast_and_transpose(x, "e4m3", 128, round_sf)
    assert t_data.is_contiguous() and torch.equal(t_data.view(torch.uint8), data.t().view(torch.uint8))
    assert torch.equal(t_sf, sf)


@pytest.mark.parametrize("quantized", [False, True])
def test_per_channel_cast_fused(quantized):
    torch.manual_seed(4)
    x = torch.randn(96, 512, dtype=torch.bfloat16)
    pos_to_token = torch.randint(-1, 96, (256,), dtype=torch.int32)
    source = tile_kernels.quant.per_token_cast(x, "e4m3", 128) if quantized else x
    data, sf = tile_kernels.quant.per_channel_cast_fused(source, "e4m3", 128, False, 128 if quantized else None,
                                                         pos_to_token)
    values = tile_kernels.quant.per_token_cast_back(source, "fp32", 128) if quantized else x.float()
    gathered = torch.where((pos_to_token >= 0)[:, None], values[pos_to_token.long().clamp(min=0)], 0.0)
    want, want_sf = tile_cast(gathered, "e4m3", (128, 1))
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8)) and torch.equal(sf, want_sf)


def test_scale_storage_is_the_sm90_and_sm100_formats_for_per_token_scales():
    torch.manual_seed(3)
    x = torch.randn(37, 1024)
    q = pk.QuantTensor(*tile_cast(x, "e4m3", (1, 128), True), (1, 128), True)
    _, col = tile_kernels.quant.per_token_cast(x, "e4m3", 128, None, True, True, False)
    _, words = tile_kernels.quant.per_token_cast(x, "e4m3", 128, None, True, True, True)
    sm90, sm100 = SM90.encode(q).scale, SM100.encode(q).scale
    assert torch.equal(col, sm90) and col.stride() == sm90.stride()
    assert torch.equal(words, sm100) and words.stride() == sm100.stride()


def _swiglu_inputs(m: int, hidden: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * hidden, generator=g).to(torch.bfloat16)
    pos_to_expert = torch.randint(0, 4, (m,), generator=g, dtype=torch.int32)
    pos_to_expert[::5] = -1
    pos_to_token_topk = torch.randperm(m, generator=g).to(torch.int32)
    pos_to_token_topk[pos_to_expert < 0] = -1
    weights = torch.rand(m // 2 + 1, 2, generator=g)
    return x, pos_to_expert, pos_to_token_topk, weights


@pytest.mark.parametrize("storage,per,with_weights,clamp", itertools.product(
    ((False, True, False), (True, True, True), (False, False, False)), (128, 0), (False, True), (None, 0.5)))
def test_swiglu_forward_and_per_token_cast(storage, per, with_weights, clamp):
    col_major, round_sf, packed = storage
    x, pos_to_expert, p2tt, weights = _swiglu_inputs(64, 256, seed=5)
    counts = torch.zeros(3, dtype=torch.int64) if clamp is not None else None
    kw = dict(pos_to_token_topk=p2tt, topk_weights=weights) if with_weights else {}
    data, sf = tile_kernels.quant.swiglu_forward_and_per_token_cast(
        x, "e4m3", per, pos_to_expert=pos_to_expert, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
        use_packed_ue8m0=packed, swiglu_clamp_value=clamp, clamped_count=counts, **kw)
    # TileKernels' test: SwiGLU values (padding rows zero), then its cast
    y = pk.swiglu_forward(x, kw.get("pos_to_token_topk"), kw.get("topk_weights"), clamp, pos_to_expert=pos_to_expert)
    want, want_sf = tile_cast(y, "e4m3", (1, per or 256), round_sf)
    assert torch.equal(data.view(torch.uint8), want.view(torch.uint8))
    _check_storage(sf, want_sf, col_major, packed)
    if clamp is not None:
        gate, up = x[pos_to_expert >= 0].float().chunk(2, -1)
        assert counts.tolist() == [(gate > clamp).sum(), (up > clamp).sum(), (up < -clamp).sum()]


def test_swiglu_values_agree_with_tile_kernels_formula_to_an_ulp():
    x, _, _, _ = _swiglu_inputs(512, 512, seed=6)
    y = pk.swiglu_forward(x)
    assert (y - tile_swiglu(x)).abs().max() <= 2 * torch.finfo(torch.float32).eps * tile_swiglu(x).abs().max()
    data, _ = tile_kernels.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, round_sf=True)
    want, _ = tile_cast(tile_swiglu(x), "e4m3", (1, 128), True)
    assert (data.view(torch.uint8) != want.view(torch.uint8)).float().mean() < 1e-3  # only ulp-boundary codes


@pytest.mark.parametrize("round_sf", [False, True])
def test_swiglu_per_channel_cast_rounds_the_activation_to_bf16_first(round_sf):
    x, *_ = _swiglu_inputs(256, 384, seed=9)
    data, sf = tile_kernels.quant.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", 128, round_sf,
                                                                                    without_transpose=True)
    want_data, want_sf = tile_cast(pk.swiglu_forward(x).to(torch.bfloat16).float(), "e4m3", (128, 1), round_sf)
    assert torch.equal(sf, want_sf)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))


def test_swiglu_sf_clamp_min_is_the_amax_floor():
    x, *_ = _swiglu_inputs(8, 128, seed=7)
    _, sf = tile_kernels.quant.swiglu_forward_and_per_token_cast(x * 1e-6, "e4m3", 128, sf_clamp_min=1.0)
    assert torch.equal(sf, torch.full_like(sf, 1.0) / 448.0)


def test_swiglu_fused_and_two_step_paths_give_the_same_bytes():
    x, pos_to_expert, p2tt, weights = _swiglu_inputs(48, 384, seed=8)
    fused = tile_kernels.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, p2tt, weights, pos_to_expert,
                                                                 round_sf=True)
    two_step = tile_kernels.quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, p2tt, weights, pos_to_expert,
                                                                    round_sf=True, sf_clamp_min=1e-4 * (1 + 2 ** -20))
    assert torch.equal(fused[0].view(torch.uint8), two_step[0].view(torch.uint8)) and torch.equal(fused[1],
                                                                                                  two_step[1])


@pytest.mark.parametrize("bad", [dict(fmt="e5m2"), dict(use_packed_ue8m0=True), dict(x_block_size=(1, 128)),
                                 dict(num_per_channels=0)])
def test_cast_refusals_name_the_argument(bad):
    args = dict(x=torch.randn(4, 128), fmt="e4m3", num_per_channels=128, **{})
    args.update(bad)
    arg = next(iter(bad))
    with pytest.raises(pk.ContractError, match=f"'{arg}'"):
        tile_kernels.quant.per_token_cast(**args)


# ------------------------------------------------------------------------------------------- moe

# TileKernels' test_top2_sum_gate configs: (num_groups, num_topk_groups, routed experts, shared, num_topk)
GATE_CONFIGS = [(0, 0, 72, 1, 6), (0, 0, 32, 2, 6), (0, 0, 144, 2, 6), (8, 8, 256, 2, 8), (8, 4, 256, 2, 8)]


@pytest.mark.parametrize("config", GATE_CONFIGS, ids=str)
def test_top2_sum_gate(config):
    num_groups, num_topk_groups, experts, shared_n, num_topk = config
    num_extra, num_ep, num_tp, tokens, padded = 32, 4, 2, 40, 10
    for tp_rank, scoring, fix, shared in itertools.product(range(num_tp), ("sigmoid", "sqrtsoftplus", "softmax"),
                                                           (False, True), (False, True)):
        if shared and not (num_topk % shared_n == 0 and experts % (num_topk // shared_n) == 0):
            continue
        torch.manual_seed(tp_rank)
        logits, bias = torch.randn(tokens + padded, experts), torch.randn(experts)
        mask = torch.ones(tokens + padded, dtype=torch.bool)
        mask[-padded:] = False
        table = count = None
        if shared:  # TileKernels' test: the identity map, replicated over num_extra + 1 columns
            table = torch.arange(experts + shared_n, dtype=torch.int32)[:, None].expand(-1, num_extra + 1).contiguous()
            count = torch.ones(experts + shared_n, dtype=torch.int32)
        unmapped = torch.zeros(tokens + padded, num_topk, dtype=torch.int64)
        fix_mask = None
        if fix:
            fix_mask = torch.ones(tokens + padded, dtype=torch.bool)
            unmapped = torch.randint(0, experts, unmapped.shape, generator=torch.Generator().manual_seed(42))
        given = unmapped.clone()
        idx, w = tile_kernels.moe.top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, shared, shared_n,
                                                1.5, 0, num_ep, tp_rank, num_tp, scoring, mask, fix_mask, table, count,
                                                unmapped)
        s = shared_n if shared else 0
        assert idx.shape == (tokens + padded, num_topk + s) and idx.dtype == torch.int64
        if fix:
            assert torch.equal(unmapped[:tokens], given[:tokens])
        else:
            check_gate(logits, bias, num_topk, num_topk_groups, num_groups, unmapped, w[:, :num_topk],
                       routed_scaling_factor=1.5, scoring_func=scoring, mask=mask)
        assert (unmapped[tokens:] == -1).all()
        want = _routed_ids(unmapped, experts, s, table, count, 0, num_ep, tp_rank, num_tp)
        assert torch.equal(idx, want)


def test_top2_sum_gate_sort_stability():
    """TileKernels' stability check: all-zero logits pick the first experts of the rank, in order."""
    experts, num_topk, num_ep = 256, 8, 4
    logits, bias = torch.zeros(16, experts), torch.zeros(experts)
    idx, _ = tile_kernels.moe.top2_sum_gate(logits, bias, num_topk, 4, 8, False, 0, 1.5, 0, num_ep, 0, 2, "sigmoid")
    on_rank = min(experts // num_ep, num_topk)
    assert torch.equal(idx[:, :on_rank], torch.arange(on_rank).expand(16, on_rank))


def _topk_idx(tokens: int, experts: int, topk: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens, experts, generator=g).argsort(1)[:, :topk]
    idx[torch.rand(tokens, topk, generator=g) < 0.1] = -1
    return idx


@pytest.mark.parametrize("experts,topk", [(72, 6), (256, 8), (16, 6)])
def test_topk_gate_and_group_selection(experts, topk):
    scores = torch.randn(401, experts)
    want = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :topk]
    assert torch.equal(tile_kernels.moe.topk_gate(scores, topk), want)
    for groups, n, kg in ((8, 2, 4), (4, 1, 2)):
        if experts % groups:
            continue
        grouped = scores.view(401, groups, -1)
        sums = grouped.topk(n, dim=-1).values.sum(-1)
        want = torch.sort(sums, dim=1, descending=True, stable=True).indices[:, :kg]
        assert torch.equal(tile_kernels.moe.topk_sum_and_topk_group_idx(grouped, n, kg), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_x_sf", [False, True])
def test_reduce_fused_rounds_each_term_once_like_tile_kernels(dtype, with_x_sf):
    pytest.importorskip("triton")
    t, k, rows, h = 40, 6, 300, 256
    g = torch.Generator().manual_seed(11)
    x = torch.randn(rows, h, generator=g).to(dtype)
    weights = torch.rand(t, k, generator=g)
    ttp = torch.randint(-1, rows, (t, k), generator=g, dtype=torch.int32)
    x_sf = torch.rand(rows, generator=g) if with_x_sf else None
    got = tile_kernels.moe.reduce_fused((x, x_sf) if with_x_sf else x, weights, ttp)
    want = tile_reduce(x, weights, ttp, x_sf).to(dtype)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_normalize_weight_sums_from_the_epsilon_in_slot_order():
    import numpy as np
    w = torch.rand(2878, 6, generator=torch.Generator().manual_seed(12))  # torch.sum orders 6 columns otherwise
    acc = np.full(w.shape[0], 1e-20, dtype=np.float32)
    for slot in range(w.shape[1]):
        acc = (acc + w[:, slot].numpy()).astype(np.float32)  # TileKernels: acc = 1e-20; acc += w_i
    denominator, normalized = tile_kernels.moe.normalize_weight(w)
    assert torch.equal(denominator, torch.from_numpy(acc))
    assert torch.equal(normalized, w / torch.from_numpy(acc)[:, None])


def test_topk_gate_and_group_selection_return_contiguous_tensors():
    scores = torch.randn(33, 72)
    assert tile_kernels.moe.topk_gate(scores, 6).stride() == (6, 1)
    assert tile_kernels.moe.topk_sum_and_topk_group_idx(scores.view(33, 8, 9), 2, 4).stride() == (4, 1)


@pytest.mark.parametrize("experts,topk,aux", [(72, 6, 1), (256, 8, 8), (9, 2, 2)])
def test_counts(experts, topk, aux):
    idx = _topk_idx(401, experts, topk, seed=experts)
    counts = torch.bincount(idx[idx >= 0], minlength=experts)
    assert torch.equal(tile_kernels.moe.group_count(idx, experts), counts.to(torch.int32))
    fi = tile_kernels.moe.aux_fi(idx, experts, aux)
    assert calc_diff(fi, counts.double() * experts / (401 * aux)) < 2e-7  # TileKernels' bar


@pytest.mark.parametrize("num_tp_ranks", [2, 4, 8])
def test_mask_indices_by_tp(num_tp_ranks):
    per_rank, num_ep = 4, 64
    idx = _topk_idx(300, per_rank * num_ep, 8, seed=num_tp_ranks)
    for tp_rank in range(num_tp_ranks):
        out = tile_kernels.moe.mask_indices_by_tp(idx, per_rank * num_ep, num_ep, tp_rank, num_tp_ranks)
        rank = torch.div(idx, per_rank, rounding_mode="floor")
        keep = (idx >= 0) & (rank % num_tp_ranks == tp_rank)
        want = torch.where(keep, torch.div(rank, num_tp_ranks, rounding_mode="floor") * per_rank + idx % per_rank, -1)
        assert torch.equal(out, want)


def test_inplace_unique_group_indices():
    groups = torch.div(_topk_idx(300, 256, 9, seed=4), 32, rounding_mode="floor")
    got = groups.clone()
    assert tile_kernels.moe.inplace_unique_group_indices(got, 8) is None
    for row, out in zip(groups.tolist(), got.tolist()):
        assert out == [v if v not in row[:j] else -1 for j, v in enumerate(row)]


@pytest.mark.parametrize("col_major,packed", [(False, False), (True, False), (True, True)])
def test_expand_to_fused_with_sf(col_major, packed):
    idx = _topk_idx(97, 16, 4, seed=9)
    pos_to_expert, pos_to_token, _, token_topk_to_pos, *_ = tile_kernels.moe.get_fused_mapping(idx, 16, 0, 16)
    x = torch.randn(97, 512, dtype=torch.bfloat16)
    x_fp8, x_sf = tile_kernels.quant.per_token_cast(x, "e4m3", 128, None, col_major, True, packed)
    out, out_sf = tile_kernels.moe.expand_to_fused_with_sf((x_fp8, x_sf.contiguous()), 128, token_topk_to_pos,
                                                           pos_to_expert, col_major)
    src, valid = pos_to_token.long().clamp(min=0), (pos_to_token >= 0)[:, None]
    assert torch.equal(out.view(torch.uint8), torch.where(valid, x_fp8.view(torch.uint8)[src], 0))
    assert out_sf.dtype == x_sf.dtype and torch.equal(out_sf, torch.where(valid, x_sf[src], 0))
    if col_major:
        assert out_sf.stride() == (1, -(-out_sf.shape[0] // 4) * 4)


def test_config_and_transpose():
    count = tile_kernels.get_device_num_sms()
    tile_kernels.set_num_sms(max(count - 1, 1))
    assert tile_kernels.get_num_sms() == max(count - 1, 1) and tile_kernels.config.get_num_sms() == max(count - 1, 1)
    with pytest.raises(pk.ContractError, match="'num_sms'"):
        tile_kernels.set_num_sms(count + 1)
    x = torch.randn(3, 64, 128)
    assert torch.equal(tile_kernels.transpose.batched_transpose(x), x.transpose(1, 2))
    assert tile_kernels.transpose.transpose(x[0]).is_contiguous()


def test_porting_doc_tables_and_snippet_match_the_module():
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "porting.md").read_text()
    section = text.split("## TileKernels", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {name: row for row in rows for name in re.findall(r"`(?:functional\.)?(\w+)`", row.split("|")[1])}
    provided = {name for name, row in listed.items() if "not provided:" not in row.split("|")[2][:20]}
    ported = {name.split(".")[1] for name in SIGNATURES}
    # the mHC names (modeling.mhc.ops / .functional) are checked against those modules
    from portable_kernels.tile_kernels.modeling.mhc import functional, ops as mhc_ops
    mhc = provided - ported
    assert mhc and all(hasattr(mhc_ops, n) or hasattr(functional, n) for n in mhc), sorted(mhc)
    assert ported <= provided and len(listed) == 47
    assert f"Provided: {len(provided)} of {len(listed)} names" in section
    after = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0].split("# after", 1)[1]
    exec(after, {})
