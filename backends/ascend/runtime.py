"""Lazy access to torch_npu. It is never imported at module import time: without Huawei's CANN
toolkit, importing it breaks torch, so its absence is a reason the backend reports, not a crash."""

from __future__ import annotations

import functools
import importlib
import importlib.util

import torch


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when torch_npu imports and an NPU is visible; otherwise why not (cached)."""
    if importlib.util.find_spec("torch_npu") is None:
        return ("torch_npu is not installed (it needs Huawei's CANN toolkit); the ascend backend runs in "
                "emulation on CPU tensors only")
    try:
        importlib.import_module("torch_npu")
    except Exception as exc:  # a broken CANN install must not break the library
        return f"torch_npu failed to import ({type(exc).__name__}: {exc}); check the CANN environment"
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return "torch_npu imported but no NPU device is visible"
    return None
