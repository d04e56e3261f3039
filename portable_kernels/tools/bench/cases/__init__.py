"""The benchmark cases, one module per op family (named like the op modules they measure).

Each module holds `FAMILY` (its name), `CASES` (a list of Case) and optionally `PER_BACKEND =
False` for a family that calls no backend (it then runs once per device). Add a case by adding it
to its family's CASES; add a family by adding its module to `_MODULES`.
"""

from __future__ import annotations

from types import ModuleType

from ..case import SIZES, Case
from . import casts, gemm, grouped_gemm, indexer, layouts, mla, model, moe_routing, topk

_MODULES: tuple[ModuleType, ...] = (gemm, grouped_gemm, mla, indexer, topk, casts, moe_routing, layouts, model)

#: family name -> its module
FAMILIES: dict[str, ModuleType] = {m.FAMILY: m for m in _MODULES}


def per_backend(family: str) -> bool:
    """Whether the family's cases depend on the backend in force (else: once per device)."""
    return getattr(FAMILIES[family], "PER_BACKEND", True)


def cases_of(family: str, size: str) -> list[Case]:
    """The family's cases in the set `size` ("tiny", "quick" or "full")."""
    if size not in SIZES:
        raise ValueError(f"unknown case set {size!r}; known: {', '.join(SIZES)}")
    return [c for c in FAMILIES[family].CASES if size in c.sizes]
