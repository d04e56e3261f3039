"""Implicit-conversion accounting and strict mode.

Ops accept raw `(data, scale)` tuples and QuantTensors for DeepGEMM compatibility and convert them
to the backend's layout on the spot. Each such conversion is counted here and warned about once
per op; strict mode (`PK_STRICT_LAYOUTS=1` or `strict_layouts()`) makes it a LayoutError instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator

from .errors import ContractError, LayoutError, format_problem

STRICT_ENV = "PK_STRICT_LAYOUTS"

_strict: contextvars.ContextVar[bool | None] = contextvars.ContextVar("portable_kernels_strict", default=None)
_lock = threading.Lock()
_count = 0
_warned: set[str] = set()


class ImplicitConversionWarning(UserWarning):
    """An op converted an operand that was not prepared with prepare_inputs."""


def implicit_conversions() -> int:
    """How many implicit conversions ops performed since start (or the last reset), process-wide."""
    return _count


class ConversionCount:
    """The implicit conversions counted inside one `count_implicit_conversions()` block."""

    def __init__(self) -> None:
        self.count = 0
        self.by_op: dict[str, int] = {}

    def __int__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"ConversionCount({self.count}, by_op={self.by_op})"


_scopes: contextvars.ContextVar[tuple[ConversionCount, ...]] = contextvars.ContextVar(
    "portable_kernels_conversion_scopes", default=())


@contextlib.contextmanager
def count_implicit_conversions() -> Iterator[ConversionCount]:
    """Count the implicit conversions of the calls made inside the block (this context only, so
    threads and tasks do not see each other's), e.g. `with count_implicit_conversions() as n: ...;
    assert n.count == 0`. Nested blocks all count."""
    counter = ConversionCount()
    token = _scopes.set(_scopes.get() + (counter,))
    try:
        yield counter
    finally:
        _scopes.reset(token)


def reset_implicit_conversions() -> None:
    global _count
    with _lock:
        _count = 0
        _warned.clear()


def is_strict() -> bool:
    value = _strict.get()
    if value is not None:
        return value
    return os.environ.get(STRICT_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def strict_layouts(enabled: bool = True) -> Iterator[None]:
    """Inside the block, implicit conversions raise LayoutError (or are allowed, if enabled=False)."""
    if not isinstance(enabled, bool):
        raise ContractError(format_problem("strict_layouts", "enabled", repr(enabled), "a bool",
                                           "pass True (strict) or False (allow implicit conversions)"))
    token = _strict.set(enabled)
    try:
        yield
    finally:
        _strict.reset(token)


def note_implicit_conversion(op: str, arg: str, backend: str, layout: str) -> None:
    """Count one implicit conversion; raise in strict mode, warn once per op otherwise."""
    global _count
    if is_strict():
        raise LayoutError(
            f"{op}: argument '{arg}' is not prepared for backend {backend!r} ({layout}) and strict layout mode "
            f"forbids converting it inside the op. Fix: convert once at ingest with "
            f"prepare_inputs({op!r}, {arg}=...), or quantize activations with prepare_for={op!r}.")
    with _lock:
        _count += 1
        first = op not in _warned
        _warned.add(op)
    for counter in _scopes.get():
        counter.count += 1
        counter.by_op[op] = counter.by_op.get(op, 0) + 1
    if first:
        warnings.warn(
            f"{op}: converting argument '{arg}' to {backend}:{layout} inside the call (counted in "
            f"portable_kernels.implicit_conversions()). To keep the hot path free of conversions, prepare weights "
            f"once with prepare_inputs and quantize activations with prepare_for={op!r}; set {STRICT_ENV}=1 to make "
            f"this an error.",
            ImplicitConversionWarning, stacklevel=_caller_level())


#: files of this library (and its mapped subpackages) that a warning should skip to reach the user
_OUR_ROOTS = tuple(str(p) for p in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "layouts",
                                    Path(__file__).resolve().parents[1] / "backends"))


def _caller_level() -> int:
    """The stacklevel of the first frame outside this library (the user's call site)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(_OUR_ROOTS):
        frame, level = frame.f_back, level + 1
    return level
