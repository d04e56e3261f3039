"""What a cubin says about a kernel, read with the cuobjdump of Triton's wheel (one call per cubin):
registers, stack frame and local memory (spills), the tensor-core instruction family, TMA, and the
widest global load. Pure text parsing apart from `read_cubin`, so it is tested on SASS excerpts.

Instruction families (SASS opcode -> PTX): HGMMA/QGMMA/IGMMA = wgmma (sm_90a), UTC*MMA = tcgen05.mma
(sm_100a), HMMA/QMMA/IMMA = mma.sync (any arch since sm_80); UTMALDG = cp.async.bulk.tensor (TMA load).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import attrs

WGMMA = "wgmma"
TCGEN05 = "tcgen05"
MMA_SYNC = "mma.sync"
NO_MMA = "none"

_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
#: `/*0a30*/   @!P0 HGMMA.64x128x16.F32.BF16 gdesc[UR4], ...` -> the opcode with its modifiers
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")
_WGMMA_OPS = {"HGMMA", "QGMMA", "IGMMA", "BGMMA"}
_MMA_SYNC_OPS = {"HMMA", "QMMA", "IMMA", "BMMA", "DMMA", "OMMA"}
_TMA_LOADS = {"UTMALDG"}
_GLOBAL_LOADS = {"LDG", "LDGSTS"}
_WIDTH_BY_MODIFIER = {"256": 256, "128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}


def mma_family(opcode: str) -> str | None:
    """The tensor-core family of one SASS opcode (base name before the first dot), or None."""
    base = opcode.split(".", 1)[0]
    if base in _WGMMA_OPS:
        return WGMMA
    if base.startswith("UTC") and base.endswith("MMA"):
        return TCGEN05
    if base in _MMA_SYNC_OPS:
        return MMA_SYNC
    return None


def load_width_bits(opcode: str) -> int:
    """Bits one thread moves with a global load opcode: LDG.E.128 -> 128, LDG.E.U16 -> 16, LDG.E -> 32."""
    widths = [_WIDTH_BY_MODIFIER[m] for m in opcode.split(".")[1:] if m in _WIDTH_BY_MODIFIER]
    return max(widths, default=32)


@attrs.frozen
class SassFacts:
    """One kernel's facts from its cubin."""

    registers: int
    stack_bytes: int
    local_bytes: int
    #: opcode (with modifiers) -> count, tensor-core instructions only
    mma: dict[str, int]
    tma_loads: int
    #: widest global load opcode (LDG / LDGSTS) and its width in bits; ("", 0) when none
    widest_load: str
    widest_load_bits: int

    @property
    def mma_families(self) -> tuple[str, ...]:
        return tuple(sorted({mma_family(op) for op in self.mma}))

    @property
    def tensor_core(self) -> str:
        """"wgmma", "tcgen05", "mma.sync", several joined by "+", or "none"."""
        return "+".join(self.mma_families) or NO_MMA


def parse(resource_usage_and_sass: str) -> SassFacts:
    """Read `cuobjdump -sass --dump-resource-usage` output of a one-kernel cubin."""
    found = _RESOURCES.search(resource_usage_and_sass)
    if found is None:
        raise ValueError("no 'REG:.. STACK:.. SHARED:.. LOCAL:..' line in the cuobjdump output")
    registers, stack, _, local = (int(g) for g in found.groups())
    mma: collections.Counter = collections.Counter()
    tma = 0
    widest, widest_bits = "", 0
    for line in resource_usage_and_sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match is None:
            continue
        opcode = match.group(1)
        base = opcode.split(".", 1)[0]
        if mma_family(opcode):
            mma[opcode] += 1
        elif base in _TMA_LOADS:
            tma += 1
        elif base in _GLOBAL_LOADS:
            bits = load_width_bits(opcode)
            if bits > widest_bits:
                widest, widest_bits = opcode, bits
    return SassFacts(registers, stack, local, dict(mma), tma, widest, widest_bits)


def read_cubin(cubin: bytes) -> SassFacts:
    """Run the cuobjdump of Triton's wheel on `cubin` and parse it."""
    from triton import knobs
    fd, path = tempfile.mkstemp(suffix=".cubin")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        text = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", "--dump-resource-usage", path],
                              check=True, capture_output=True, text=True).stdout
    finally:
        os.remove(path)
    return parse(text)
