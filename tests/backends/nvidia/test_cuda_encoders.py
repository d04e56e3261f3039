"""The CUDA C++ layout encoders: CI builds their cubins for sm_90a and sm_100a with nvcc through the
library's shared deepjit context; running them needs a GPU (then they must match the layouts byte
for byte)."""

from __future__ import annotations

import shutil

import pytest
import torch

import deepjit
from portable_kernels.backends.nvidia import cuda as cuda_encoders
from portable_kernels.core.native import build as native_build
from portable_kernels.layouts import (LayoutConversionError, ceil_to_ue8m0, sm100_ue8m0_encode_from_blocks,
                                      sm90_sfa_encode)

NEEDS_TRITON = False
#: the knob prefix of the library's deepjit context (portable_kernels/core/native/build.py)
ENV_PREFIX = "PK_JIT_"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not shutil.os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="nvcc not found")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="running the cubins needs an NVIDIA GPU")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private cache root, and a fresh library context (its in-process memory empty) reading it."""
    monkeypatch.setenv(ENV_PREFIX + "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_build, "JIT", deepjit.JitContext(env_prefix=ENV_PREFIX))
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
    host = cuda_encoders.jit().build("pk_probe_host", 'extern "C" int pk_probe(void) { return 7; }\n', toolchain="host",
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


def test_prepare_inputs_routes_cuda_operands_to_the_registered_encoders(monkeypatch):
    """The nvidia backend registers its CUDA encoders for SM90/SM100 operands on cuda tensors; the
    dispatch in accelerated_encode is checked here with a stand-in device (no GPU)."""
    import types

    import portable_kernels as pk
    from portable_kernels.layouts import SM90, SM100
    from portable_kernels.core.native import layout_encoders
    pk.available_backends()  # loads the plugins
    for fmt, fn in ((SM90, cuda_encoders.encode_sm90), (SM100, cuda_encoders.encode_sm100)):
        assert layout_encoders.DEVICE_ENCODERS[("cuda", fmt.name)] is fn
    seen = []
    monkeypatch.setitem(layout_encoders.DEVICE_ENCODERS, ("meta", SM90.name), lambda op: seen.append(op) or "encoded")
    operand = types.SimpleNamespace(data=torch.empty(2, 128, device="meta"))
    assert layout_encoders.accelerated_encode(SM90, operand) == "encoded" and seen == [operand]
    assert layout_encoders.accelerated_encode(SM100, operand) is None  # nothing registered: the Format encodes


@needs_gpu
def test_prepare_inputs_on_cuda_writes_the_same_bytes_through_the_cuda_encoders():
    import portable_kernels as pk
    x, w = torch.randn(5, 300), torch.randn(130, 300)
    a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_block_cast_to_fp8(w, use_ue8m0=True)
    for arch in ("sm90", "sm100"):
        on_cpu = pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia", arch=arch, a=a, b=b)
        with pk.use_backend("nvidia", arch=arch):
            on_gpu = pk.prepare_inputs(pk.fp8_gemm_nt, device="cuda", a=a, b=b)
        for arg in ("a", "b"):
            assert on_gpu[arg].scale.stride() == on_cpu[arg].scale.stride()
            assert torch.equal(on_gpu[arg].scale.cpu(), on_cpu[arg].scale)
