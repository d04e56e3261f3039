"""Per-key advisory locks across processes, so one process compiles a key while the others wait and load it.

Rule: a lock is an flock on `<root>/.locks/<name>.<digest>.lock`, held for the whole build. The
kernel releases it when its holder exits or is killed (even by SIGKILL), so a dead builder never
blocks anyone; a temp folder whose key's lock is held belongs to a live builder and is spared.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import trust
from .cache import BUILD_RE, LOCKS_DIR, dir_mode
from .trust import Folder

__all__ = ["key_lock", "lock_name", "lock_is_held", "remove_unheld_lock", "build_is_live"]

# Read-only is enough for flock, and lets members of a shared cache lock files others created.
_O_LOCK = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def lock_name(name: str, digest: str) -> str:
    return f"{name}.{digest}.lock"


@contextmanager
def key_lock(
    root: Folder, name: str, digest: str, shared: bool, on_wait: Callable[[Path], None] | None = None
) -> Iterator[None]:
    """Hold the key's advisory lock (flock on `.locks/<name>.<digest>.lock`) across processes.

    flock locks belong to the open file, so two contexts in one process exclude each other too, and
    the kernel drops the lock when its holder dies (even by SIGKILL). gc may delete an unheld lock
    file, so after locking we check the file is still the one at that name, else lock the new one."""
    pol = trust.policy(shared)
    with trust.guarded(root.path / LOCKS_DIR, "create the lock folder"):
        locks = trust.ensure_dir_at(root, LOCKS_DIR, pol, dir_mode(shared))
    filename = lock_name(name, digest)
    path = locks.path / filename
    fd = -1
    try:
        while True:
            with trust.guarded(path, "open the lock file"):
                try:
                    fd = os.open(filename, _O_LOCK, 0o644, dir_fd=locks.fd)
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        raise trust.symlink_error(path, "the lock file") from None
                    raise
            trust.check_fd(fd, pol, locks.group, path, "the lock file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait(path)
                fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                current = os.stat(filename, dir_fd=locks.fd, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
            os.close(fd)
            fd = -1
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing the only descriptor releases the flock
        locks.close()


def lock_is_held(locks_fd: int, filename: str) -> bool:
    try:
        fd = os.open(filename, trust.O_READ, dir_fd=locks_fd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def remove_unheld_lock(locks_fd: int, filename: str) -> bool:
    """Delete a lock file nobody holds (holding it while deleting, so no one locks the doomed file unseen)."""
    try:
        fd = os.open(filename, trust.O_READ, dir_fd=locks_fd)
    except OSError:
        try:
            os.unlink(filename, dir_fd=locks_fd)  # a link or junk under the lock's name
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        os.unlink(filename, dir_fd=locks_fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def build_is_live(root: Folder, build_name: str) -> bool:
    """A temp folder belongs to a live builder while its key's lock is held."""
    match = BUILD_RE.match(build_name)
    if match is None:
        return False
    try:
        locks = os.open(LOCKS_DIR, trust.O_DIR, dir_fd=root.fd)
    except OSError:
        return False
    try:
        return lock_is_held(locks, lock_name(match.group(1), match.group(2)))
    finally:
        os.close(locks)
