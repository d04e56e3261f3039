"""Trust checks for the disk cache: who may have written a path, and opening it without following links.

Rule: cache files are read, hashed and loaded only through descriptors opened with O_NOFOLLOW
beneath a root descriptor that passed the same checks, so what was checked is what gets used.
A private cache (the default) must be owned by you (or root) and writable by no one else; a
shared one (CACHE_SHARED=1) also trusts the members of the root's group, which must be yours.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from .errors import CacheIOError, UnsafeCacheError

__all__ = [
    "Corrupt", "Policy", "Folder", "VerifiedFile", "policy", "open_root", "open_dir_at", "ensure_dir_at",
    "open_file_at", "read_file_at", "open_verified", "write_new_file_at", "remove_at", "io_error", "guarded",
    "check_fd", "symlink_error",
]

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under a file's name must not hang; regular files ignore it.
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PROC_FD = "/proc/self/fd"
ROOT_KNOB = "DEEPJIT_CACHE_DIR"


class Corrupt(Exception):
    """A cache path of the wrong type or content: the entry is corrupt (rebuilt, reported by verify)."""


class Policy(NamedTuple):
    """Whom this process trusts: its effective uid (and root), plus the root's group when shared."""

    shared: bool
    uid: int
    groups: frozenset[int]


def policy(shared: bool) -> Policy:
    return Policy(shared, os.geteuid(), frozenset((os.getegid(), *os.getgroups())))


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        import grp

        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except (ImportError, KeyError):
        return f"gid {gid}"


def _refuse(path: Path | str, what: str, problem: str, fix: str) -> UnsafeCacheError:
    return UnsafeCacheError(f"refusing to use {what} {path}: {problem}. {fix}")


def _trust_problem(
    st: os.stat_result, pol: Policy, group: int | None, path: Path, is_root: bool
) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) for a path with status `st`, or None if it can be trusted.
    `group` is the group a shared cache trusts (the root's), None in a private cache."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (pol.uid, 0) and not (group is not None and st.st_gid == group):
        if is_root:
            fix = (f"A cache must be yours: set {ROOT_KNOB} to a folder of your own (for a cache shared "
                   "with your group on purpose, give it one of your groups and set DEEPJIT_CACHE_SHARED=1)")
        else:
            fix = f"Remove it (`rm -rf {path}`, as its owner or root); deepjit then builds its own"
        return f"it is owned by {_who(st.st_uid)}, not by you ({_who(pol.uid)})", fix
    if mode & stat.S_IWOTH:
        return f"every user can write it (mode {mode:04o})", f"Run `chmod o-w {path}`"
    if mode & stat.S_IWGRP and st.st_gid != group:
        shared_hint = "" if pol.shared else (
            " (or set DEEPJIT_CACHE_SHARED=1 if you share it with that group on purpose)")
        return (f"the group {_group_name(st.st_gid)} can write it (mode {mode:04o})",
                f"Run `chmod g-w {path}`{shared_hint}")
    return None


def check_fd(
    fd: int, pol: Policy, group: int | None, path: Path, what: str, is_root: bool = False
) -> os.stat_result:
    """The status of an open cache path, after checking who owns it and who may write it."""
    st = os.fstat(fd)
    problem = _trust_problem(st, pol, group, path, is_root)
    if problem is not None:
        raise _refuse(path, what, *problem)
    return st


def symlink_error(path: Path, what: str) -> UnsafeCacheError:
    return _refuse(path, what, "it is a symbolic link, and deepjit follows none inside a cache",
                   f"Remove the link (`rm {path}`); deepjit recreates what it needs")


class Folder:
    """A cache folder open as a descriptor after its checks; `path` names it in messages and results."""

    __slots__ = ("path", "fd", "group")

    def __init__(self, path: Path, fd: int, group: int | None) -> None:
        self.path = path
        self.fd = fd
        self.group = group  # the group a shared cache trusts; None when private

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def removed(self) -> bool:
        """True once the folder has been deleted (by a clean-up or by hand) while we hold it."""
        return os.fstat(self.fd).st_nlink == 0

    def cwd(self) -> str:
        """A path a child process can chdir to that names this very folder (not whatever is at `path` now)."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"


def open_root(path: Path, pol: Policy) -> Folder | None:
    """The cache root, checked; None if there is no folder at `path`.

    A symbolic link as the root is followed only if you (or root) own the link; the folder it
    leads to is checked like any root."""
    try:
        link = os.lstat(path)
    except OSError:
        return None
    flags = O_DIR
    if stat.S_ISLNK(link.st_mode):
        if link.st_uid not in (pol.uid, 0):
            raise _refuse(path, "the cache root", f"it is a symbolic link owned by {_who(link.st_uid)}",
                          f"Replace it with a folder or a link of your own, or set {ROOT_KNOB} to a folder of your own")
        flags &= ~os.O_NOFOLLOW
    elif not stat.S_ISDIR(link.st_mode):
        return None
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        st = os.stat(path)
        problem = _trust_problem(st, pol, None, path, True)
        if problem is not None:
            raise _refuse(path, "the cache root", *problem) from None
        raise
    try:
        st = os.fstat(fd)
        group = st.st_gid if pol.shared and st.st_gid in pol.groups else None
        check_fd(fd, pol, group, path, "the cache root", is_root=True)
    except BaseException:
        os.close(fd)
        raise
    return Folder(path, fd, group)


def _explain(parent: Folder, name: str, what: str, exc: OSError, pol: Policy, want_dir: bool) -> Exception:
    """Turn a failed open of `name` into the error a caller should see (unsafe, corrupt, or the OSError)."""
    path = parent.path / name
    try:
        st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
    except OSError:
        return exc
    if stat.S_ISLNK(st.st_mode):
        return symlink_error(path, what)
    problem = _trust_problem(st, pol, parent.group, path, False)
    if problem is not None:
        return _refuse(path, what, *problem)
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return Corrupt(f"{name} is not a folder")
    return exc


def open_dir_at(parent: Folder, name: str, pol: Policy, what: str = "the cache folder") -> Folder | None:
    """A folder inside `parent`, checked; None if absent. A symbolic link is refused; a file where a
    folder should be is Corrupt."""
    try:
        fd = os.open(name, O_DIR, dir_fd=parent.fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _explain(parent, name, what, exc, pol, want_dir=True) from None
    path = parent.path / name
    try:
        check_fd(fd, pol, parent.group, path, what)
    except BaseException:
        os.close(fd)
        raise
    return Folder(path, fd, parent.group)


def ensure_dir_at(parent: Folder, name: str, pol: Policy, mode: int, what: str = "the cache folder") -> Folder:
    """`open_dir_at`, creating the folder with `mode` (whatever the umask) when it is missing."""
    folder = open_dir_at(parent, name, pol, what)
    if folder is not None:
        return folder
    try:
        os.mkdir(name, mode, dir_fd=parent.fd)
    except FileExistsError:
        pass  # a concurrent builder made it
    else:
        fd = os.open(name, O_DIR, dir_fd=parent.fd)
        try:
            os.fchmod(fd, mode)  # mkdir's mode is filtered by the umask
        finally:
            os.close(fd)
    folder = open_dir_at(parent, name, pol, what)
    if folder is None:
        raise FileNotFoundError(errno.ENOENT, "removed while being created", str(parent.path / name))
    return folder


def open_file_at(
    folder: Folder, name: str, pol: Policy, what: str = "the cache file"
) -> tuple[int, os.stat_result] | None:
    """(descriptor, status) of a regular file inside `folder`, checked; None if absent."""
    try:
        fd = os.open(name, O_READ, dir_fd=folder.fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _explain(folder, name, what, exc, pol, want_dir=False) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Corrupt(f"{name} is not a regular file")
        check_fd(fd, pol, folder.group, folder.path / name, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_all(fd: int) -> bytes:
    with open(fd, "rb", closefd=False) as handle:
        return handle.read()


def read_file_at(folder: Folder, name: str, pol: Policy, limit: int) -> bytes | None:
    """The bytes of a checked regular file inside `folder` (at most `limit`), or None if absent."""
    opened = open_file_at(folder, name, pol)
    if opened is None:
        return None
    fd, st = opened
    try:
        if st.st_size > limit:
            raise Corrupt(f"{name} is {st.st_size} bytes, more than the {limit} it may hold")
        return _read_all(fd)
    finally:
        os.close(fd)


class VerifiedFile:
    """A cache file read and hashed through one open descriptor.

    Load it through `proc_path` while it is open: that names the very inode whose bytes were hashed,
    whatever has happened to `path` since."""

    __slots__ = ("path", "fd", "data", "sha256", "device", "inode")

    def __init__(self, path: Path, fd: int, data: bytes, st: os.stat_result) -> None:
        self.path = path
        self.fd = fd
        self.data = data
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.device = st.st_dev
        self.inode = st.st_ino

    @property
    def proc_path(self) -> str:
        return f"{PROC_FD}/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> VerifiedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_verified(folder: Folder, name: str, pol: Policy) -> VerifiedFile | None:
    """A checked regular file inside `folder`, read whole and hashed, still open; None if absent."""
    opened = open_file_at(folder, name, pol, "the artifact")
    if opened is None:
        return None
    fd, st = opened
    try:
        data = _read_all(fd)
    except BaseException:
        os.close(fd)
        raise
    return VerifiedFile(folder.path / name, fd, data, st)


def write_new_file_at(folder: Folder, name: str, data: bytes, mode: int = 0o600) -> None:
    """Create `name` in `folder` (never through a link, never over an existing file) and write `data`."""
    fd = os.open(name, O_CREATE, mode, dir_fd=folder.fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def remove_at(dir_fd: int, name: str) -> None:
    """Delete `name` under `dir_fd` and everything inside it, following no symbolic link."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, O_DIR, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            remove_at(fd, child)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


_ADVICE = {
    errno.ENOSPC: "the file system is full: free space there (`python -m deepjit gc --max-mib N` trims the "
                  f"cache) or set {ROOT_KNOB} to a folder on another disk",
    errno.EDQUOT: "your disk quota is used up: free space (`python -m deepjit gc --max-mib N` trims the cache) "
                  f"or set {ROOT_KNOB} to a folder on another disk",
    errno.EACCES: f"make it writable by you, or set {ROOT_KNOB} to a folder of your own",
    errno.EPERM: f"make it writable by you, or set {ROOT_KNOB} to a folder of your own",
    errno.EROFS: f"the file system is read-only: put a writable folder first in {ROOT_KNOB} (a read-only "
                 "cache can stay later in the list)",
    errno.EMFILE: "this process has too many open files: raise the limit (`ulimit -n`)",
    errno.ENFILE: "the system has too many open files: close some programs or raise fs.file-max",
    errno.EIO: f"the disk reported an I/O error: check it (dmesg), or set {ROOT_KNOB} to another disk",
}
_DEFAULT_ADVICE = f"set {ROOT_KNOB} to another folder, or DEEPJIT_DISABLE_CACHE=1 to build without a disk cache"


def io_error(exc: OSError, path: Path | str, action: str) -> CacheIOError:
    """A CacheIOError naming the path, the system's reason and what to do about it."""
    code = exc.errno
    name = errno.errorcode.get(code, "?") if code is not None else "?"
    advice = _ADVICE.get(code, _DEFAULT_ADVICE) if code is not None else _DEFAULT_ADVICE
    return CacheIOError(f"cannot {action} {path}: {exc.strerror or exc} ({name}); {advice}",
                        path=Path(path), errno=code)


@contextmanager
def guarded(path: Path | str, action: str) -> Iterator[None]:
    """Turn an OSError inside the block into a CacheIOError about `path` (trust errors pass through)."""
    try:
        yield
    except OSError as exc:
        raise io_error(exc, path, action) from exc
