"""Every nvidia Triton kernel compiles to a cubin for sm_90a and sm_100a (no GPU needed).

The interpreter runs Python semantics and accepts code the GPU compiler rejects; the gpu report
(`python -m portable_kernels gpu-report`, conftest's `gpu_reports`: both architectures at once, in
fresh processes without TRITON_INTERPRET) compiles each specimen of
backends/nvidia/gpu_specimens.py, one config per kernel (`--all-configs` by hand, or
gpu_compile_all.py, for all of them). What the cubins hold is checked in test_gpu_report.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

ARCHS = ("sm90", "sm100")


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_for_the_gpu(gpu_reports, arch):
    code, out, err, report = gpu_reports[arch]
    assert code == 0, out[-4000:] + err[-4000:]
    from portable_kernels.backends.nvidia.gpu_specimens import all_specimens
    assert {row["specimen"] for row in report["rows"]} == {name for _, name, _ in all_specimens(False)}
