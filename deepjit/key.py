"""Cache keys: include tracking and the hash of every input that can change a build's output.

Rule: a key depends on contents and identities only (source, tracked headers, compiler `--version`
output, flags in order, defines, toolchain, signature strings), never on where the cache, the
headers or the compiler live, so a relocated install hits the same entries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KEY_FORMAT", "IncludeScan", "scan_includes", "stamps_unchanged", "digest_of", "sha256_file"]

# Bump when the meaning of a key document changes, so old entries stop matching.
KEY_FORMAT = 1
MISSING = "<missing>"

# Over-matches on purpose: includes inside comments or disabled #if blocks are tracked too,
# which can only make a key more specific, never stale.
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)

# (path, stat signature or None when absent) pairs used to revalidate an in-process cache hit.
Stamp = tuple[str, "tuple[int, int, int] | None"]


@dataclass(frozen=True)
class IncludeScan:
    """Result of following a source's includes through the include dirs.

    records: (spelling, sha256 of content | "<missing>") in depth-first order; goes into the key.
    stamps: stat signatures of every file read and every folder probed; an in-process hit is
        trusted only while all of them are unchanged (a header edited, added or removed).
    """

    records: tuple[tuple[str, str], ...]
    stamps: tuple[Stamp, ...]


def _stat_signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def stamps_unchanged(stamps: Iterable[Stamp]) -> bool:
    return all(_stat_signature(path) == signature for path, signature in stamps)


def scan_includes(source: str, include_dirs: Sequence[Path]) -> IncludeScan:
    """Follow `#include` lines transitively, resolving like the compiler does.

    `"x.h"` is looked up beside the including file, then in `include_dirs` in order; `<x.h>` in
    `include_dirs` only. An angle include found nowhere is a system header (covered by the compiler
    identity) and is not tracked; a quoted one found nowhere is recorded as missing, so creating it
    later changes the key. Each file is read once, so include cycles terminate.
    """
    records: list[tuple[str, str]] = []
    probed_dirs: set[str] = set()
    read_files: dict[str, str] = {}
    dirs = [os.fspath(d) for d in include_dirs]

    def resolve(spelling: str, quoted: bool, includer_dir: str | None) -> str | None:
        candidates = ([includer_dir] if quoted and includer_dir is not None else []) + dirs
        for base in candidates:
            candidate = os.path.join(base, spelling)
            probed_dirs.add(os.path.dirname(candidate))
            if os.path.isfile(candidate):
                return candidate
        return None

    def visit(text: str, includer_dir: str | None) -> None:
        for match in _INCLUDE_RE.finditer(text):
            quoted = match.group(1) == '"'
            spelling = match.group(2).strip()
            found = resolve(spelling, quoted, includer_dir)
            if found is None:
                if quoted:
                    records.append((spelling, MISSING))
                continue
            real = os.path.realpath(found)
            if real in read_files:
                records.append((spelling, read_files[real]))
                continue
            with open(found, "rb") as handle:
                content = handle.read()
            digest = hashlib.sha256(content).hexdigest()
            read_files[real] = digest
            records.append((spelling, digest))
            visit(content.decode("utf-8", errors="replace"), os.path.dirname(found))

    visit(source, None)
    stamps = [(path, _stat_signature(path)) for path in sorted(read_files)]
    stamps += [(path, _stat_signature(path)) for path in sorted(probed_dirs)]
    return IncludeScan(records=tuple(records), stamps=tuple(stamps))


def digest_of(document: dict) -> str:
    """sha256 of a canonical JSON encoding (sorted keys, no whitespace) of the key document."""
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def sha256_file(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
