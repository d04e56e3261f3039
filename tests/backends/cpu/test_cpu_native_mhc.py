"""The cpu backend's native mHC stream kernels (kernels/mhc.cpp): mhc_pre_apply_mix, mhc_post and
their backwards against the contracts' references (fp32 sums in another order, bf16 rounded once: within one bf16
ulp plus the reordering error), AVX2 steps and scalar tails (H not a multiple of 8), 1 and 2
threads, M = 1 / 4 / 8, non-finite values propagated as the reference does."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers.mhc import LIB
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops import mhc
from portable_kernels.ops.mhc.apply import (post_backward_reference, post_reference, pre_apply_mix_backward_reference,
                                            pre_apply_mix_reference)
from portable_kernels.testing.generators import randn

pytestmark = pytest.mark.skipif(LIB.get() is None, reason=f"native build unavailable: {LIB.reason()}")

SHAPES = [((1, 1), 4, 8), ((2, 3), 4, 77), ((1, 300), 4, 1280), ((5,), 1, 13), ((1, 9), 8, 264), ((1, 40), 4, 7)]


def _close(got: torch.Tensor, want: torch.Tensor, absum: torch.Tensor) -> None:
    """Each value within one bf16 rounding of the reference's plus fp32 sums' reordering error
    (a few fp32 ulps of Σ|terms|: cancellation leaves small outputs with few exact bits)."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert pk.calc_diff(got.float(), want.float()) < 1e-5
    bound = want.float().abs() * 2.0 ** -7 + absum * 2.0 ** -21  # one bf16 ulp + reordering
    assert bool(((got.float() - want.float()).abs() <= bound).all())


def _threads(n: int):
    class Ctx:
        def __enter__(self):
            self.before = torch.get_num_threads()
            torch.set_num_threads(n)

        def __exit__(self, *exc):
            torch.set_num_threads(self.before)
    return Ctx()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("lead", "m", "h"), SHAPES)
def test_native_pre_apply_mix_and_post_match_the_references(lead, m, h, threads):
    seed = m * 100 + h
    x = randn(*lead, m, h, seed=seed, dtype=torch.bfloat16)
    mix = randn(*lead, m, 1, seed=seed + 1)
    y = randn(*lead, h, seed=seed + 2, dtype=torch.bfloat16)
    post, comb = randn(*lead, m, 1, seed=seed + 3), randn(*lead, m, m, seed=seed + 4)
    with _threads(threads), trace_providers() as ran:
        got_apply = mhc.mhc_pre_apply_mix(x, mix)
        got_post = mhc.mhc_post(y, x, post, comb)
    assert [p for _, _, p in ran] == ["native", "native"]
    _close(got_apply, pre_apply_mix_reference(x, mix), (x.float() * mix).abs().sum(-2))
    absum = (y.float().unsqueeze(-2) * post).abs() + torch.einsum("...mn,...mh->...nh", comb.abs(), x.float().abs())
    _close(got_post, post_reference(y, x, post, comb), absum)


def test_native_kernels_propagate_non_finite_values_as_the_reference():
    x = randn(1, 3, 4, 20, seed=5, dtype=torch.bfloat16)
    x[0, 1, 2, 3] = float("nan")
    x[0, 2, 0, 17] = float("inf")
    mix = randn(1, 3, 4, 1, seed=6)
    y, post, comb = randn(1, 3, 20, seed=7, dtype=torch.bfloat16), randn(1, 3, 4, 1, seed=8), randn(1, 3, 4, 4, seed=9)
    for got, want in ((mhc.mhc_pre_apply_mix(x, mix), pre_apply_mix_reference(x, mix)),
                      (mhc.mhc_post(y, x, post, comb), post_reference(y, x, post, comb))):
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        fin = torch.isfinite(want)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        assert pk.calc_diff(got[fin].float(), want[fin].float()) < 1e-5


def _close_f32(got: torch.Tensor, want: torch.Tensor, absum: torch.Tensor) -> None:
    """fp32 sums over H in another order: within a few fp32 ulps of Σ|terms| · H."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    h = 8192
    assert bool(((got - want).abs() <= absum * h * 2.0 ** -23 + 1e-30).all())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("lead", "m", "h"), SHAPES)
def test_native_backwards_match_the_references(lead, m, h, threads):
    seed = m * 200 + h
    x = randn(*lead, m, h, seed=seed, dtype=torch.bfloat16)
    mix, o_grad = randn(*lead, m, 1, seed=seed + 1), randn(*lead, h, seed=seed + 2, dtype=torch.bfloat16)
    y = randn(*lead, h, seed=seed + 3, dtype=torch.bfloat16)
    post, comb = randn(*lead, m, 1, seed=seed + 4), randn(*lead, m, m, seed=seed + 5)
    d_out = randn(*lead, m, h, seed=seed + 6, dtype=torch.bfloat16)
    with _threads(threads), trace_providers() as ran:
        x_grad, mix_grad = mhc.mhc_pre_apply_mix_backward(o_grad, x, mix)
        d_x, d_res, d_post, d_comb = mhc.mhc_post_backward(d_out, y, x, post, comb)
    assert [p for _, _, p in ran] == ["native", "native"]
    want = pre_apply_mix_backward_reference(o_grad, x, mix)
    g, xf = o_grad.float().unsqueeze(-2), x.float()
    _close(x_grad, want[0], (g * mix).abs())
    _close_f32(mix_grad, want[1], (g * xf).abs().sum(-1, keepdim=True))
    want = post_backward_reference(d_out, y, x, post, comb)
    gd = d_out.float()
    _close(d_x, want[0], (gd * post).abs().sum(-2))
    _close(d_res, want[1], torch.einsum("...mn,...nh->...mh", comb.abs(), gd.abs()))
    _close_f32(d_post, want[2], (gd * y.float().unsqueeze(-2)).abs().sum(-1, keepdim=True))
    _close_f32(d_comb, want[3], torch.einsum("...mh,...nh->...mn", xf.abs(), gd.abs()))


def test_post_backward_with_more_streams_than_the_native_kernel_holds_runs_the_reference():
    m = 17
    x = randn(1, 2, m, 8, seed=1, dtype=torch.bfloat16)
    args = (randn(1, 2, m, 8, seed=2, dtype=torch.bfloat16), randn(1, 2, 8, seed=3, dtype=torch.bfloat16), x,
            randn(1, 2, m, 1, seed=4), randn(1, 2, m, m, seed=5))
    with trace_providers() as ran:
        got = mhc.mhc_post_backward(*args)
    assert ran == [("mhc_post_backward", "cpu", "reference")]
    for a, b in zip(got, post_backward_reference(*args)):
        assert torch.equal(a, b)
