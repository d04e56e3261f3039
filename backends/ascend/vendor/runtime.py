"""Lazy access to torch_npu. It is never imported at module import time: without Huawei's CANN
toolkit, importing it breaks torch, so its absence is a reason the backend reports, not a crash.

Tests replace the module with a documented-semantics stand-in through `use_stand_in` (never by
putting a fake `torch_npu` on sys.path, which torch's device-backend autoload could pick up).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
from typing import Any, Iterator

import torch

from .. import chips

_STAND_IN: list[Any] = []


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


def torch_npu() -> Any | None:
    """The module the torch_npu providers call: a test stand-in if one is active, else torch_npu when it
    imports and an NPU is visible, else None (`native_unavailable_reason` says why)."""
    if _STAND_IN:
        return _STAND_IN[-1]
    if unavailable_reason() is not None:
        return None
    return importlib.import_module("torch_npu")


def using_stand_in() -> bool:
    """Whether a test stand-in replaces torch_npu (its operators then take CPU tensors)."""
    return bool(_STAND_IN)


def native_unavailable_reason() -> str | None:
    """Why the torch_npu providers cannot run here (None when they can)."""
    if _STAND_IN:
        return None
    reason = unavailable_reason()
    return None if reason is None else f"torch_npu providers unavailable: {reason}"


def _selections_changed() -> None:
    """Provider choices depend on whether torch_npu is present: drop the cached plans."""
    from portable_kernels.core.registry import registry
    registry().generation += 1


@contextlib.contextmanager
def use_stand_in(module: Any) -> Iterator[Any]:
    """Route every torch_npu provider call to `module` inside the block (tests only)."""
    _STAND_IN.append(module)
    _selections_changed()
    try:
        yield module
    finally:
        _STAND_IN.remove(module)
        _selections_changed()


@functools.lru_cache(maxsize=1)
def _hardware_chip() -> str | None:
    npu = torch_npu() if not _STAND_IN else None
    return None if npu is None else chips.detect_chip(npu)


def detected_chip() -> str | None:
    """The chip behind the torch_npu in use (the stand-in's, or the real device's), None without one."""
    if _STAND_IN:
        return chips.detect_chip(_STAND_IN[-1])
    return _hardware_chip()


def has_argument(npu: Any, op: str, argument: str) -> bool:
    """Whether this torch_npu build's `op` takes `argument` (e.g. npu_dynamic_mx_quant's max_low_bound,
    new after 26.1.0): from the Python signature when it names its parameters (a stand-in), else from
    the registered operator schema (`torch.ops.npu.<op>.default._schema`)."""
    fn = getattr(npu, op, None)
    if fn is None:
        return False
    try:
        params = inspect.signature(fn).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return argument in params
    except (TypeError, ValueError):
        pass
    packet = getattr(getattr(torch.ops, "npu", None), op, None)
    schema = getattr(getattr(packet, "default", None), "_schema", None)
    return schema is not None and any(a.name == argument for a in schema.arguments)
