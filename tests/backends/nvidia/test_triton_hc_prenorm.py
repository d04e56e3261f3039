"""The Triton tf32_hc_prenorm_gemm kernel in Triton's interpreter: the quick conformance on sm90 and
sm100 emulation served by the Triton provider for every case, and N past the kernel's one tile
going to the layout oracle with the reason."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.testing import run_conformance  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402
from portable_kernels.testing.hc_prenorm_cases import QUICK  # noqa: E402

OP = "tf32_hc_prenorm_gemm"


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_quick_conformance_is_served_by_triton(arch):
    report = run_conformance(backend="nvidia", arch=arch, ops=[OP], quick=True)
    assert report.ok, report.format_table()
    assert report.ops[OP].providers == {"triton": len(QUICK)}, report.format_table()


def test_n_past_one_tile_goes_to_the_oracle():
    a, b = randn(4, 64, seed=1, dtype=torch.bfloat16), randn(300, 64, seed=2)
    d, s = torch.empty(4, 300), torch.empty(4)
    with pk.use_backend("nvidia", arch="sm90"), trace_providers() as ran:
        pk.tf32_hc_prenorm_gemm(a, b, d, s)
    assert ran == [(OP, "nvidia", "layout-reference")]
    assert pk.calc_diff(d, a.double() @ b.double().T) < 1e-12
