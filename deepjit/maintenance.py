"""Cache maintenance: sweeping what dead builders left, gc, clear and stats.

Rule: maintenance never removes what a live builder is using (its key's lock is held), never
works in a root that cannot be trusted or that lacks the CACHEDIR.TAG file, and reports corrupt
or unsafe entries instead of failing on them.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import trust
from .cache import COMPILERS_DIR, FAILED_DIR, LOCKS_DIR, TAG_FILE, TMP_DIR, Entry, inspect, iter_entries, move_aside
from .errors import CacheError, UnsafeCacheError
from .locks import build_is_live, remove_unheld_lock
from .trust import Folder, Policy

__all__ = ["GcReport", "sweep_stale", "gc", "clear", "stats"]

log = logging.getLogger(__name__)


def _age(dir_fd: int, name: str, now: float) -> float:
    try:
        return now - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _sweep(root: Folder, pol: Policy, max_age_s: float | None, dry_run: bool) -> list[Path]:
    """Remove children of .tmp and .failed (older than `max_age_s` unless None), sparing temp folders
    of live builders, and lock files nobody holds."""
    now = time.time()
    removed = []
    for folder_name in (TMP_DIR, FAILED_DIR):
        folder = trust.open_dir_at(root, folder_name, pol)
        if folder is None:
            continue
        with folder:
            for child in sorted(os.listdir(folder.fd)):
                if max_age_s is not None and _age(folder.fd, child, now) <= max_age_s:
                    continue
                if folder_name == TMP_DIR and build_is_live(root, child):
                    continue
                if not dry_run:
                    try:
                        trust.remove_at(folder.fd, child)
                    except OSError as exc:
                        log.warning("deepjit: cannot remove %s: %s", folder.path / child, exc)
                        continue
                removed.append(folder.path / child)
    locks = trust.open_dir_at(root, LOCKS_DIR, pol)
    if locks is not None and not dry_run:
        with locks:  # lock files hold no data, so they are not reported
            for child in sorted(os.listdir(locks.fd)):
                if max_age_s is None or _age(locks.fd, child, now) > max_age_s:
                    remove_unheld_lock(locks.fd, child)
    elif locks is not None:
        locks.close()
    return removed


def sweep_stale(root: Folder, max_age_s: float, dry_run: bool = False, shared: bool = False) -> list[Path]:
    """Remove temp folders of dead builders and kept failures older than `max_age_s`."""
    return _sweep(root, trust.policy(shared), max_age_s, dry_run)


@dataclass
class GcReport:
    """What gc removed (path, why), the bytes of removed entries, and what it could not remove (path, why)."""

    removed: list[tuple[Path, str]] = field(default_factory=list)
    freed_bytes: int = 0
    failed: list[tuple[Path, str]] = field(default_factory=list)


def _remove_entry(root: Folder, entry: Entry, pol: Policy) -> str | None:
    """Take an entry out of the cache; None when done, else why not (e.g. another user's folder)."""
    try:
        move_aside(root, entry.path.name, pol)
    except OSError as exc:
        problem = str(trust.io_error(exc, entry.path, "remove"))
        log.warning("deepjit: %s", problem)
        return problem
    return None


def _require_tag(root: Folder, action: str) -> None:
    try:
        st = os.stat(TAG_FILE, dir_fd=root.fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        raise CacheError(
            f"refusing to {action} {root.path}: it has no {TAG_FILE} file, so it is not a deepjit cache root"
        )


def _writable(root: Folder) -> bool:
    return os.access(".", os.W_OK | os.X_OK, dir_fd=root.fd)


def _tagged_writable_roots(roots: Sequence[Path], pol: Any, what: str) -> Iterator[tuple[Path, Folder]]:
    """Each root that exists, is safe, can be written and carries the cache tag, opened for `what`
    (gc or clear), closed again once the caller moves on."""
    for root_path in roots:
        root = trust.open_root(root_path, pol)
        if root is None:
            continue
        with root:
            if not _writable(root):
                continue
            _require_tag(root, what)
            yield root_path, root


def gc(
    roots: Sequence[Path],
    *,
    tmp_max_age_s: float,
    unused_for_s: float | None = None,
    max_bytes: int | None = None,
    dry_run: bool = False,
    shared: bool = False,
) -> GcReport:
    """Remove stale temp folders (never a live builder's), broken or unsafe entries, entries unused for
    `unused_for_s`, then the least recently used entries until the cache holds at most `max_bytes`."""
    pol = trust.policy(shared)
    report = GcReport()
    now = time.time()
    for root_path, root in _tagged_writable_roots(roots, pol, "gc"):
        for path in _sweep(root, pol, tmp_max_age_s, dry_run):
            report.removed.append((path, "stale temporary folder"))
        alive: list[tuple[float, int, Entry]] = []
        for entry in iter_entries(root_path):
            reason, _ = inspect(root, entry, pol)
            if reason is None and unused_for_s is not None and now - entry.last_used() > unused_for_s:
                reason = "unused for longer than the limit"
            if reason is None:
                alive.append((entry.last_used(), entry.size(), entry))
                continue
            size = entry.size()
            failure = None if dry_run else _remove_entry(root, entry, pol)
            if failure is not None:
                report.failed.append((entry.path, failure))
                continue
            report.freed_bytes += size
            report.removed.append((entry.path, reason))
        if max_bytes is not None:
            total = sum(size for _, size, _ in alive)
            for _, size, entry in sorted(alive, key=lambda item: item[0]):
                if total <= max_bytes:
                    break
                failure = None if dry_run else _remove_entry(root, entry, pol)
                if failure is not None:
                    report.failed.append((entry.path, failure))
                    continue
                total -= size
                report.freed_bytes += size
                report.removed.append((entry.path, "least recently used beyond the size limit"))
    return report


def clear(
    roots: Sequence[Path], *, name: str | None = None, dry_run: bool = False, shared: bool = False
) -> list[Path]:
    """Remove entries (all, or those compiled under `name`); without `name` also temp folders (not those
    of live builders), kept failures, unheld locks and compiler identities. The tag file stays, so the
    root remains a recognisable cache. What cannot be removed is logged as a warning and skipped."""
    pol = trust.policy(shared)
    removed = []
    for root_path, root in _tagged_writable_roots(roots, pol, "clear"):
        for entry in iter_entries(root_path):
            if (name is None or entry.name == name) and (dry_run or _remove_entry(root, entry, pol) is None):
                removed.append(entry.path)
        if name is None:
            removed += _sweep(root, pol, None, dry_run)
            compilers = root.path / COMPILERS_DIR
            if os.path.lexists(compilers):
                removed.append(compilers)
                if not dry_run:
                    with trust.guarded(compilers, "remove"):
                        trust.remove_at(root.fd, COMPILERS_DIR)
    return removed


def _count_children(root: Folder, name: str) -> int:
    try:
        fd = os.open(name, trust.O_DIR, dir_fd=root.fd)
    except OSError:
        return 0
    try:
        return len(os.listdir(fd))
    finally:
        os.close(fd)


def stats(roots: Sequence[Path], shared: bool = False) -> list[dict[str, Any]]:
    """Per root: entries, bytes, counts per toolchain/kind, broken (corrupt or unsafe) entries, leftovers.
    A root that cannot be trusted is reported with its `problem` and not looked into."""
    pol = trust.policy(shared)
    result = []
    for root_path in roots:
        row: dict[str, Any] = {
            "root": str(root_path), "exists": False, "writable": False, "problem": None, "entries": 0,
            "bytes": 0, "by_toolchain": {}, "broken": 0, "unsafe": 0, "temporary": 0, "failed": 0,
        }
        result.append(row)
        try:
            root = trust.open_root(root_path, pol)
        except UnsafeCacheError as exc:
            row["exists"], row["problem"] = True, str(exc)
            continue
        if root is None:
            continue
        with root:
            row["exists"], row["writable"] = True, _writable(root)
            for entry in iter_entries(root_path):
                row["entries"] += 1
                row["bytes"] += entry.size()
                problem, manifest = inspect(root, entry, pol)
                if manifest is None:
                    row["broken"] += 1
                    row["unsafe"] += str(problem).startswith("unsafe:")
                    key = "?/?"
                else:
                    key = f"{manifest['toolchain']}/{manifest['kind']}"
                row["by_toolchain"][key] = row["by_toolchain"].get(key, 0) + 1
            row["temporary"] = _count_children(root, TMP_DIR)
            row["failed"] = _count_children(root, FAILED_DIR)
    return result
