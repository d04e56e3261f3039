"""Compile the nvidia Triton kernels for real GPUs without one: every launch a launcher makes is
turned into an ahead-of-time `triton.compile` for a chosen target (sm_90a / sm_100a), so code the
interpreter accepts but the GPU compiler would reject (loop-carried type changes, bad layouts,
unsupported dots) fails without a device. Needs compiled mode: a process without TRITON_INTERPRET.

The signature mirrors a real launch: tensors become typed pointers (16-byte aligned ones marked
so, as Triton's launcher does), ints i32 (i64 when large), floats fp32, constexprs as given.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch
import triton
from triton._utils import canonicalize_dtype
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

ARCHS = {"sm90": 90, "sm100": 100}
_OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _type_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + canonicalize_dtype(value.dtype)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2 ** 31) <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot type kernel argument {value!r}")


def compile_call(fn: JITFunction, arch: str, args: tuple, kwargs: dict) -> Any:
    """triton.compile one launch of `fn` for `arch`; returns the compiled kernel."""
    options = {k: kwargs.pop(k) for k in _OPTION_NAMES if k in kwargs}
    bound = inspect.signature(fn.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        if i in fn.constexprs:
            signature[name] = "constexpr"
            constexprs[(i,)] = value
            continue
        signature[name] = _type_of(value)
        aligned = value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor) else (
            isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0 and value != 0)
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", ARCHS[arch], 32), options=options)


@contextlib.contextmanager
def compiling_for(arch: str, record: list) -> Iterator[None]:
    """Inside the block, launching any Triton kernel compiles it for `arch` instead (nothing runs);
    each compiled kernel (triton's CompiledKernel: .name, .metadata, .asm["cubin"]) is appended to `record`."""
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        kernel = compile_call(self, arch, args, dict(kwargs))
        record.append(kernel)
        return kernel

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original
