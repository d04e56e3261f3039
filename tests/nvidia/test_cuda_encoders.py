"""The CUDA C++ layout encoders: CI builds their cubins for sm_90a and sm_100a with nvcc through the
library's shared deepjit context; running them needs a GPU (then they must match the layouts byte
for byte)."""

from __future__ import annotations

import shutil

import pytest
import torch

import deepjit
from portable_kernels.backends.nvidia import cuda as cuda_encoders
from portable_kernels.jit import ENV_PREFIX, jit
from portable_kernels.layouts import (LayoutConversionError, ceil_to_ue8m0, sm100_ue8m0_encode_from_blocks,
                                      sm90_sfa_encode)

NEEDS_TRITON = False
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not shutil.os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not found")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="running the cubins needs an NVIDIA GPU")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private cache root, and a fresh library context (its in-process memory empty) reading it."""
    import portable_kernels.jit as pk_jit
    monkeypatch.setenv(ENV_PREFIX + "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pk_jit, "_CONTEXT", deepjit.JitContext(env_prefix=ENV_PREFIX))
    return tmp_path


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_encoders_build_a_cubin_in_the_shared_cache(arch, cache_dir):
    artifact = cuda_encoders.build(arch)
    assert artifact.path.suffix == ".cubin" and artifact.path.is_relative_to(cache_dir)
    assert artifact.path.read_bytes()[:4] == b"\x7fELF"
    assert cuda_encoders.build(arch).origin == "memory"
    # a fresh context with the library's knob prefix (another backend, another process) finds it on disk
    again = deepjit.JitContext(env_prefix=ENV_PREFIX).build(cuda_encoders.MODULE, cuda_encoders.source(),
                                                             toolchain="cuda", arch=cuda_encoders.ARCHS[arch],
                                                             flags=["-O3"])
    assert again.origin == "disk" and again.path == artifact.path


@needs_nvcc
def test_host_and_cuda_builds_share_one_cache_root(cache_dir):
    host = jit().build("pk_probe_host", 'extern "C" int pk_probe(void) { return 7; }\n', toolchain="host",
                       kind="ctypes")
    cubin = cuda_encoders.build("sm90")
    assert host.path.parent.parent == cubin.path.parent.parent == cache_dir


@needs_gpu
def test_encoders_match_the_layouts_on_a_gpu():
    g = torch.Generator().manual_seed(0)
    for mn, kb in ((3, 4), (130, 7), (1, 1)):
        sf = torch.rand(2, mn, kb, generator=g) + 0.01
        got = cuda_encoders.sm90_sfa_encode(sf.cuda())
        assert got.stride() == sm90_sfa_encode(sf).stride() and torch.equal(got.cpu(), sm90_sfa_encode(sf))
        blocks = ceil_to_ue8m0(torch.rand(2, -(-mn // 128), kb, generator=g) + 0.01)
        packed = cuda_encoders.sm100_pack(blocks.cuda(), mn, 128)
        assert torch.equal(packed.cpu(), sm100_ue8m0_encode_from_blocks(blocks, mn, 128))
    with pytest.raises(LayoutConversionError):
        cuda_encoders.sm100_pack(torch.full((4, 2), 0.3, device="cuda"), 4)
