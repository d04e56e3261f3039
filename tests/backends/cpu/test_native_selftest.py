"""The cpu kernels' standalone self-test (backends/cpu/selftest.py): every x86 level this machine
executes, and the ARM (NEON) build cross-compiled and run under qemu-user when the toolchain is
installed (.ci/run installs it where apt-get works); a kernel fault makes it fail."""

from __future__ import annotations

import shutil

import pytest

from portable_kernels.backends.cpu import selftest

FAMILIES = ("mla dense causal, bf16 cache", "mla sparse, fp8 cache", "fp8_gemm_nt", "cast_fp8", "topk",
            "get_fused_mapping")


@pytest.mark.parametrize("target", list(selftest.X86_LEVELS) + list(selftest.CROSS))
def test_every_kernel_family_passes_its_self_test(target):
    reason = selftest.missing_tools(target)
    if reason:
        pytest.skip(f"{target} self-test not run: {reason}")
    out = selftest.run(target)
    assert out.passed, out.output[-3000:]
    isa = {"aarch64": "aarch64, neon build"}.get(target, f"x86_64, {target} build")
    assert isa in out.output and "all ok: 0 failed" in out.output
    for family in FAMILIES:
        assert f"ok   {family}" in out.output


def test_a_kernel_fault_fails_the_self_test(tmp_path):
    """The MLA FMA engine with its softmax scale 1% off: the drivers' references catch it."""
    if selftest.missing_tools("generic"):
        pytest.skip(selftest.missing_tools("generic"))
    kernels = tmp_path / "kernels"
    shutil.copytree(selftest.KERNELS, kernels)
    engine = kernels / "mla_fma.h"
    text = engine.read_text()
    assert "srow[k] * a.scale" in text
    engine.write_text(text.replace("srow[k] * a.scale", "srow[k] * a.scale * 1.01f"))
    out = selftest.run("generic", kernels=kernels)
    assert not out.passed
    assert "FAIL mla dense causal, bf16 cache" in out.output and "ok   fp8_gemm_nt" in out.output
