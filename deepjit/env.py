"""Environment knobs: each knob is read as `<library prefix><NAME>` first, then `DEEPJIT_<NAME>`.

Rule: the environment is read at call time (never cached), so a knob set between two calls counts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidArgumentError

__all__ = ["DEFAULT_PREFIX", "KNOBS", "Environment", "Settings", "default_cache_dir"]

DEFAULT_PREFIX = "DEEPJIT_"
DEFAULT_TMP_MAX_AGE_S = 3600.0

# Knob name (without prefix) -> what it does. docs/deepjit.md and the CLI print this table.
KNOBS: dict[str, str] = {
    "CACHE_DIR": "cache roots, separated by ':'; lookups search all, builds go to the first writable",
    "CACHE_SHARED": "1: create cache folders group-writable (setgid) instead of private 0700",
    "DISABLE_CACHE": "1: never read or write the disk cache; build into a temporary folder",
    "FORCE_REBUILD": "1: ignore existing entries and rebuild each key once per process",
    "PRINT_COMMANDS": "1: print every compiler command line to stderr",
    "VERBOSE": "1: print compiler output of successful builds and cache decisions to stderr",
    "TMP_MAX_AGE": "seconds after which a builder's abandoned temp folder is removed (default 3600)",
    "CXX": "host C++ compiler (then $CXX, then g++ on PATH)",
    "NVCC": "nvcc path (then $CUDA_HOME/bin/nvcc, then nvcc on PATH)",
    "BISHENG": "bisheng path (then $ASCEND_HOME_PATH/compiler/ccec_compiler/bin, then PATH)",
    "LD_LLD": "ld.lld path for Ascend kernels (then next to bisheng, then PATH)",
}

_SETTINGS_KNOBS = ("CACHE_DIR", "CACHE_SHARED", "DISABLE_CACHE", "FORCE_REBUILD", "PRINT_COMMANDS", "VERBOSE", "TMP_MAX_AGE")
# The default cache dir depends on XDG_CACHE_HOME and HOME, so those are part of the snapshot too.
_SETTINGS_MEMO_LIMIT = 64
_PREFIX_RE = re.compile(r"^[A-Z][A-Z0-9_]*_$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME/deepjit`, else `~/.cache/deepjit`."""
    xdg = (os.environ if environ is None else environ).get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "deepjit"


@dataclass(frozen=True)
class Settings:
    """One snapshot of the knobs, taken at the start of a compile call."""

    cache_roots: tuple[Path, ...]
    shared: bool
    disable_cache: bool
    force_rebuild: bool
    print_commands: bool
    verbose: bool
    tmp_max_age_s: float


class Environment:
    """Reads knobs with a library prefix (e.g. "PK_JIT_") before the `DEEPJIT_` defaults."""

    def __init__(self, prefix: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        if prefix is not None and not _PREFIX_RE.match(prefix):
            raise InvalidArgumentError(
                f"env_prefix={prefix!r} is not a valid variable prefix; use upper-case letters, digits "
                "and '_' ending in '_', e.g. env_prefix='PK_JIT_'"
            )
        self.prefix = prefix
        self._environ = os.environ if environ is None else environ
        prefixes = [DEFAULT_PREFIX] if prefix in (None, DEFAULT_PREFIX) else [prefix, DEFAULT_PREFIX]
        self.prefixes: tuple[str, ...] = tuple(prefixes)
        self._settings_memo: dict[tuple[object, ...], Settings] = {}

    def lookup(self, knob: str) -> tuple[str | None, str | None]:
        """(value, variable name) of the first non-empty variable for `knob`, or (None, None)."""
        for prefix in self.prefixes:
            variable = prefix + knob
            value = self._environ.get(variable)
            if value:
                return value, variable
        return None, None

    def raw(self, variable: str) -> str | None:
        """An unprefixed variable such as CXX or CUDA_HOME (empty counts as unset)."""
        return self._environ.get(variable) or None

    def flag(self, knob: str) -> bool:
        value, variable = self.lookup(knob)
        if value is None:
            return False
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise InvalidArgumentError(f"{variable}={value!r} is not a boolean; set it to 1 or 0")

    def number(self, knob: str, default: float) -> float:
        value, variable = self.lookup(knob)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if number < 0:
            raise InvalidArgumentError(f"{variable}={value!r} is not a non-negative number of seconds")
        return number

    def snapshot(self) -> tuple[str | None, ...]:
        """The raw values of the knobs that make up Settings (cheap; used as a memo key)."""
        values = tuple(self.lookup(knob)[0] for knob in _SETTINGS_KNOBS)
        return values + (self._environ.get("XDG_CACHE_HOME"), self._environ.get("HOME"))

    def settings(self, default_root: Path | None = None, snapshot: tuple[str | None, ...] | None = None) -> Settings:
        snapshot = self.snapshot() if snapshot is None else snapshot
        memo_key = (snapshot, default_root)
        cached = self._settings_memo.get(memo_key)
        if cached is None:
            cached = self._parse_settings(default_root)
            if len(self._settings_memo) > _SETTINGS_MEMO_LIMIT:
                self._settings_memo.clear()
            self._settings_memo[memo_key] = cached
        return cached

    def _parse_settings(self, default_root: Path | None) -> Settings:
        value, _ = self.lookup("CACHE_DIR")
        if value:
            # Absolute, because compilers run with the build folder as working directory.
            roots = tuple(Path(os.path.abspath(Path(part).expanduser())) for part in value.split(os.pathsep) if part)
        else:
            roots = (Path(os.path.abspath(default_root or default_cache_dir(self._environ))),)
        return Settings(
            cache_roots=roots,
            shared=self.flag("CACHE_SHARED"),
            disable_cache=self.flag("DISABLE_CACHE"),
            force_rebuild=self.flag("FORCE_REBUILD"),
            print_commands=self.flag("PRINT_COMMANDS"),
            verbose=self.flag("VERBOSE"),
            tmp_max_age_s=self.number("TMP_MAX_AGE", DEFAULT_TMP_MAX_AGE_S),
        )
