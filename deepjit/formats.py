"""Structural checks of compiler outputs (ELF shared objects, cubins, kernel objects, fatbins).

Rule: an artifact is published only if its own headers say it is complete, so a compiler that
exits 0 after writing nothing, or half a file, never leaves a loadable-looking entry behind.
"""

from __future__ import annotations

import struct
from enum import Enum
from pathlib import Path

__all__ = ["ArtifactFormat", "EM_CUDA", "artifact_problem", "elf_machine"]

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
EM_CUDA = 190
_SHT_NOBITS = 8


class ArtifactFormat(str, Enum):
    ELF = "elf"
    FATBIN = "fatbin"


def _elf_problem(data: bytes) -> str | None:
    if data[:4] != ELF_MAGIC[: len(data)] or not data:
        return "not an ELF file (bad magic)"
    if len(data) < 16:
        return f"ELF header truncated ({len(data)} bytes)"
    elf_class, byte_order = data[4], data[5]
    if elf_class not in (1, 2) or byte_order not in (1, 2):
        return "ELF header has an invalid class or byte order"
    end = "<" if byte_order == 1 else ">"
    if elf_class == 2:
        header, layout = 64, end + "HHIQQQIHHHHHH"
    else:
        header, layout = 52, end + "HHIIIIIHHHHHH"
    if len(data) < header:
        return f"ELF header truncated ({len(data)} bytes)"
    (_, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = struct.unpack_from(layout, data, 16)
    size = len(data)
    if phnum and phoff + phnum * phentsize > size:
        return f"program header table ends past the end of the file ({size} bytes): truncated"
    if shnum and shoff + shnum * shentsize > size:
        return f"section header table ends past the end of the file ({size} bytes): truncated"
    section = end + ("IIQQQQIIQQ" if elf_class == 2 else "IIIIIIIIII")
    for index in range(shnum):
        fields = struct.unpack_from(section, data, shoff + index * shentsize)
        sh_type, sh_offset, sh_size = fields[1], fields[4], fields[5]
        if sh_type != _SHT_NOBITS and sh_offset + sh_size > size:
            return f"section {index} ends past the end of the file ({size} bytes): truncated"
    if not shnum and not phnum:
        return "ELF file has neither sections nor segments"
    return None


def _fatbin_problem(data: bytes) -> str | None:
    if len(data) < 16:
        return f"fatbin header truncated ({len(data)} bytes)"
    magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, 0)
    if magic != FATBIN_MAGIC:
        return "not a CUDA fatbin (bad magic)"
    if header_size + fat_size > len(data):
        return f"fatbin declares {header_size + fat_size} bytes but the file has {len(data)}: truncated"
    return None


def artifact_problem(data: bytes | None, fmt: ArtifactFormat) -> str | None:
    """None if `data` (a compiler's output file, None when there is none) looks like a complete
    artifact of format `fmt`, else a sentence why not."""
    if data is None:
        return "the compiler produced no output file"
    if not data:
        return "the compiler produced an empty output file"
    return _elf_problem(data) if fmt is ArtifactFormat.ELF else _fatbin_problem(data)


def elf_machine(path: Path) -> int:
    """The e_machine field of an ELF file (EM_CUDA=190 for cubins, 62 for x86-64)."""
    data = path.read_bytes()[:20]
    return struct.unpack_from("<H" if data[5] == 1 else ">H", data, 18)[0]
