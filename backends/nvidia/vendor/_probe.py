"""Importability of optional vendor packages, checked once without importing them eagerly."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType


@functools.lru_cache(maxsize=None)
def module(name: str) -> ModuleType | None:
    """The package `name` if it is installed and imports cleanly, else None."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.import_module(name)
    except Exception:  # an installed but broken package is unavailable, not an error
        return None


def missing_reason(name: str) -> str | None:
    if importlib.util.find_spec(name) is None:
        return f"the {name} package is not installed"
    if module(name) is None:
        return f"the {name} package is installed but failed to import"
    return None
