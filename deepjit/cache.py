"""The disk cache: entry folders `<name>.<digest>/`, atomic publish, integrity checks, clean-up.

Rule: an entry exists only whole. Builders work in a private temp folder under the same root,
fsync, write the commit marker last and publish with one atomic rename; a reader trusts an entry
only if it has the marker and its artifact's sha256 matches the manifest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CacheError

__all__ = [
    "MARKER", "MANIFEST", "TMP_DIR", "FAILED_DIR", "COMPILERS_DIR", "TAG_FILE",
    "Entry", "Hit", "GcReport", "ensure_root", "writable_root", "entry_path", "lookup",
    "new_build_dir", "commit", "publish", "discard", "sweep_stale", "iter_entries", "entry_problems",
    "verify", "gc", "clear", "stats", "save_failure",
]

log = logging.getLogger(__name__)

MARKER = "COMMITTED"
MANIFEST = "manifest.json"
TMP_DIR = ".tmp"
FAILED_DIR = ".failed"
COMPILERS_DIR = ".compilers"
TAG_FILE = "CACHEDIR.TAG"
# The standard cache-directory tag (backup tools skip such folders); clear/gc refuse roots without it.
TAG_CONTENT = "Signature: 8a477f597d28d172789f06886806bc55\n# deepjit build cache; see docs/deepjit.md\n"
PRIVATE_DIR_MODE = 0o700
SHARED_DIR_MODE = 0o2775
_ENTRY_RE = re.compile(r"^([A-Za-z0-9_]+)\.([0-9a-f]{64})$")
_PUBLISH_ATTEMPTS = 5


# --- roots ----------------------------------------------------------------------------------------


def _make_dir(path: Path, shared: bool) -> None:
    """Create `path` (parents with default modes); set the private or shared mode only if we made it."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return
    os.chmod(path, mode)  # mkdir's mode is filtered by the umask


def ensure_root(root: Path, shared: bool = False) -> bool:
    """Create the root (0700, or 2775 in shared mode) with its tag file; True if we can write there."""
    try:
        _make_dir(root, shared)
        tag = root / TAG_FILE
        if not tag.exists():
            partial = root / f".{TAG_FILE}.{os.getpid()}.{threading.get_ident()}"
            partial.write_text(TAG_CONTENT)
            os.replace(partial, tag)
    except OSError:
        return False
    return os.access(root, os.W_OK | os.X_OK)


def writable_root(roots: Sequence[Path], shared: bool = False) -> Path:
    for root in roots:
        if ensure_root(root, shared):
            return root
    raise CacheError(
        f"no writable cache root among {[str(r) for r in roots]}; set DEEPJIT_CACHE_DIR to a writable "
        "folder, or DEEPJIT_DISABLE_CACHE=1 to build without a disk cache"
    )


# --- entries -------------------------------------------------------------------------------------


def entry_path(root: Path, name: str, digest: str) -> Path:
    return root / f"{name}.{digest}"


@dataclass(frozen=True)
class Entry:
    root: Path
    path: Path
    name: str
    digest: str

    def manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    @property
    def committed(self) -> bool:
        return (self.path / MARKER).is_file()

    def size(self) -> int:
        total = 0
        for child in self.path.iterdir():
            try:
                total += child.stat().st_size
            except OSError:
                pass
        return total

    def last_used(self) -> float:
        """mtime of the marker, touched on every disk hit (falls back to the folder's mtime)."""
        for candidate in (self.path / MARKER, self.path):
            try:
                return candidate.stat().st_mtime
            except OSError:
                continue
        return 0.0


@dataclass(frozen=True)
class Hit:
    entry: Entry
    artifact: Path
    image: bytes
    manifest: dict[str, Any]


def _check(entry: Entry) -> tuple[Hit | None, str | None]:
    """(hit, None) if the entry is sound, else (None, the problem in words)."""
    if not (entry.path / MARKER).is_file():
        return None, "no commit marker (incomplete entry)"
    manifest = entry.manifest()
    if manifest is None:
        return None, "manifest missing or unreadable"
    artifact = entry.path / str(manifest.get("artifact", ""))
    try:
        image = artifact.read_bytes()
    except OSError:
        return None, f"artifact {manifest.get('artifact')!r} missing"
    actual = hashlib.sha256(image).hexdigest()
    if actual != manifest.get("artifact_sha256"):
        recorded = str(manifest.get("artifact_sha256"))
        return None, f"artifact sha256 {actual[:16]}... does not match the manifest's {recorded[:16]}..."
    return Hit(entry, artifact, image, manifest), None


def entry_problems(entry: Entry) -> str | None:
    return _check(entry)[1]


def lookup(roots: Sequence[Path], name: str, digest: str) -> tuple[Hit | None, bool]:
    """Search the roots in order. Returns (hit, saw_bad_entry); a bad entry is a miss."""
    saw_bad = False
    for root in roots:
        path = entry_path(root, name, digest)
        if not path.is_dir():
            continue
        hit, problem = _check(Entry(root, path, name, digest))
        if hit is None:
            log.warning("deepjit: cache entry %s is unusable (%s); rebuilding", path, problem)
            saw_bad = True
            continue
        try:
            os.utime(path / MARKER)  # "last used", for gc --unused-for
        except OSError:
            pass
        return hit, saw_bad
    return None, saw_bad


def iter_entries(root: Path) -> Iterator[Entry]:
    try:
        children = sorted(root.iterdir())
    except OSError:
        return
    for child in children:
        match = _ENTRY_RE.match(child.name)
        if match and child.is_dir():
            yield Entry(root, child, match.group(1), match.group(2))


# --- building and publishing ---------------------------------------------------------------------


def new_build_dir(root: Path, name: str, digest: str, shared: bool = False) -> Path:
    import tempfile

    tmp = root / TMP_DIR
    _make_dir(tmp, shared)
    return Path(tempfile.mkdtemp(prefix=f"{name}.{digest[:16]}.{os.getpid()}.", dir=tmp))


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(build_dir: Path, manifest: dict[str, Any], shared: bool = False) -> None:
    """Write the manifest, fsync every file, then write the marker and fsync the folder."""
    (build_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for child in build_dir.iterdir():
        if shared:
            executable = child.stat().st_mode & 0o111
            os.chmod(child, 0o775 if executable else 0o664)
        _fsync_path(child)
    marker = build_dir / MARKER
    marker.write_text(f"{manifest['digest']} {manifest['artifact_sha256']}\n", encoding="utf-8")
    if shared:
        os.chmod(marker, 0o664)
        os.chmod(build_dir, SHARED_DIR_MODE)
    _fsync_path(marker)
    _fsync_path(build_dir)


def discard(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _move_aside(path: Path, root: Path) -> None:
    """Atomically take a published entry out of the namespace, then delete it."""
    import tempfile

    (root / TMP_DIR).mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    trash = Path(tempfile.mkdtemp(prefix=f"trash.{path.name[:40]}.", dir=root / TMP_DIR))
    try:
        os.rename(path, trash / "entry")
    except FileNotFoundError:
        pass  # someone else moved it first
    discard(trash)


def publish(build_dir: Path, root: Path, name: str, digest: str, replace: bool = False) -> tuple[Path, bool]:
    """Rename the committed build folder into place. Returns (entry path, True if ours was published).

    If a sound entry is already there (another builder won the race) ours is discarded and theirs
    is used, unless `replace` (forced rebuild, or the existing one was corrupt): then the existing
    entry is moved aside first. Concurrent builders therefore all succeed with one entry in place.
    """
    final = entry_path(root, name, digest)
    for _ in range(_PUBLISH_ATTEMPTS):
        try:
            os.rename(build_dir, final)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        else:
            _fsync_path(root)
            return final, True
        if not replace and _check(Entry(root, final, name, digest))[0] is not None:
            discard(build_dir)
            return final, False
        _move_aside(final, root)
        replace = False
    discard(build_dir)
    raise CacheError(f"could not publish {final}: other builders kept replacing it")


def save_failure(root: Path, name: str, digest: str, source_name: str, source: str, log_text: str) -> Path:
    """Keep a failed build's source and log under .failed/ (never as an entry); returns the source path."""
    import tempfile

    failed_root = root / FAILED_DIR
    _make_dir(failed_root, False)
    staging = Path(tempfile.mkdtemp(prefix=f"{name}.{digest[:16]}.", dir=failed_root))
    (staging / source_name).write_text(source, encoding="utf-8")
    (staging / "compile.log").write_text(log_text, encoding="utf-8")
    final = failed_root / f"{name}.{digest}"
    for _ in range(2):
        try:
            os.rename(staging, final)
        except OSError:
            discard(final)  # an older failure of the same key
        else:
            return final / source_name
    return staging / source_name  # a concurrent failure of the same key holds the name; keep ours here


# --- maintenance -------------------------------------------------------------------------------


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def sweep_stale(root: Path, max_age_s: float, dry_run: bool = False) -> list[Path]:
    """Remove temp folders of killed builders and kept failures older than `max_age_s`."""
    now = time.time()
    removed = []
    for folder in (root / TMP_DIR, root / FAILED_DIR):
        try:
            children = list(folder.iterdir())
        except OSError:
            continue
        for child in children:
            if _age(child, now) > max_age_s:
                if not dry_run:
                    discard(child)
                removed.append(child)
    return removed


def verify(roots: Sequence[Path]) -> list[tuple[Entry, str | None]]:
    """Every entry of every root with its problem (None when sound)."""
    return [(entry, entry_problems(entry)) for root in roots for entry in iter_entries(root)]


@dataclass
class GcReport:
    removed: list[tuple[Path, str]] = field(default_factory=list)
    freed_bytes: int = 0


def _require_tag(root: Path, action: str) -> None:
    if not (root / TAG_FILE).is_file():
        raise CacheError(f"refusing to {action} {root}: it has no {TAG_FILE}, so it is not a deepjit cache root")


def _existing(roots: Sequence[Path]) -> list[Path]:
    return [root for root in roots if root.is_dir()]


def gc(
    roots: Sequence[Path],
    *,
    tmp_max_age_s: float,
    unused_for_s: float | None = None,
    max_bytes: int | None = None,
    dry_run: bool = False,
) -> GcReport:
    """Remove stale temp folders, broken entries, entries unused for `unused_for_s`, then the least
    recently used entries until the cache holds at most `max_bytes`."""
    report = GcReport()
    now = time.time()
    for root in _existing(roots):
        if not os.access(root, os.W_OK):
            continue
        _require_tag(root, "gc")
        for path in sweep_stale(root, tmp_max_age_s, dry_run):
            report.removed.append((path, "stale temporary folder"))
        alive: list[tuple[float, int, Entry]] = []
        for entry in iter_entries(root):
            problem = entry_problems(entry)
            reason = problem
            if reason is None and unused_for_s is not None and now - entry.last_used() > unused_for_s:
                reason = "unused for longer than the limit"
            if reason is None:
                alive.append((entry.last_used(), entry.size(), entry))
                continue
            report.freed_bytes += entry.size()
            report.removed.append((entry.path, reason))
            if not dry_run:
                _move_aside(entry.path, root)
        if max_bytes is not None:
            total = sum(size for _, size, _ in alive)
            for _, size, entry in sorted(alive, key=lambda item: item[0]):
                if total <= max_bytes:
                    break
                total -= size
                report.freed_bytes += size
                report.removed.append((entry.path, "least recently used beyond the size limit"))
                if not dry_run:
                    _move_aside(entry.path, root)
    return report


def clear(roots: Sequence[Path], *, name: str | None = None, dry_run: bool = False) -> list[Path]:
    """Remove entries (all, or those compiled under `name`); without `name` also temp, failures and
    compiler identities. The tag file stays, so the root remains a recognisable cache."""
    removed = []
    for root in _existing(roots):
        if not os.access(root, os.W_OK):
            continue
        _require_tag(root, "clear")
        for entry in iter_entries(root):
            if name is None or entry.name == name:
                removed.append(entry.path)
                if not dry_run:
                    _move_aside(entry.path, root)
        if name is None:
            for folder in (FAILED_DIR, COMPILERS_DIR, TMP_DIR):
                path = root / folder
                if path.exists():
                    removed.append(path)
                    if not dry_run:
                        discard(path)
    return removed


def _count_children(folder: Path) -> int:
    try:
        return sum(1 for _ in folder.iterdir())
    except OSError:
        return 0


def stats(roots: Sequence[Path]) -> list[dict[str, Any]]:
    result = []
    for root in roots:
        entries = list(iter_entries(root))
        by_toolchain: dict[str, int] = {}
        broken = 0
        total = 0
        for entry in entries:
            manifest = entry.manifest() or {}
            key = f"{manifest.get('toolchain', '?')}/{manifest.get('kind', '?')}"
            by_toolchain[key] = by_toolchain.get(key, 0) + 1
            total += entry.size()
            broken += entry_problems(entry) is not None
        result.append({
            "root": str(root),
            "exists": root.is_dir(),
            "writable": root.is_dir() and os.access(root, os.W_OK),
            "entries": len(entries),
            "bytes": total,
            "by_toolchain": by_toolchain,
            "broken": broken,
            "temporary": _count_children(root / TMP_DIR),
            "failed": _count_children(root / FAILED_DIR),
        })
    return result
