"""The cpu backend's "native" providers: C++ kernels (one .cpp per op family, beside its Python
wrapper) compiled at first use through deepjit and cached. Without a compiler, or when a build
fails, each provider declines with the reason and the "reference" providers run
(portable_kernels.core.native.build holds that rule and the one warning)."""

from __future__ import annotations

import importlib
import pkgutil


def register(registry) -> None:
    """Called by the cpu backend's register: every family module here registers its providers."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}").register(registry)
