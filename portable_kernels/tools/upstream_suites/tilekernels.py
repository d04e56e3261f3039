"""TileKernels' tests/ (pytest): mhc, moe, quant and transpose through portable_kernels.tile_kernels.

The references the tests compare against stay upstream's: tile_kernels/torch is copied as the
package `upstream_tile_kernels_torch` and every `tile_kernels.torch` in the tests points there;
only its helper imports (align, QuantTensor, ScoringFunc, the FP4 unpacker: upstream's modules
import TileLang) resolve to the drop-in. Everything else named tile_kernels is the drop-in.
"""

from __future__ import annotations

from .common import DEVICE_RULES, HARDWARE
from .engine import FileRule, Rule, Suite

REFERENCE = "upstream_tile_kernels_torch"

IMPORT_RULES = (
    Rule(r"\btile_kernels\.torch\b", REFERENCE, "upstream's own reference oracles, not the drop-in",
         ("tests/*", f"{REFERENCE}/*")),
    Rule(r"^(\s*)import tile_kernels\s*$",
         rf"\1import portable_kernels.tile_kernels as tile_kernels\n\1import {REFERENCE}", "the drop-in",
         ("tests/*", f"{REFERENCE}/*")),
    Rule(r"^(\s*)from tile_kernels([. ])", r"\1from portable_kernels.tile_kernels\2", "the drop-in",
         ("tests/*", f"{REFERENCE}/*")),
)

AREAS = ("mhc", "moe", "quant", "transpose")
OUT_OF_SCOPE = ("engram",)

SUITE = Suite(
    name="TileKernels",
    copy=(("tests", "tests"), ("tile_kernels/torch", REFERENCE)),
    files=tuple(f"tests/{a}" for a in AREAS),
    kind="pytest",
    rules=IMPORT_RULES + DEVICE_RULES,
    hardware=HARDWARE,
    skipped_files=tuple(FileRule(f"tests/{a}", "out-of-scope", f"TileKernels' {a} kernels are not in the drop-in")
                        for a in OUT_OF_SCOPE),
)
