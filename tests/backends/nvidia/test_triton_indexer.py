"""The Triton lightning-indexer kernels (fp8_mqa_logits, fp8_paged_mqa_logits) in Triton's interpreter:
the quick conformance on sm90 and sm100 emulation served by the Triton provider, shapes past the
quick cases (heads not a power of two, several dots per sequence, 32-token cache blocks), and the
shapes the provider declines going to the layout oracle with the reason."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.registry import registry  # noqa: E402
from portable_kernels.layouts import quantize_indexer_keys  # noqa: E402
from portable_kernels.ops.attention.indexer import MqaLogitsInputs, allocate_logits  # noqa: E402
from portable_kernels.testing import run_conformance  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402
from portable_kernels.testing.indexer_cases import (PAGED_QUICK, PREFILL_QUICK, PagedShape, PrefillShape,  # noqa: E402
                                                    _paged_case, _prefill_case, cp_ranges, quantized_queries)

OPS = ("fp8_mqa_logits", "fp8_paged_mqa_logits")
#: the FP8 shape cases (Triton); the FP4 ones run the layout oracle (no Triton FP4 decode yet)
SHAPE_CASES = {"fp8_mqa_logits": sum(not s.fp4 for s in PREFILL_QUICK),
               "fp8_paged_mqa_logits": sum(not s.fp4 for s in PAGED_QUICK)}
FP4_CASES = {"fp8_mqa_logits": sum(s.fp4 for s in PREFILL_QUICK), "fp8_paged_mqa_logits": sum(s.fp4 for s in PAGED_QUICK)}
CPU = torch.device("cpu")


@pytest.fixture(scope="module", params=["sm90", "sm100"])
def report(request):
    return run_conformance(backend="nvidia", arch=request.param, ops=OPS, quick=True)


def test_every_quick_case_passes(report):
    assert report.ok, report.format_table()


@pytest.mark.parametrize("op", OPS)
def test_the_triton_provider_serves_every_shape_case(report, op):
    # the refusal cases never reach a provider: only the shape cases are counted; FP4 q (int8) is
    # outside the Triton provider's dtypes and runs the layout oracle
    assert report.ops[op].providers == {"triton": SHAPE_CASES[op], "layout-reference": FP4_CASES[op]}, \
        report.format_table()


def _served_by(op: str, fn) -> list[str]:
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        fn()
    return [p for o, b, p in ran if o == op and b == "nvidia"]


@pytest.mark.parametrize("shape", [
    PrefillShape(7, 70, 3, 256, context_parallel=False),  # 3 heads padded to 4, 32 rows per dot
    PrefillShape(4, 160, 128, 32, context_parallel=True, compressed=True),  # one row per dot, two key tiles
], ids=["3 heads d256", "128 heads compressed"])
def test_prefill_shapes_beyond_the_quick_cases(shape):
    assert _served_by("fp8_mqa_logits", lambda: _prefill_case(shape, 11, CPU)) == ["triton"]


@pytest.mark.parametrize("shape", [
    PagedShape((100, 33), 3, 64, 64, 32),  # next_n 3: two dots of 2 rows x 64 heads per key tile
    PagedShape((40,), 1, 5, 32, 16, logits_dtype=torch.bfloat16),  # 5 heads padded to the dot's 16 rows
], ids=["next_n 3 block_kv 32", "5 heads bf16"])
def test_paged_shapes_beyond_the_quick_cases(shape):
    assert _served_by("fp8_paged_mqa_logits", lambda: _paged_case(shape, 13, CPU)) == ["triton"]


def _prefill_inputs(heads: int, d: int) -> MqaLogitsInputs:
    q = quantized_queries(4, heads, d, seed=5)
    keys, scales = quantize_indexer_keys(randn(8, d, seed=6))
    ks, ke = cp_ranges(4, 8, False)
    logits = allocate_logits(4, 8, 8, torch.float32, CPU)
    return MqaLogitsInputs(q, keys, scales, randn(4, heads, seed=7), ks, ke, False, logits)


@pytest.mark.parametrize("heads,d,reason", [(4, 16, "head dim 16"), (2, 48, "head dim 48"), (160, 32, "160 heads")])
def test_unsupported_shapes_are_declined_with_the_reason(heads, d, reason):
    triton_provider = next(p for p in registry().providers("fp8_mqa_logits", "nvidia") if p.name == "triton")
    assert any(reason in r for r in triton_provider.not_supported_reasons(_prefill_inputs(heads, d)))


def test_a_declined_shape_is_served_by_the_layout_oracle():
    shape = PrefillShape(3, 12, 2, 16)
    assert _served_by("fp8_mqa_logits", lambda: _prefill_case(shape, 17, CPU)) == ["layout-reference"]
