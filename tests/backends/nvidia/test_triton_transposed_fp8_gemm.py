"""The Triton provider of fp8_gemm_{nn,tn,tt} in Triton's interpreter: the quick conformance on sm90
and sm100 emulation served by Triton for every case (the stored transposes reach the nt kernel as
the K-major data and nt-oriented scales the Formats store), and a hand-built operand whose data is
MN-major going to the layout oracle with the reason. The conformance run is the session's shared
one (tests/conftest.py `conformance_report`), so these checks cost no extra interpreter time."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import portable_kernels as pk  # noqa: E402
from portable_kernels.core.dispatch import trace_providers  # noqa: E402
from portable_kernels.core.prepare import prepare_inputs  # noqa: E402
from portable_kernels.core.tensors import PreparedTensor, QuantTensor  # noqa: E402
from portable_kernels.ops.gemm.dense import gemm_reference  # noqa: E402
from portable_kernels.ops.quant.fp8 import dequantize_reference, quantize_blocks_reference  # noqa: E402
from portable_kernels.testing.generators import randn  # noqa: E402

OPS = ["fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt"]


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("op", OPS)
def test_quick_conformance_is_served_by_triton(conformance_report, arch, op):
    r = conformance_report("nvidia", arch=arch).ops[op]
    assert r.ok and r.passed == r.cases > 0 and r.providers == {"triton": r.passed}, r


def test_mn_major_data_goes_to_the_oracle():
    x, w = randn(8, 256, seed=1, dtype=torch.bfloat16), randn(130, 256, seed=2, dtype=torch.bfloat16)
    a = QuantTensor(*quantize_blocks_reference(x, 1, 128, False), (1, 128), False)
    b = QuantTensor(*quantize_blocks_reference(w, 128, 128, False), (128, 128), False)
    with pk.use_backend("nvidia", arch="sm90"):
        ops = prepare_inputs("fp8_gemm_nn", a=a, b=b)
        pb = ops["b"]
        mn_major = PreparedTensor(pb.data.T.contiguous().T, pb.scale, pb.format, pb.backend, pb.shape,
                                  pb.granularity, pb.storage_granularity, pb.ue8m0, pb.element, pb.params)
        d = torch.empty(8, 130)
        with trace_providers() as ran:
            pk.fp8_gemm_nn(ops["a"], mn_major, d)
    assert ran == [("fp8_gemm_nn", "nvidia", "layout-reference")]
    want = gemm_reference(dequantize_reference(a).double(), dequantize_reference(b).double(), None)
    assert pk.calc_diff(d, want) < 1e-6
