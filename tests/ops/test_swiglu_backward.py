"""swiglu_backward_and_per_token_cast (TileKernels' SwiGLU backward + per-token FP8 cast of the
input gradient): the reference against independent float64 math, its one-rounding fma, edge
rows (padding, clamp boundaries, zero blocks), refusals naming the argument, and the tile_kernels
drop-in on TileKernels' test data (routing of get_fused_mapping, shrunk)."""

import math
import random
from fractions import Fraction

import pytest
import torch

import portable_kernels.tile_kernels as tk
from portable_kernels.core.errors import ContractError
from portable_kernels.core.numerics import calc_diff
from portable_kernels.ops.swiglu_backward import fma_f32, swiglu_backward_and_per_token_cast, swiglu_backward_reference
from portable_kernels.testing.generators import randn
from portable_kernels.testing.lossless_cases import swiglu_backward_inputs

F8_MAX = 448.0


def _float64_backward(data, sf, grad, weight, p, n, clamp):
    """out, x_grad, weight_grad in float64, written independently of the reference."""
    m, two_h = data.shape
    h = two_h // 2
    x = (data.float() * sf.repeat_interleave(n, 1)).double()  # the contract dequantizes in fp32
    gate, up = x[:, :h].clone(), x[:, h:].clone()
    gate_cl = torch.zeros_like(gate, dtype=torch.bool)
    up_cl = torch.zeros_like(up, dtype=torch.bool)
    if clamp is not None:
        c = float(torch.tensor(clamp, dtype=torch.float32))
        gate_cl, up_cl = gate > c, up.abs() > c
        gate[gate_cl] = c
        up = up.clamp(-c, c)
    sig = 1.0 / (1.0 + torch.exp(-gate))
    w = torch.tensor([float(weight.flatten()[s]) if s >= 0 else 0.0 for s in p.tolist()], dtype=torch.float64)[:, None]
    g = grad.double()
    act = gate * sig * up
    gate_grad = torch.where(gate_cl, 0.0, g * w * sig * up * (1.0 + gate * (1.0 - sig)))
    up_grad = torch.where(up_cl, 0.0, g * w * sig * gate)
    wg = torch.zeros(weight.numel(), dtype=torch.float64)
    dots = (g * act).sum(1)
    for r, s in enumerate(p.tolist()):
        if s >= 0:
            wg[s] = dots[r]
    return act * w, torch.cat([gate_grad, up_grad], 1), wg.view(weight.shape)


def _near(got, want, rel):
    scale = want.abs().max().item()
    return bool(((got.double() - want).abs() <= rel * want.abs() + 1e-6 * scale).all())


@pytest.mark.parametrize(("m", "h", "tokens", "topk", "n", "round_sf", "clamp"), [
    (40, 256, 8, 6, 128, False, None), (33, 128, 16, 3, 32, True, 0.5), (64, 512, 16, 6, 128, True, 10.0),
    (25, 256, 8, 4, 32, False, 1.0)])
def test_reference_against_float64(m, h, tokens, topk, n, round_sf, clamp):
    data, sf, grad, weight, p, t2p = swiglu_backward_inputs(m, h, tokens, topk, n, seed=m + h)
    out, q, q_sf, x_grad, wg = swiglu_backward_and_per_token_cast(data, sf, grad, weight, p, t2p, n, round_sf, clamp)
    out64, x_grad64, wg64 = _float64_backward(data, sf, grad, weight, p, n, clamp)
    assert out.dtype == torch.bfloat16 and x_grad.dtype == torch.bfloat16 and wg.dtype == torch.float32
    assert _near(out, out64, 2.0 ** -8) and _near(x_grad, x_grad64, 2.0 ** -8)
    torch.testing.assert_close(wg.double(), wg64, rtol=1e-4, atol=1e-4)
    back = q.double() * q_sf.double().repeat_interleave(n, 1)
    assert calc_diff(back, x_grad64) < 2e-3
    # TileKernels' scale rule: amax / 448 (floor 1e-4), or its power of two rounded up
    amax = x_grad64.view(m, -1, n).abs().amax(-1).clamp_min(1e-4)
    if round_sf:
        want = torch.exp2(torch.ceil(torch.log2(amax.float() / F8_MAX)))
        assert bool(((q_sf == want) | (q_sf == want / 2) | (q_sf == want * 2)).all())
        assert bool(((q_sf.view(torch.int32) & 0x7FFFFF) == 0).all())
    else:
        assert torch.allclose(q_sf.double(), amax / F8_MAX, rtol=1e-6)


def test_fma_rounds_once():
    rng = random.Random(3)
    a = torch.tensor([rng.uniform(-8, 8) for _ in range(3000)], dtype=torch.float32)
    b = torch.tensor([rng.uniform(0, 1) for _ in range(3000)], dtype=torch.float32)
    got = fma_f32(a, b, 1.0)
    for x, y, r in zip(a.tolist(), b.tolist(), got.tolist()):
        exact = Fraction(x) * Fraction(y) + 1
        below = torch.tensor(r, dtype=torch.float32).nextafter(torch.tensor(-math.inf)).item()
        above = torch.tensor(r, dtype=torch.float32).nextafter(torch.tensor(math.inf)).item()
        assert abs(Fraction(r) - exact) <= min(abs(Fraction(below) - exact), abs(Fraction(above) - exact))
    # a product just above an fp32 midpoint that fp64 rounds onto it: rounding the fp64 sum would
    # tie to even (2^24), the one-rounding fma rounds up (2^24 + 2)
    x = torch.tensor([1 + 2896 * 2.0 ** -23], dtype=torch.float32)
    y = torch.tensor([1 - 2895 * 2.0 ** -23], dtype=torch.float32)
    assert (x.double() * y.double() + 2.0 ** 24).float().item() == 2.0 ** 24
    assert fma_f32(x, y, 2.0 ** 24).item() == 2.0 ** 24 + 2


def test_edge_rows_clamp_boundaries_and_zero_blocks():
    n, h = 32, 64
    data, sf, grad, weight, p, t2p = swiglu_backward_inputs(10, h, 4, 4, n, seed=21)
    x = randn(10, 2 * h, seed=22).clamp(-3, 3)
    x[1, 0], x[1, 1], x[1, h], x[1, h + 1] = 1.0, 1.5, -1.0, 1.5  # clamp 1: at c kept, above clamped
    x[2, :n] = 0.0  # a gate block of zeros: its up_grad block (ws · gate) is zero, the floor sets its scale
    q = tk.quant.per_token_cast(x, "e4m3", num_per_channels=n, round_sf=True)
    out, xq, xq_sf, x_grad, wg = swiglu_backward_and_per_token_cast(q[0], q[1], grad, weight, p, t2p, n, False, 1.0)
    want = swiglu_backward_reference(q[0], q[1], grad, weight, p, t2p, n, False, 1.0)
    for a, b in zip((out, xq, xq_sf, x_grad, wg), want):
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
    assert float(x_grad[1, 0]) != 0.0 and float(x_grad[1, 1]) == 0.0  # gate at c kept, above c clamped
    assert float(x_grad[1, h]) != 0.0 and float(x_grad[1, h + 1]) == 0.0
    assert bool((x_grad[2, h:h + n] == 0).all()) and float(xq_sf[2, h // n]) == float(torch.tensor(1e-4) / F8_MAX)
    pad = (p < 0).nonzero().flatten()
    assert pad.numel() and bool((out[pad] == 0).all()) and bool((x_grad[pad] == 0).all())
    named = torch.zeros(wg.numel(), dtype=torch.bool)
    named[p[p >= 0].long()] = True
    assert bool((wg.flatten()[~named] == 0).all()) and bool((wg.flatten()[named] != 0).all())


def test_refuses_bad_arguments_naming_them():
    data, sf, grad, weight, p, t2p = swiglu_backward_inputs(10, 128, 4, 4, 32, seed=31)
    good = dict(x_data=data, x_sf=sf, grad_out=grad, weight=weight, pos_to_token_topk=p, token_topk_to_pos=t2p,
                num_per_channels=32)
    dup = p.clone()
    dup[1] = dup[0]
    bad = {"x_data": data.float(), "x_sf": sf[:, :-1], "grad_out": grad.float(), "weight": weight.double(),
           "pos_to_token_topk": p.long(), "token_topk_to_pos": t2p[:, :2], "num_per_channels": 48}
    for arg, value in bad.items():
        with pytest.raises(ContractError, match=f"'{arg}'"):
            swiglu_backward_and_per_token_cast(**{**good, arg: value})
    for arg, value in (("pos_to_token_topk", torch.where(p == p.max(), 16, p)), ("pos_to_token_topk", dup),
                       ("token_topk_to_pos", torch.where(t2p == t2p.max(), 10, t2p))):
        with pytest.raises(ContractError, match=f"'{arg}'"):
            swiglu_backward_and_per_token_cast(**{**good, arg: value})
    for clamp in (0.0, -1.0, math.inf, True):
        with pytest.raises(ContractError, match="'swiglu_clamp_value'"):
            swiglu_backward_and_per_token_cast(**good, swiglu_clamp_value=clamp)


@pytest.mark.parametrize(("num_topk", "num_experts", "hidden", "n", "round_sf", "clamp"), [
    (6, 9, 256, 128, False, None), (9, 9, 512, 32, True, 0.5), (2, 32, 256, 32, False, 10.0)])
def test_drop_in_on_tilekernels_data(num_topk, num_experts, hidden, n, round_sf, clamp):
    params = {"num_send_tokens": 24, "num_topk": num_topk, "num_experts": num_experts, "num_ep_ranks": 8}
    torch.manual_seed(num_topk * 100 + hidden)
    topk_idx = tk.testing.generator.generate_topk_idx(params, device="cpu")
    num_tokens = topk_idx.shape[0]
    weights = torch.rand((num_tokens, num_topk), dtype=torch.float32)
    x = torch.randn((num_tokens, hidden * 2), dtype=torch.bfloat16)
    _, pos_to_token, pos_to_token_topk, token_topk_to_pos, *_ = tk.moe.get_fused_mapping(topk_idx, num_experts, 0, n)
    x_expand = tk.moe.expand_to_fused(x, token_topk_to_pos, pos_to_token)
    xq = tk.quant.per_token_cast(x_expand, "e4m3", num_per_channels=n)
    grad = torch.randn((x_expand.shape[0], hidden), dtype=torch.bfloat16)
    out, (q, q_sf), x_grad, wg = tk.quant.swiglu_backward_and_per_token_cast(
        xq, grad, weights, pos_to_token_topk, token_topk_to_pos, num_per_channels=n, round_sf=round_sf,
        swiglu_clamp_value=clamp)
    want = swiglu_backward_reference(xq[0], xq[1], grad, weights, pos_to_token_topk, token_topk_to_pos, n, round_sf,
                                     clamp)
    assert torch.equal(out, want[0]) and torch.equal(q.view(torch.uint8), want[1].view(torch.uint8))
    assert torch.equal(q_sf, want[2]) and torch.equal(x_grad, want[3]) and torch.equal(wg, want[4])
    assert out.is_contiguous() and q.shape == (x_expand.shape[0], 2 * hidden) and wg.shape == weights.shape
    out64, _, wg64 = _float64_backward(xq[0], xq[1], grad, weights, pos_to_token_topk, n, clamp)
    torch.testing.assert_close(wg.double(), wg64, rtol=1e-4, atol=1e-4)
    assert _near(out, out64, 2.0 ** -8)
    # a 3-D x (as TileKernels allows) and its errors naming x
    again = tk.quant.swiglu_backward_and_per_token_cast((xq[0].unsqueeze(0), xq[1]), grad, weights,
                                                        pos_to_token_topk, token_topk_to_pos, n, round_sf, clamp)
    assert torch.equal(again[2], x_grad)
    with pytest.raises(ContractError, match="'x' \\(x_sf\\)"):
        tk.quant.swiglu_backward_and_per_token_cast((xq[0], xq[1][:, 1:]), grad, weights, pos_to_token_topk,
                                                    token_topk_to_pos, n)


def test_gate_grad_factor_is_one_fma():
    """gate_grad's 1 + gate · (1 - s) is rounded once (TileKernels' kernel; its torch oracle asks
    torch.compile for the fma, which inductor on CPU emits as a multiply and an add)."""
    m, h, n = 1024, 2048, 128
    data, sf, grad, weight, p, t2p = swiglu_backward_inputs(m, h, 256, 8, n, seed=41)
    x_grad = swiglu_backward_and_per_token_cast(data, sf, grad, weight, p, t2p, n)[3]
    x = data.float() * sf.repeat_interleave(n, 1)
    gate, up = x[:, :h], x[:, h:]
    t = 1.0 + torch.exp(-gate)
    s = torch.ones_like(gate) / t
    w = torch.where(p >= 0, weight.flatten()[p.clamp(min=0).long()], 0.0)
    ws = grad.float() * w[:, None] * s
    one_rounding = (gate.double() * (1.0 - s).double() + 1.0).float()
    two_roundings = gate * (1.0 - s) + 1.0
    fused = (ws * up * one_rounding).to(torch.bfloat16)
    unfused = (ws * up * two_roundings).to(torch.bfloat16)
    assert torch.equal(x_grad[:, :h], fused)
    assert not torch.equal(x_grad[:, :h], unfused)  # the data tells the two apart
