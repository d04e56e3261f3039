"""The plan cache of portable_kernels.core.dispatch: a provider without limits or a shape class is asked
once per call signature; shape-dependent providers are asked once per shape class, in priority
order, and only up to the first that accepts; NoKernelError still lists every provider's reasons."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.registry import registry
from portable_kernels.testing.generators import randn

BACKEND = "planprobe"


class _Probe(pk.Backend):
    name = BACKEND
    emulation = True


@pytest.fixture
def probe():
    """A throwaway backend with four topk providers whose checks and shape classes count their calls."""
    reg = registry()
    reg.ensure_loaded()
    reg.add_backend(_Probe())
    calls: Counter = Counter()

    def counted(name, answer):
        def fn(call):
            calls[name] += 1
            return answer(call)
        return fn

    def run_topk(call):
        values, indices = torch.topk(call.input, call.topk, dim=-1)
        return (values if call.return_value else None), indices.to(call.indices_type)

    n_of = counted("shaped:class", lambda call: call.input.shape[1])
    reg.kernel("topk", BACKEND, "shaped", priority=30, shape_class=n_of,
               check=counted("shaped:check", lambda call: [] if call.input.shape[1] % 2 == 0 else ["odd n"]))(run_topk)
    reg.kernel("topk", BACKEND, "never", priority=20,
               check=counted("never:check", lambda call: ["declines every call"]))(run_topk)
    reg.kernel("topk", BACKEND, "later", priority=10, shape_class=counted("later:class", lambda call: call.input.shape[1]),
               check=counted("later:check", lambda call: [] if call.input.shape[1] != 5 else ["not 5"]))(run_topk)
    reg.kernel("topk", BACKEND, "last", priority=0,
               check=counted("last:check", lambda call: ["dtype"] if call.input.dtype == torch.bfloat16 else []))(
        run_topk)
    try:
        yield calls
    finally:
        with reg._lock:
            for key in [k for k in reg._providers if k[1] == BACKEND]:
                del reg._providers[key]
            del reg._backends[BACKEND]
            reg.generation += 1


def _run(n: int, times: int = 3, dtype=torch.float32) -> list[str]:
    x = randn(2, n, seed=n, dtype=dtype)
    with pk.use_backend(BACKEND), trace_providers() as ran:
        for _ in range(times):
            values, indices = pk.topk(x, 2)
            assert torch.equal(values, torch.topk(x, 2).values.to(values.dtype))
    return [name for _, _, name in ran]


def test_each_provider_is_asked_once_per_shape_class_and_only_up_to_the_one_that_accepts(probe):
    assert _run(8) == ["shaped"] * 3
    # the first shape-dependent provider accepted: nothing after it was asked or even keyed
    assert probe["shaped:check"] == 1 and probe["shaped:class"] == 3
    assert probe["later:class"] == 0 and probe["later:check"] == 0
    # the providers without a shape class answered once, when the plan was built
    assert probe["never:check"] == 1 and probe["last:check"] == 1

    assert _run(7) == ["later"] * 3  # shaped declines odd n; "never" is not asked again
    assert probe["shaped:check"] == 2 and probe["later:check"] == 1 and probe["later:class"] == 3
    assert probe["never:check"] == 1 and probe["last:check"] == 1  # same signature (sizes are not in it)

    assert _run(8, times=2) == ["shaped"] * 2  # back to a known shape class: no check runs
    assert probe["shaped:check"] == 2 and probe["later:check"] == 1


def test_a_fixed_provider_is_chosen_once_per_signature(probe):
    # shaped and later decline n = 5: "last", decided when the plan was built, runs every call
    assert _run(5) == ["last"] * 3
    assert probe["last:check"] == 1 and probe["never:check"] == 1


def test_no_kernel_error_lists_static_and_shape_dependent_reasons(probe):
    x = randn(2, 5, seed=1, dtype=torch.bfloat16)
    with pk.use_backend(BACKEND), pytest.raises(pk.NoKernelError) as info:
        pk.topk(x, 2)
    assert info.value.reasons == {"shaped": ["odd n"], "never": ["declines every call"], "later": ["not 5"],
                                  "last": ["dtype"]}
