"""Loading built artifacts: pybind11 modules, C-ABI libraries (ctypes), CUDA cubins/fatbins, Ascend kernels.

Rule: what is loaded is exactly what was hashed. Host libraries are opened through
`/proc/self/fd/N` of the descriptor their bytes were read from, CUDA images from those bytes;
device runtimes (libcuda, libascendcl) are opened only when a device artifact is loaded, so
building never needs a driver and a missing one is a DeviceUnavailableError, not an import error.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import DeviceUnavailableError, InvalidArgumentError, LoadError
from .trust import PROC_FD, VerifiedFile

__all__ = ["load_pybind11", "load_ctypes", "CudaModule", "CudaFunction", "AscendBinary", "cuda_driver"]

# Host libraries loaded in this process, by (device, inode) of the verified file. The dynamic
# linker remembers every library by the name it was opened under and never forgets it, so the
# descriptor behind a `/proc/self/fd/N` name is kept open for the life of the process: N is then
# never reused for another file (which dlopen would mistake for this one). A loaded file's inode
# stays allocated while it is mapped, so a (device, inode) pair cannot name a second file either.
_host_lock = threading.Lock()
_host_libraries: dict[tuple[str, str, int, int], Any] = {}
_kept_descriptors: list[int] = []


def _lasting_name(image: VerifiedFile) -> str:
    """A `/proc/self/fd/N` name for the verified inode that stays valid for the whole process."""
    if not os.path.isdir(PROC_FD):
        raise LoadError(
            f"cannot load {image.path}: deepjit loads host libraries through {PROC_FD} (so that what runs "
            "is exactly what was verified) and this system has no /proc; mount procfs"
        )
    kept = os.dup(image.fd)
    _kept_descriptors.append(kept)
    return f"{PROC_FD}/{kept}"


def load_pybind11(image: VerifiedFile, module_name: str) -> ModuleType:
    """Import the verified extension module without registering it in sys.modules.

    Keeping it out of sys.modules lets several specializations that share one module name live
    side by side in a process (each file is a separate dlopen handle). The same file loaded again
    (from another JitContext) gives the module object already made.
    """
    key = ("pybind11", module_name, image.device, image.inode)
    with _host_lock:
        if key in _host_libraries:
            return _host_libraries[key]
        name = _lasting_name(image)
        loader = importlib.machinery.ExtensionFileLoader(module_name, name)
        spec = importlib.util.spec_from_file_location(module_name, name, loader=loader)
        if spec is None:
            raise LoadError(f"cannot create an import spec for {image.path}")
        try:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except ImportError as exc:
            raise LoadError(
                f"cannot import pybind11 module {module_name!r} from {image.path}: {exc}. The source must define "
                "PYBIND11_MODULE(DEEPJIT_MODULE_NAME, m) (deepjit defines the macro to the compile name)"
            ) from exc
        _host_libraries[key] = module
        return module


def load_ctypes(image: VerifiedFile) -> ctypes.CDLL:
    """dlopen the verified library; each call returns its own CDLL over the one handle."""
    key = ("ctypes", "", image.device, image.inode)
    with _host_lock:
        first = _host_libraries.get(key)
        if first is None:
            try:
                first = ctypes.CDLL(_lasting_name(image))
            except OSError as exc:
                raise LoadError(f"cannot load shared library {image.path}: {exc}") from exc
            _host_libraries[key] = first
    return ctypes.CDLL(str(image.path), handle=first._handle)


# --- CUDA driver API through ctypes -------------------------------------------------------------

_CUDA_SUCCESS = 0
_CUDA_ERROR_NO_DEVICE = 100
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_cuda_lock = threading.Lock()
_cuda_lib: ctypes.CDLL | None = None


def _cuda_error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
        return name.value.decode()
    return f"CUDA error {code}"


def _cuda_check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != _CUDA_SUCCESS:
        raise LoadError(f"{what} failed: {_cuda_error_name(lib, code)} ({code})")


def cuda_driver() -> ctypes.CDLL:
    """libcuda, initialised once; DeviceUnavailableError when there is no driver or no GPU."""
    global _cuda_lib
    with _cuda_lock:
        if _cuda_lib is not None:
            return _cuda_lib
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DeviceUnavailableError(
                "cannot load a CUDA artifact: the CUDA driver (libcuda.so.1) is not installed on this "
                "machine. Compiling works without it; use deepjit.compile_to_path(...) to only build, "
                "and load on a machine with an NVIDIA driver"
            ) from exc
        code = lib.cuInit(0)
        if code == _CUDA_ERROR_NO_DEVICE:
            raise DeviceUnavailableError("cannot load a CUDA artifact: the CUDA driver found no GPU")
        _cuda_check(lib, code, "cuInit")
        _cuda_lib = lib
        return lib


def _ensure_context(lib: ctypes.CDLL, device: int) -> None:
    """Use the calling thread's current context, else make the device's primary context current
    (the one PyTorch and the CUDA runtime use, so pointers are shared)."""
    current = ctypes.c_void_p()
    _cuda_check(lib, lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value:
        return
    handle = ctypes.c_int()
    _cuda_check(lib, lib.cuDeviceGet(ctypes.byref(handle), device), f"cuDeviceGet({device})")
    context = ctypes.c_void_p()
    _cuda_check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
    _cuda_check(lib, lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def _kernel_argument(index: int, value: Any) -> ctypes._SimpleCData:
    if isinstance(value, ctypes._SimpleCData):
        return value
    if hasattr(value, "data_ptr"):
        return ctypes.c_void_p(value.data_ptr())
    raise InvalidArgumentError(
        f"args[{index}]={value!r} has no C type; wrap scalars in a ctypes type matching the kernel "
        "parameter (ctypes.c_int(n), ctypes.c_float(x), ctypes.c_void_p(ptr)) or pass a tensor"
    )


class CudaFunction:
    """One `extern "C" __global__` function of a loaded CUDA module."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p, name: str) -> None:
        self._lib = lib
        self.handle = handle
        self.name = name

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        code = self._lib.cuFuncSetAttribute(self.handle, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
        _cuda_check(self._lib, code, f"cuFuncSetAttribute({self.name}, max dynamic shared memory)")

    def launch(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launch on `stream` (an int handle, an object with `.cuda_stream`, or None for the default)."""
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        values = [_kernel_argument(i, a) for i, a in enumerate(args)]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        raw_stream = getattr(stream, "cuda_stream", stream) or 0
        code = self._lib.cuLaunchKernel(
            self.handle, gx, gy, gz, bx, by, bz, shared_mem, ctypes.c_void_p(raw_stream), pointers, None
        )
        _cuda_check(self._lib, code, f"cuLaunchKernel({self.name})")


class CudaModule:
    """A cubin or fatbin loaded with cuModuleLoadData from the bytes that were hash-checked."""

    def __init__(self, image: bytes, *, path: Path | None = None, device: int = 0) -> None:
        self.path = path
        self._lib = cuda_driver()
        _ensure_context(self._lib, device)
        self._image = ctypes.create_string_buffer(image, len(image))
        self.handle = ctypes.c_void_p()
        _cuda_check(self._lib, self._lib.cuModuleLoadData(ctypes.byref(self.handle), self._image), "cuModuleLoadData")
        self._functions: dict[str, CudaFunction] = {}

    def function(self, name: str) -> CudaFunction:
        if name not in self._functions:
            handle = ctypes.c_void_p()
            code = self._lib.cuModuleGetFunction(ctypes.byref(handle), self.handle, name.encode())
            _cuda_check(self._lib, code, f"cuModuleGetFunction({name!r}) (declare kernels extern \"C\")")
            self._functions[name] = CudaFunction(self._lib, handle, name)
        return self._functions[name]

    def __getattr__(self, name: str) -> CudaFunction:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.function(name)


# --- Ascend runtime through ctypes (not exercised here: no NPU on the test machines) ----------------


class AscendBinary:
    """An Ascend kernel object loaded with aclrtBinaryLoadFromFile; functions by kernel name.

    `load_from` is the name the runtime reads (the verified descriptor's /proc path); `path` is
    where the object lives in the cache."""

    def __init__(self, path: Path, load_from: str | None = None) -> None:
        self.path = path
        try:
            self._lib = ctypes.CDLL("libascendcl.so")
        except OSError as exc:
            raise DeviceUnavailableError(
                "cannot load an Ascend kernel: the Ascend runtime (libascendcl.so) is not installed or "
                "not on LD_LIBRARY_PATH (source set_env.sh of CANN). Compiling works without it; use "
                "deepjit.compile_to_path(...) to only build"
            ) from exc
        self.handle = ctypes.c_void_p()
        source = load_from if load_from is not None else str(path)
        code = self._lib.aclrtBinaryLoadFromFile(source.encode(), None, ctypes.byref(self.handle))
        if code != 0:
            raise LoadError(f"aclrtBinaryLoadFromFile({path}) failed with aclError {code}")

    def function(self, name: str) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        code = self._lib.aclrtBinaryGetFunction(self.handle, name.encode(), ctypes.byref(handle))
        if code != 0:
            raise LoadError(f"aclrtBinaryGetFunction({name!r}) failed with aclError {code}")
        return handle
