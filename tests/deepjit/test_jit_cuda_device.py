"""CUDA load and launch through the driver API. Runs only where a driver and a GPU are present
(the prepared device check); on machines without them every test here is skipped with the reason."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NVCC

import deepjit
from deepjit.loader import cuda_driver

KERNEL = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" __global__ void reverse_in_shared(float* x, int n) {
    extern __shared__ float tile[];
    int i = threadIdx.x;
    if (i < n) tile[i] = x[i];
    __syncthreads();
    if (i < n) x[i] = tile[n - 1 - i];
}
"""
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}


def _driver_or_skip() -> ctypes.CDLL:
    if NVCC is None:
        pytest.skip("nvcc not found")
    try:
        return cuda_driver()
    except deepjit.DeviceUnavailableError as exc:
        pytest.skip(f"no CUDA device here: {exc}")


@pytest.fixture(scope="module")
def driver() -> ctypes.CDLL:
    return _driver_or_skip()


@pytest.fixture(scope="module")
def arch(driver) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    driver.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, 0)
    driver.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, 0)
    return f"sm_{major.value}{minor.value}" + ("a" if major.value >= 9 else "")


class DeviceBuffer:
    """A float32 device allocation made with the driver API (no torch needed)."""

    def __init__(self, driver: ctypes.CDLL, values: list[float]) -> None:
        self.driver, self.n = driver, len(values)
        self.pointer = ctypes.c_uint64()
        assert driver.cuMemAlloc_v2(ctypes.byref(self.pointer), 4 * self.n) == 0
        host = (ctypes.c_float * self.n)(*values)
        assert driver.cuMemcpyHtoD_v2(self.pointer, host, 4 * self.n) == 0

    def read(self) -> list[float]:
        assert self.driver.cuCtxSynchronize() == 0
        host = (ctypes.c_float * self.n)()
        assert self.driver.cuMemcpyDtoH_v2(host, self.pointer, 4 * self.n) == 0
        return list(host)

    def argument(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.pointer.value)

    def free(self) -> None:
        self.driver.cuMemFree_v2(self.pointer)


def test_cubin_is_loaded_and_launched_with_driver_memory(driver, arch):
    module = deepjit.JitContext().compile("scale", KERNEL, toolchain="cuda", arch=arch)
    assert isinstance(module, deepjit.CudaModule)
    buffer = DeviceBuffer(driver, [float(i) for i in range(1000)])
    module.scale.launch((4,), (256,), [buffer.argument(), ctypes.c_float(3.0), ctypes.c_int(1000)])
    assert buffer.read() == [3.0 * i for i in range(1000)]
    buffer.free()


def test_fatbin_is_loaded_and_launched(driver, arch):
    module = deepjit.JitContext().compile("scale", KERNEL, toolchain="cuda", kind="fatbin", arch=[arch, "sm_100a"])
    buffer = DeviceBuffer(driver, [1.0] * 64)
    module.function("scale").launch((1,), (64,), [buffer.argument(), ctypes.c_float(-2.0), ctypes.c_int(64)])
    assert buffer.read() == [-2.0] * 64
    buffer.free()


def test_dynamic_shared_memory_above_48_kib_is_enabled_by_attribute(driver, arch):
    module = deepjit.JitContext().compile("shared", KERNEL, toolchain="cuda", arch=arch)
    n = 1024
    kernel = module.reverse_in_shared
    kernel.set_max_dynamic_shared_memory(64 * 1024)
    buffer = DeviceBuffer(driver, [float(i) for i in range(n)])
    kernel.launch((1,), (n,), [buffer.argument(), ctypes.c_int(n)], shared_mem=64 * 1024)
    assert buffer.read() == [float(n - 1 - i) for i in range(n)]
    buffer.free()


def test_launch_takes_torch_tensors_and_streams(driver, arch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    module = deepjit.JitContext().compile("scale", KERNEL, toolchain="cuda", arch=arch)
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        module.scale.launch((16,), (256,), [x, ctypes.c_float(0.5), ctypes.c_int(x.numel())], stream=stream)
    stream.synchronize()
    assert torch.equal(x.cpu(), torch.arange(4096, dtype=torch.float32) * 0.5)


def test_unknown_kernel_name_is_a_load_error(driver, arch):
    module = deepjit.JitContext().compile("scale", KERNEL, toolchain="cuda", arch=arch)
    with pytest.raises(deepjit.LoadError, match="extern"):
        module.function("no_such_kernel")


def test_python_scalars_must_be_typed(driver, arch):
    module = deepjit.JitContext().compile("scale", KERNEL, toolchain="cuda", arch=arch)
    with pytest.raises(deepjit.InvalidArgumentError, match=r"args\[1\]"):
        module.scale.launch((1,), (1,), [ctypes.c_void_p(0), 2.0, ctypes.c_int(0)])


def test_disk_hit_in_a_fresh_process_launches(driver, arch, cache_root):
    deepjit.JitContext().compile_to_path("scale", KERNEL, toolchain="cuda", arch=arch)
    script = (
        "import ctypes, deepjit\n"
        "from test_jit_cuda_device import KERNEL, DeviceBuffer\n"
        "from deepjit.loader import cuda_driver\n"
        f"a = deepjit.build('scale', KERNEL, toolchain='cuda', arch='{arch}')\n"
        f"m = deepjit.compile('scale', KERNEL, toolchain='cuda', arch='{arch}')\n"
        "b = DeviceBuffer(cuda_driver(), [2.0] * 32)\n"
        "m.scale.launch((1,), (32,), [b.argument(), ctypes.c_float(2.0), ctypes.c_int(32)])\n"
        "print(a.origin, b.read()[0])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["disk", "4.0"]
