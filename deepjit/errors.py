"""Error types of deepjit: one base class, each also a subclass of the closest builtin.

Rule: an error raised for bad input names the argument, what was given and how to fix it.
"""

from __future__ import annotations

from collections.abc import Sequence
import shlex
from pathlib import Path

__all__ = [
    "DeepJitError",
    "InvalidArgumentError",
    "ToolchainNotFoundError",
    "CompileError",
    "LoadError",
    "DeviceUnavailableError",
    "CacheError",
    "UnsafeCacheError",
    "CacheIOError",
]

# Compiler logs can be huge (template errors); keep the message readable, keep the full text in .output.
_MESSAGE_OUTPUT_LIMIT = 8000


class DeepJitError(Exception):
    """Base class of every error deepjit raises."""


class InvalidArgumentError(DeepJitError, ValueError):
    """A caller passed a bad value (name, toolchain, kind, flag, define, template parameter...)."""


class ToolchainNotFoundError(DeepJitError, RuntimeError):
    """A compiler or linker could not be found; the message names the variable that selects it."""


class CacheError(DeepJitError, RuntimeError):
    """No usable cache root, or a cache operation that cannot proceed safely."""


class UnsafeCacheError(CacheError):
    """A cache path that someone else could have written (another owner, a group- or world-writable
    mode, a symbolic link inside the cache): refused, never read or run. The message says how to fix it."""


class CacheIOError(CacheError):
    """The file system refused a cache operation (full disk, quota, permissions, read-only...).

    Attributes:
        path: the file or folder concerned.
        errno: the operating system's error number.
    """

    def __init__(self, message: str, *, path: Path, errno: int | None) -> None:
        self.path = path
        self.errno = errno
        super().__init__(message)


class LoadError(DeepJitError, RuntimeError):
    """A built artifact could not be loaded into this process."""


class DeviceUnavailableError(LoadError):
    """Loading needs a device runtime (CUDA driver, Ascend runtime) that this machine lacks."""


class CompileError(DeepJitError, RuntimeError):
    """The compiler failed, or succeeded without producing a valid artifact.

    Attributes:
        command: the argument list that was run.
        output: the compiler's full combined stdout and stderr.
        source_path: where the source was kept for inspection (outside any published entry).
        returncode: the compiler's exit status (0 when it "succeeded" but produced nothing usable).
    """

    def __init__(
        self,
        reason: str,
        *,
        command: Sequence[str],
        output: str,
        source_path: Path | None,
        returncode: int,
    ) -> None:
        self.reason = reason
        self.command = list(command)
        self.output = output
        self.source_path = source_path
        self.returncode = returncode
        shown = output if len(output) <= _MESSAGE_OUTPUT_LIMIT else (
            output[:_MESSAGE_OUTPUT_LIMIT] + f"\n... ({len(output) - _MESSAGE_OUTPUT_LIMIT} more characters in .output)"
        )
        super().__init__(
            f"{reason}\n  command: {shlex.join(self.command)}\n  exit status: {returncode}\n"
            f"  source: {source_path}\n  compiler output:\n{shown}"
        )
