"""CPU backend: the embedded default and the reference every other backend is checked against.

It stores quantized operands in the PLAIN Format (the logical one: fp32 row-major scales), so
preparing for it copies nothing. Each op family's providers live in their own module with a
`register(registry)` function; every such module in this package is registered (one module per
op family, no central list to edit).
"""

from __future__ import annotations

import importlib
import pkgutil

from portable_kernels.core.registry import Backend, Registry

from ._names import BACKEND


class CpuBackend(Backend):
    name = BACKEND
    device_types = ("cpu",)


def register(registry: Registry) -> None:
    """Entry point `portable_kernels.backends: cpu`."""
    registry.add_backend(CpuBackend())
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:  # one broken family must not take the other families' providers with it
            importlib.import_module(f"{__name__}.{info.name}").register(registry)
        except Exception as exc:
            registry.record_broken(f"{BACKEND}.{info.name}", exc)
