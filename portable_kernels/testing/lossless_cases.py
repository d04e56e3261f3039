"""Conformance cases for per_block_cast_lossless (TileKernels' exact E2M1 -> E4M3 recast) and
swiglu_backward_and_per_token_cast (SwiGLU's backward with the per-token FP8 cast of the input
gradient): bytes against the references, the recast's values kept exactly, edge scales and codes,
refusals. The input builders are shared with the tests and the custom-op cases."""

from __future__ import annotations

import functools

import torch

from ..layouts.fp4 import e2m1_decode, pack_e2m1, unpack_e2m1
from ..ops.quant.block_cast import block_cast
from ..ops.quant.lossless import PER_BLOCK_CAST_LOSSLESS, lossless_cast_reference, per_block_cast_lossless
from ..ops.swiglu_backward import SWIGLU_BACKWARD, swiglu_backward_and_per_token_cast, swiglu_backward_reference
from .checks import assert_close, assert_refused
from .core import Case, CaseFailure, conformance_cases
from .generators import randn

#: ((M, K), input block, output block): TileKernels' three output blocks, a partial last block
LOSSLESS_QUICK = [((64, 256), (1, 32), (1, 128)), ((70, 256), (1, 32), (32, 32)), ((130, 512), (1, 32), (128, 128)),
                  ((5, 96), (1, 32), (1, 64))]
LOSSLESS_FULL = LOSSLESS_QUICK + [((512, 7168), (1, 32), (128, 128)), ((257, 2048), (32, 32), (128, 128))]
#: (M, H, tokens, topk, num_per_channels, round_sf, clamp)
BACKWARD_QUICK = [(40, 256, 8, 6, 128, False, None), (33, 128, 16, 3, 32, True, 0.5), (17, 512, 4, 4, 128, True, 10.0)]
BACKWARD_FULL = BACKWARD_QUICK + [(300, 2048, 64, 6, 128, False, 10.0), (256, 1024, 32, 8, 32, True, None)]


def fp4_input(m: int, k: int, block: tuple[int, int], seed: int, device: str | torch.device = "cpu",
              spread: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [M, K/2] packed E2M1, fp32 power-of-two scales) of seeded values, as TileKernels' test
    builds them (|x| kept >= amax / 2^9, so one output block's scales stay within 2^11)."""
    x = randn(m, k, seed=seed, device=device, scale=spread)
    floor = x.abs().amax() / 2 ** 9
    x = torch.sign(x) * torch.maximum(x.abs(), floor)
    q = block_cast(x, "e2m1", block, True)
    return q.data, q.scale


def fp4_values(data: torch.Tensor, sf: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """fp32 values of packed E2M1 data with block scales (code · sf)."""
    m, k = data.shape[0], data.shape[1] * 2
    scale = sf.repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :k]
    return e2m1_decode(unpack_e2m1(data.cpu())) * scale.cpu()


def fp8_values(data: torch.Tensor, sf: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    m, k = data.shape
    scale = sf.repeat_interleave(block[0], 0)[:m].repeat_interleave(block[1], 1)[:, :k]
    return data.cpu().float() * scale.cpu()


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        raise CaseFailure(f"{what}: {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}")
    a, b = got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)
    if not torch.equal(a, b):
        raise CaseFailure(f"{what}: {int((a != b).sum())} of {a.numel()} bytes differ from the reference")


def _check_lossless(shape, ib, ob, seed, device) -> float:
    data, sf = fp4_input(*shape, ib, seed, device)
    out, out_sf = per_block_cast_lossless(data, sf, ib, ob)
    want = lossless_cast_reference(data.cpu(), sf.cpu(), ib, ob)
    _same(out, want[0], "data")
    _same(out_sf, want[1], "scale")
    if not torch.equal(fp8_values(out, out_sf, ob), fp4_values(data, sf, ib)):
        raise CaseFailure("the recast's values differ from the input's")
    return 0.0


def edge_fp4_input(device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Every E2M1 code (both zeros included) under scales 2^11 apart in one (32, 64) output block,
    plus extreme exponents (2^-120 .. 2^125) in other blocks: 64 x 128 per (1, 32)."""
    codes = (torch.arange(64 * 128, device=device) % 16).to(torch.uint8).view(64, 128)
    exps = torch.zeros(64, 4, dtype=torch.int32, device=device)
    exps[:32, :2] = torch.arange(64, device=device).view(32, 2) % 12 - 11  # 2^-11 .. 2^0 in one block
    exps[32:, 2:] = 125   # near the largest scale (6 · 2^125 stays finite)
    exps[:32, 2:] = -113  # the output scale 2^-119
    exps[32:, :2] = -120  # the smallest accepted largest scale
    sf = torch.ldexp(torch.ones(64, 4, device=device), exps.float())
    return pack_e2m1(codes), sf


def _check_edges(seed, device) -> float:
    data, sf = edge_fp4_input(device)
    for ob in ((32, 64), (1, 64), (2, 32)):
        out, out_sf = per_block_cast_lossless(data, sf, (1, 32), ob)
        want = lossless_cast_reference(data.cpu(), sf.cpu(), (1, 32), ob)
        _same(out, want[0], f"data per {ob}")
        _same(out_sf, want[1], f"scale per {ob}")
        if not torch.equal(fp8_values(out, out_sf, ob), fp4_values(data, sf, (1, 32))):
            raise CaseFailure(f"values per {ob} differ from the input's")
    return 0.0


def _refuse_span(seed, device) -> float:
    data, sf = fp4_input(8, 64, (1, 32), seed, device)
    sf = sf.clone()
    sf[3, 1] = sf[:, :].max() * 2.0 ** 12  # 2^12 above the others: the smallest lose bits in E4M3
    return assert_refused(lambda: per_block_cast_lossless(data, sf, (1, 32), (8, 64)), "sf", sf)


def _refuse_not_power_of_two(seed, device) -> float:
    data, sf = fp4_input(4, 64, (1, 32), seed, device)
    sf = sf.clone()
    sf[1, 0] *= 1.5
    return assert_refused(lambda: per_block_cast_lossless(data, sf, (1, 32), (1, 64)), "sf", sf)


@conformance_cases("per_block_cast_lossless")
def lossless_cases(quick: bool) -> list[Case]:
    op = PER_BLOCK_CAST_LOSSLESS.name
    cases = []
    for i, (shape, ib, ob) in enumerate(LOSSLESS_QUICK if quick else LOSSLESS_FULL):
        seed = 7700 + i
        cases.append(Case(op, f"shape={shape} {ib} -> {ob}", seed, functools.partial(_check_lossless, shape, ib, ob,
                                                                                     seed)))
    cases.append(Case(op, "every code, scales 2^11 apart, extreme exponents", 7720, functools.partial(_check_edges,
                                                                                                       7720)))
    cases.append(Case(op, "refuses scales more than 2^11 apart", 7730, functools.partial(_refuse_span, 7730)))
    cases.append(Case(op, "refuses a non-power-of-two scale", 7740, functools.partial(_refuse_not_power_of_two, 7740)))
    return cases


def swiglu_backward_inputs(m: int, h: int, tokens: int, topk: int, num_per_channels: int, seed: int,
                           device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """(x_data e4m3 [M, 2H], x_sf, grad_out bf16 [M, H], weight fp32 [T, K], pos_to_token_topk int32
    [M] (every 5th row padding, the others distinct slots), token_topk_to_pos int32 [T, K])."""
    g = torch.Generator().manual_seed(seed)
    slots = tokens * topk
    if m > slots + m // 5 + 1:
        raise ValueError(f"swiglu_backward_inputs: {m} rows need more than {slots} (token, topk) slots")
    p = torch.full((m,), -1, dtype=torch.int32)
    rows = [r for r in range(m) if r % 5 != 4][:slots]
    p[rows] = torch.randperm(slots, generator=g)[: len(rows)].int()
    t2p = torch.full((tokens, topk), -1, dtype=torch.int32)
    t2p.view(-1)[p[rows].long()] = torch.tensor(rows, dtype=torch.int32)
    x = randn(m, 2 * h, seed=seed + 1, dtype=torch.bfloat16, scale=2.0)
    q = block_cast(x, "e4m3", (1, num_per_channels), False)
    weight = torch.rand(tokens, topk, generator=g)
    grad = randn(m, h, seed=seed + 2, dtype=torch.bfloat16)
    return tuple(t.to(device) for t in (q.data, q.scale, grad, weight, p, t2p))


def _check_backward(params, seed, device) -> float:
    m, h, tokens, topk, per, round_sf, clamp = params
    args = swiglu_backward_inputs(m, h, tokens, topk, per, seed, device)
    got = swiglu_backward_and_per_token_cast(*args, per, round_sf, clamp)
    want = swiglu_backward_reference(*(a.cpu() for a in args), per, round_sf, clamp)
    for name, a, b in zip(("out", "x_grad_fp8", "x_grad_sf", "x_grad"), got[:4], want[:4]):
        _same(a, b, name)
    return assert_close(got[4], want[4], 1e-10, "weight_grad")


def _refuse_mapping(seed, device) -> float:
    args = list(swiglu_backward_inputs(10, 128, 4, 4, 128, seed, device))
    args[4] = args[4].clone()
    args[4][2] = 16  # one past the last (token, topk) slot
    return assert_refused(lambda: swiglu_backward_and_per_token_cast(*args, 128), "pos_to_token_topk", args[4])


@conformance_cases("swiglu_backward_and_per_token_cast")
def swiglu_backward_cases(quick: bool) -> list[Case]:
    op = SWIGLU_BACKWARD.name
    cases = []
    for i, params in enumerate(BACKWARD_QUICK if quick else BACKWARD_FULL):
        seed = 7800 + 10 * i
        cases.append(Case(op, "M={} H={} T={} K={} n={} round_sf={} clamp={}".format(*params), seed,
                          functools.partial(_check_backward, params, seed)))
    cases.append(Case(op, "refuses a slot outside weight", 7890, functools.partial(_refuse_mapping, 7890)))
    return cases


__all__ = ["edge_fp4_input", "fp4_input", "fp4_values", "fp8_values", "swiglu_backward_inputs"]
