"""The cpu backend's native mHC stream kernels (kernels/mhc.cpp): mhc_pre_apply_mix and mhc_post
against the contracts' references (fp32 sums in another order, bf16 rounded once: within one bf16
ulp plus the reordering error), AVX2 steps and scalar tails (H not a multiple of 8), 1 and 2
threads, M = 1 / 4 / 8, non-finite values propagated as the reference does."""

import pytest
import torch

import portable_kernels as pk
from portable_kernels.backends.cpu.providers.mhc import LIB
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops import mhc
from portable_kernels.ops.mhc.apply import post_reference, pre_apply_mix_reference
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
