"""The disk cache: roots, entry folders `<name>.<digest>/`, integrity checks, atomic publication.

Rule: an entry exists only whole and is used only if it can be trusted. A builder (holding the
key's lock, locks.py) works in a private temp folder under the same root, fsyncs, writes the
commit marker last and publishes with one atomic rename. A reader uses an entry only if every
path in it passes the trust checks (trust.py), its marker and manifest are sound and its
artifact's sha256 matches, and then loads the very bytes it hashed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import trust
from .errors import CacheError, UnsafeCacheError
from .trust import Corrupt, Folder, Policy, VerifiedFile

__all__ = [
    "MARKER", "MANIFEST", "TMP_DIR", "FAILED_DIR", "COMPILERS_DIR", "LOCKS_DIR", "TAG_FILE", "MANIFEST_FORMAT",
    "Entry", "Hit", "IdentityMemo", "ensure_root", "writable_root", "open_root", "entry_path",
    "lookup", "read_verified", "manifest_problem", "inspect", "new_build_dir", "commit", "publish",
    "discard_build", "iter_entries", "entry_problems", "verify", "save_failure", "BuildFolderRemoved",
]

log = logging.getLogger(__name__)

MARKER = "COMMITTED"
MANIFEST = "manifest.json"
TMP_DIR = ".tmp"
FAILED_DIR = ".failed"
COMPILERS_DIR = ".compilers"
LOCKS_DIR = ".locks"
TAG_FILE = "CACHEDIR.TAG"
# The standard cache-directory tag (backup tools skip such folders); clear/gc refuse roots without it.
TAG_CONTENT = "Signature: 8a477f597d28d172789f06886806bc55\n# deepjit build cache; see docs/deepjit.md\n"
# Bump when the manifest's meaning changes; entries of another format are rebuilt.
MANIFEST_FORMAT = 1
PRIVATE_DIR_MODE = 0o700
SHARED_DIR_MODE = 0o2775
_MANIFEST_LIMIT = 64 << 20
_SMALL_FILE_LIMIT = 4096
_ENTRY_RE = re.compile(r"^([A-Za-z0-9_]+)\.([0-9a-f]{64})$")
BUILD_RE = re.compile(r"^([A-Za-z0-9_]+)\.([0-9a-f]{64})\.")  # .tmp/<name>.<digest>.<pid>.<random>
_ARTIFACT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_PUBLISH_ATTEMPTS = 5


class BuildFolderRemoved(CacheError):
    """The build folder was deleted while a build ran in it (a clean-up by hand or by an old deepjit)."""


def dir_mode(shared: bool) -> int:
    return SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE


# --- roots ----------------------------------------------------------------------------------------


def open_root(root: Path, shared: bool) -> Folder | None:
    """The root as a checked folder (UnsafeCacheError if it cannot be trusted), None if absent."""
    return trust.open_root(root, trust.policy(shared))


def _create_root(root: Path, shared: bool) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=dir_mode(shared))
    except FileExistsError:
        return
    fd = os.open(root, trust.O_DIR)
    try:
        os.fchmod(fd, dir_mode(shared))  # mkdir's mode is filtered by the umask
    finally:
        os.close(fd)


def _write_tag(folder: Folder, pol: Policy) -> None:
    opened = trust.open_file_at(folder, TAG_FILE, pol, "the cache tag")
    if opened is not None:
        os.close(opened[0])
        return
    partial = f".{TAG_FILE}.{os.getpid()}.{os.urandom(4).hex()}"
    trust.write_new_file_at(folder, partial, TAG_CONTENT.encode(), 0o644)
    os.replace(partial, TAG_FILE, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)


def ensure_root(root: Path, shared: bool = False) -> str | None:
    """Create the root if missing (0700, or 2775 shared) with its tag. None if we can build there,
    else the reason why not; UnsafeCacheError if an existing root cannot be trusted."""
    pol = trust.policy(shared)
    folder = trust.open_root(root, pol)
    if folder is None:
        try:
            _create_root(root, shared)
        except OSError as exc:
            return f"cannot create it ({exc.strerror or exc})"
        folder = trust.open_root(root, pol)
        if folder is None:
            return "it is not a folder"
    with folder:
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=folder.fd):
            return "you cannot write it"
        try:
            _write_tag(folder, pol)
        except Corrupt as exc:
            return f"its {TAG_FILE} is unusable ({exc})"
        except OSError as exc:
            return f"cannot write its {TAG_FILE} ({exc.strerror or exc})"
    return None


def writable_root(roots: Sequence[Path], shared: bool = False) -> Path:
    reasons = []
    for root in roots:
        reason = ensure_root(root, shared)
        if reason is None:
            return root
        reasons.append(f"{root}: {reason}")
    raise CacheError(
        f"no writable cache root ({'; '.join(reasons)}); set DEEPJIT_CACHE_DIR to a writable "
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

    def manifest(self, shared: bool = False) -> dict[str, Any] | None:
        """The manifest if it is sound and can be trusted, else None (for listings; never raises)."""
        pol = trust.policy(shared)
        try:
            root = trust.open_root(self.root, pol)
            if root is None:
                return None
            with root:
                folder = trust.open_dir_at(root, self.path.name, pol, "the cache entry")
                if folder is None:
                    return None
                with folder:
                    return _read_manifest(folder, self, pol)[0]
        except (CacheError, Corrupt, OSError):
            return None

    @property
    def committed(self) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.path / MARKER).st_mode)
        except OSError:
            return False

    def size(self) -> int:
        """Bytes of the files directly in the entry (0 for a link or a file posing as an entry)."""
        try:
            fd = os.open(self.path, trust.O_DIR)
        except OSError:
            return 0
        total = 0
        try:
            for child in os.listdir(fd):
                try:
                    total += os.stat(child, dir_fd=fd, follow_symlinks=False).st_size
                except OSError:
                    pass
        finally:
            os.close(fd)
        return total

    def last_used(self) -> float:
        """mtime of the marker, touched on every disk hit (falls back to the entry's own mtime)."""
        for candidate in (self.path / MARKER, self.path):
            try:
                return os.lstat(candidate).st_mtime
            except OSError:
                continue
        return 0.0


@dataclass(frozen=True)
class Hit:
    """A sound entry and its artifact, open and hashed: close `file` when done."""

    entry: Entry
    file: VerifiedFile
    manifest: dict[str, Any]

    @property
    def artifact(self) -> Path:
        return self.file.path


def manifest_problem(manifest: Any, entry: Entry) -> str | None:
    """Why a parsed manifest is not one deepjit wrote for `entry`, or None."""
    if not isinstance(manifest, dict):
        return f"manifest is a JSON {type(manifest).__name__}, not an object"
    version = manifest.get("manifest_format")
    if type(version) is not int or version != MANIFEST_FORMAT:
        return f"manifest format {version!r} is not {MANIFEST_FORMAT} (written by another deepjit version)"
    for key, expected in (("name", entry.name), ("digest", entry.digest)):
        if manifest.get(key) != expected:
            return f"manifest {key} {manifest.get(key)!r} does not match the entry's {expected!r}"
    for key in ("toolchain", "kind"):
        if not isinstance(manifest.get(key), str):
            return f"manifest {key} is not a string"
    artifact = manifest.get("artifact")
    if not isinstance(artifact, str) or not _ARTIFACT_RE.match(artifact) or artifact in (MANIFEST, MARKER):
        return f"manifest artifact {artifact!r} is not a plain file name"
    sha = manifest.get("artifact_sha256")
    if not isinstance(sha, str) or not _SHA256_RE.match(sha):
        return f"manifest artifact_sha256 {sha!r} is not a sha256 hex digest"
    size = manifest.get("artifact_bytes")
    if type(size) is not int or size < 0:
        return f"manifest artifact_bytes {size!r} is not a size"
    return None


def _read_manifest(folder: Folder, entry: Entry, pol: Policy) -> tuple[dict[str, Any] | None, str | None]:
    raw = trust.read_file_at(folder, MANIFEST, pol, _MANIFEST_LIMIT)
    if raw is None:
        return None, "manifest missing"
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"manifest is not valid JSON ({exc})"
    problem = manifest_problem(manifest, entry)
    return (None, problem) if problem is not None else (manifest, None)


def _check_at(
    root: Folder, entry: Entry, pol: Policy, artifact_name: str | None = None, touch: bool = False
) -> tuple[Hit | None, str | None]:
    """(hit, None) if the entry is sound, (None, problem) if corrupt, (None, None) if absent.
    Raises UnsafeCacheError for an entry that cannot be trusted. `touch`: mark a sound entry used."""
    try:
        folder = trust.open_dir_at(root, entry.path.name, pol, "the cache entry")
    except Corrupt as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot open it ({exc.strerror or exc})"
    if folder is None:
        return None, None
    with folder:
        try:
            return _check_entry(folder, entry, pol, artifact_name, touch)
        except Corrupt as exc:
            return None, str(exc)
        except OSError as exc:
            return None, f"cannot read it ({exc.strerror or exc})"


def _check_entry(
    folder: Folder, entry: Entry, pol: Policy, artifact_name: str | None, touch: bool
) -> tuple[Hit | None, str | None]:
    marker = trust.read_file_at(folder, MARKER, pol, _SMALL_FILE_LIMIT)
    if marker is None:
        return None, "no commit marker (incomplete entry)"
    manifest, problem = _read_manifest(folder, entry, pol)
    if manifest is None:
        return None, problem
    if artifact_name is not None and manifest["artifact"] != artifact_name:
        return None, f"manifest names the artifact {manifest['artifact']!r}, this request builds {artifact_name!r}"
    if marker != f"{entry.digest} {manifest['artifact_sha256']}\n".encode():
        return None, "commit marker does not match the manifest"
    file = trust.open_verified(folder, manifest["artifact"], pol)
    if file is None:
        return None, f"artifact {manifest['artifact']!r} missing"
    if file.sha256 != manifest["artifact_sha256"] or len(file.data) != manifest["artifact_bytes"]:
        file.close()
        return None, (f"artifact sha256 {file.sha256[:16]}... ({len(file.data)} bytes) does not match the "
                      f"manifest's {manifest['artifact_sha256'][:16]}... ({manifest['artifact_bytes']} bytes)")
    if touch:
        try:
            os.utime(MARKER, dir_fd=folder.fd, follow_symlinks=False)  # "last used", for gc --unused-days
        except OSError:
            pass
    return Hit(entry, file, manifest), None


def entry_problems(entry: Entry, shared: bool = False) -> str | None:
    """The entry's problem in words (corrupt, missing or unsafe), None when sound."""
    pol = trust.policy(shared)
    try:
        root = trust.open_root(entry.root, pol)
        if root is None:
            return "its cache root is missing"
        with root:
            hit, problem = _check_at(root, entry, pol)
    except UnsafeCacheError as exc:
        return f"unsafe: {exc}"
    if hit is not None:
        hit.file.close()
        return None
    return problem or "missing"


def lookup(
    roots: Sequence[Path], name: str, digest: str, *, shared: bool = False, artifact_name: str | None = None
) -> tuple[Hit | None, bool]:
    """Search the roots in order. Returns (hit, saw_bad_entry); a corrupt entry is a miss.
    An entry or root that cannot be trusted raises UnsafeCacheError (it is never used)."""
    pol = trust.policy(shared)
    saw_bad = False
    for root_path in roots:
        root = trust.open_root(root_path, pol)
        if root is None:
            continue
        with root:
            entry = Entry(root_path, entry_path(root_path, name, digest), name, digest)
            hit, problem = _check_at(root, entry, pol, artifact_name, touch=True)
        if hit is not None:
            return hit, saw_bad
        if problem is not None:
            log.warning("deepjit: cache entry %s is unusable (%s); rebuilding", entry.path, problem)
            saw_bad = True
    return None, saw_bad


def read_verified(path: Path, sha256: str, shared: bool = False) -> VerifiedFile | None:
    """The artifact at `<root>/<entry>/<file>` opened through checked folders, if its bytes still hash
    to `sha256`; None if it is gone or changed. UnsafeCacheError if any part cannot be trusted."""
    pol = trust.policy(shared)
    root = trust.open_root(path.parent.parent, pol)
    if root is None:
        return None
    try:
        with root:
            folder = trust.open_dir_at(root, path.parent.name, pol, "the cache entry")
            if folder is None:
                return None
            with folder:
                file = trust.open_verified(folder, path.name, pol)
    except (Corrupt, OSError):
        return None
    if file is not None and file.sha256 != sha256:
        file.close()
        return None
    return file


def inspect(root: Folder, entry: Entry, pol: Policy) -> tuple[str | None, dict[str, Any] | None]:
    """(problem, None) for a corrupt or unsafe entry (reported, never raised), (None, manifest) for a sound one."""
    try:
        hit, problem = _check_at(root, entry, pol)
    except UnsafeCacheError as exc:
        return f"unsafe: {exc}", None
    if hit is None:
        return problem or "disappeared while being checked", None
    hit.file.close()
    return None, hit.manifest


def verify(roots: Sequence[Path], shared: bool = False) -> list[tuple[Entry, str | None]]:
    """Every entry of every root with its problem (None when sound). An unsafe entry is reported,
    an unsafe root raises UnsafeCacheError."""
    pol = trust.policy(shared)
    results = []
    for root_path in roots:
        root = trust.open_root(root_path, pol)
        if root is None:
            continue
        with root:
            results += [(entry, inspect(root, entry, pol)[0]) for entry in iter_entries(root_path)]
    return results


def iter_entries(root: Path) -> Iterator[Entry]:
    """Every name in `root` spelled like an entry, whatever it is (a link or a file is reported as bad)."""
    try:
        children = sorted(os.listdir(root))
    except OSError:
        return
    for child in children:
        match = _ENTRY_RE.match(child)
        if match:
            yield Entry(root, root / child, match.group(1), match.group(2))


# --- building and publishing ---------------------------------------------------------------------


def new_build_dir(root: Folder, name: str, digest: str, shared: bool = False) -> Folder:
    """A fresh private folder `.tmp/<name>.<digest>.<pid>.<random>`, open (CacheIOError on failure)."""
    pol = trust.policy(shared)
    mode = dir_mode(shared)
    with trust.guarded(root.path / TMP_DIR, "create a build folder in"):
        with trust.ensure_dir_at(root, TMP_DIR, pol, mode) as tmp:
            build_name = f"{name}.{digest}.{os.getpid()}.{os.urandom(4).hex()}"
            return trust.ensure_dir_at(tmp, build_name, pol, mode, "the build folder")


def _fsync_at(folder: Folder, name: str) -> None:
    fd = os.open(name, trust.O_READ, dir_fd=folder.fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(build: Folder, manifest: dict[str, Any], shared: bool = False) -> None:
    """Write the manifest, fsync every file, then write the marker and fsync the folder
    (CacheIOError naming the path on a full disk or any other refusal)."""
    file_mode = 0o664 if shared else 0o600
    with trust.guarded(build.path / MANIFEST, "write"):
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
        trust.write_new_file_at(build, MANIFEST, text.encode("utf-8"), file_mode)
    for child in os.listdir(build.fd):
        with trust.guarded(build.path / child, "flush"):
            if shared:
                executable = os.stat(child, dir_fd=build.fd, follow_symlinks=False).st_mode & 0o111
                fd = os.open(child, trust.O_READ, dir_fd=build.fd)
                try:
                    os.fchmod(fd, 0o775 if executable else 0o664)
                finally:
                    os.close(fd)
            _fsync_at(build, child)
    with trust.guarded(build.path / MARKER, "write"):
        marker = f"{manifest['digest']} {manifest['artifact_sha256']}\n"
        trust.write_new_file_at(build, MARKER, marker.encode(), file_mode)
        _fsync_at(build, MARKER)
        os.fsync(build.fd)


def discard_build(root: Folder, build: Folder) -> None:
    """Delete a build folder (best effort: a leftover is swept later)."""
    try:
        trust.remove_at(root.fd, f"{TMP_DIR}/{build.path.name}")
    except OSError:
        pass


def move_aside(root: Folder, name: str, pol: Policy) -> None:
    """Atomically take an entry (or whatever sits at its name) out of the namespace, then delete it."""
    trust.ensure_dir_at(root, TMP_DIR, pol, dir_mode(pol.shared)).close()
    trash = f"{TMP_DIR}/trash.{name[:40]}.{os.getpid()}.{os.urandom(4).hex()}"
    os.mkdir(trash, PRIVATE_DIR_MODE, dir_fd=root.fd)
    try:
        os.rename(name, f"{trash}/entry", src_dir_fd=root.fd, dst_dir_fd=root.fd)
    except FileNotFoundError:
        pass  # someone else moved it first
    try:
        trust.remove_at(root.fd, trash)
    except OSError:
        pass  # left for gc (e.g. files we may not delete)


def publish(
    root: Folder, build: Folder, name: str, digest: str, *, replace: bool = False, shared: bool = False
) -> tuple[Path, bool]:
    """Rename the committed build folder into place. Returns (entry path, True if ours was published).

    If a sound entry is already there (another builder won the race) ours is discarded and theirs
    is used, unless `replace` (forced rebuild, or the existing one was corrupt): then the existing
    entry is moved aside first. Concurrent builders therefore all succeed with one entry in place."""
    pol = trust.policy(shared)
    final_name = f"{name}.{digest}"
    final = root.path / final_name
    entry = Entry(root.path, final, name, digest)
    for _ in range(_PUBLISH_ATTEMPTS):
        try:
            os.rename(f"{TMP_DIR}/{build.path.name}", final_name, src_dir_fd=root.fd, dst_dir_fd=root.fd)
        except OSError as exc:
            if build.removed():
                raise BuildFolderRemoved(f"the build folder {build.path} was removed before publication") from exc
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise trust.io_error(exc, final, "publish the build as") from exc
        else:
            with trust.guarded(root.path, "flush"):
                os.fsync(root.fd)
            return final, True
        if not replace:
            hit, _ = _check_at(root, entry, pol)
            if hit is not None:
                hit.file.close()
                discard_build(root, build)
                return final, False
        with trust.guarded(final, "move aside"):
            move_aside(root, final_name, pol)
        replace = False
    discard_build(root, build)
    raise CacheError(f"could not publish {final}: other builders kept replacing it")


def save_failure(
    root: Folder, name: str, digest: str, source_name: str, source: str, log_text: str, shared: bool = False
) -> Path:
    """Keep a failed build's source and log under .failed/ (never as an entry); returns the source path."""
    pol = trust.policy(shared)
    with trust.guarded(root.path / FAILED_DIR, "keep the failed build in"):
        with trust.ensure_dir_at(root, FAILED_DIR, pol, dir_mode(shared)) as failed:
            staging = f"{name}.{digest[:16]}.{os.getpid()}.{os.urandom(4).hex()}"
            with trust.ensure_dir_at(failed, staging, pol, PRIVATE_DIR_MODE) as folder:
                trust.write_new_file_at(folder, source_name, source.encode("utf-8"))
                trust.write_new_file_at(folder, "compile.log", log_text.encode("utf-8", errors="replace"))
            final = f"{name}.{digest}"
            for _ in range(2):
                try:
                    os.rename(staging, final, src_dir_fd=failed.fd, dst_dir_fd=failed.fd)
                except OSError:
                    trust.remove_at(failed.fd, final)  # an older failure of the same key
                else:
                    return failed.path / final / source_name
            return failed.path / staging / source_name  # a concurrent failure of the same key holds the name


class IdentityMemo:
    """Compiler `--version` outputs kept in `<root>/.compilers/` (read and written like any cache file)."""

    def __init__(self, root: Path, shared: bool) -> None:
        self.root = root
        self.shared = shared

    def get(self, key: str) -> str | None:
        pol = trust.policy(self.shared)
        try:
            root = trust.open_root(self.root, pol)
            if root is None:
                return None
            with root:
                folder = trust.open_dir_at(root, COMPILERS_DIR, pol)
                if folder is None:
                    return None
                with folder:
                    data = trust.read_file_at(folder, f"{key}.txt", pol, _MANIFEST_LIMIT)
        except (Corrupt, OSError):
            return None
        return data.decode("utf-8", errors="replace") if data is not None else None

    def put(self, key: str, text: str) -> None:
        pol = trust.policy(self.shared)
        try:
            root = trust.open_root(self.root, pol)
            if root is None:
                return
            with root:
                with trust.ensure_dir_at(root, COMPILERS_DIR, pol, dir_mode(self.shared)) as folder:
                    partial = f".{key}.{os.getpid()}.{os.urandom(4).hex()}"
                    trust.write_new_file_at(folder, partial, text.encode("utf-8"), 0o644)
                    os.replace(partial, f"{key}.txt", src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
        except (Corrupt, OSError):
            pass  # only a memo: the next process asks the compiler again


