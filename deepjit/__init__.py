"""deepjit: runtime compilation, content-hash build cache and loading (standalone).

Rule: deepjit imports only the standard library (pybind11 and device runtimes lazily, when used).

    import deepjit
    jit = deepjit.JitContext(env_prefix="PK_JIT_")          # a library binds its knob prefix
    mod = jit.compile("pk_cpu_gemm", source, toolchain="host", kind="pybind11", flags=["-O3", "-fopenmp"])
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import cache
from .api import Artifact, JitContext, build, cache_key, compile, compile_to_path, configure, default_context
from .env import KNOBS, Settings
from .errors import (
    CacheError,
    CacheIOError,
    CompileError,
    DeepJitError,
    DeviceUnavailableError,
    InvalidArgumentError,
    LoadError,
    ToolchainNotFoundError,
    UnsafeCacheError,
)
from .loader import AscendBinary, CudaFunction, CudaModule
from .template import Template, cpp_literal, render_template
from .toolchains import TOOLCHAINS, ToolchainName

__all__ = [
    "__version__",
    "Artifact",
    "AscendBinary",
    "CacheError",
    "CacheIOError",
    "CompileError",
    "CudaFunction",
    "CudaModule",
    "DeepJitError",
    "DeviceUnavailableError",
    "InvalidArgumentError",
    "JitContext",
    "KNOBS",
    "LoadError",
    "Settings",
    "TOOLCHAINS",
    "Template",
    "ToolchainName",
    "ToolchainNotFoundError",
    "UnsafeCacheError",
    "build",
    "cache",
    "cache_key",
    "compile",
    "compile_to_path",
    "configure",
    "cpp_literal",
    "default_context",
    "render_template",
]
