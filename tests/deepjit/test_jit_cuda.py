"""CUDA toolchain: nvcc builds cubins for sm_90a and sm_100a and a fatbin (compile only here)."""

from __future__ import annotations

import ctypes.util

import pytest
from conftest import NVCC

import deepjit
from deepjit.formats import EM_CUDA, elf_machine

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH or in /usr/local/cuda/bin")

KERNEL = r"""
template <int kBlock>
__device__ void scale_impl(float* x, float a, int n) {
    int i = blockIdx.x * kBlock + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" __global__ void scale(float* x, float a, int n) { scale_impl<BLOCK>(x, a, n); }
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_cubin_is_built_for_the_named_arch(arch):
    artifact = deepjit.JitContext().build("scale", KERNEL, toolchain="cuda", arch=arch, defines={"BLOCK": 256})
    assert artifact.path.suffix == ".cubin"
    assert elf_machine(artifact.path) == EM_CUDA
    assert artifact.manifest["commands"][0][3] == f"-arch={arch}"


def test_fatbin_holds_several_arches():
    artifact = deepjit.JitContext().build(
        "scale", KERNEL, toolchain="cuda", kind="fatbin", arch=["sm_90a", "sm_100a"], defines={"BLOCK": 256}
    )
    data = artifact.path.read_bytes()
    assert data[:4] == bytes.fromhex("50ed55ba")
    assert "-gencode=arch=compute_100a,code=sm_100a" in artifact.manifest["commands"][0]


def test_compile_to_path_needs_no_driver():
    path = deepjit.JitContext().compile_to_path("scale", KERNEL, toolchain="cuda", arch="sm_90a", defines={"BLOCK": 128})
    assert path.is_file()


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is installed here")
def test_loading_without_a_driver_is_a_clear_error_after_publishing(cache_root):
    jit = deepjit.JitContext()
    with pytest.raises(deepjit.DeviceUnavailableError, match="compile_to_path"):
        jit.compile("scale", KERNEL, toolchain="cuda", arch="sm_90a", defines={"BLOCK": 64})
    assert jit.build("scale", KERNEL, toolchain="cuda", arch="sm_90a", defines={"BLOCK": 64}).origin == "memory"


def test_nvcc_error_carries_the_compiler_output(cache_root):
    with pytest.raises(deepjit.CompileError) as failure:
        deepjit.JitContext().build("scale", KERNEL, toolchain="cuda", arch="sm_90a")  # BLOCK undefined
    assert "BLOCK" in failure.value.output
    assert list(cache_root.glob("scale.*")) == []


@pytest.mark.parametrize(("arch", "kind"), [(None, "cubin"), ("90a", "cubin"), (("sm_90a", "sm_100a"), "cubin")])
def test_bad_cuda_arch_is_rejected_with_the_fix(arch, kind):
    with pytest.raises(deepjit.InvalidArgumentError, match="arch"):
        deepjit.JitContext().key("scale", KERNEL, toolchain="cuda", kind=kind, arch=arch)
