"""Host C++ builds for the whole library: one deepjit context, the ISA flags, the fallback rule.

Every native host kernel of portable_kernels (the cpu backend's "native" providers, the layout
encoders other backends call while preparing inputs) is a plain-C-ABI shared library built from a
.cpp file shipped in the package, compiled at first use through `deepjit` and cached by content
hash. The one rule kept here: native code is an optimisation, never a requirement — without a C++
compiler, with `PK_NATIVE=0`, or when a build fails, `NativeLibrary.get()` returns None, the reason
is recorded for `doctor`, and one warning is issued per process; callers then use their torch path.

Knobs: PK_NATIVE=0 disables native code; PK_NATIVE_ISA=avx512|avx2|neon|generic forces a lower
instruction set than the one detected (to test that path); PK_JIT_* are deepjit's knobs (cache
folder, verbose builds, ...), see docs/deepjit.md.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import deepjit
import torch

log = logging.getLogger(__name__)

#: the library's own deepjit context: knobs PK_JIT_CACHE_DIR, PK_JIT_VERBOSE, ...
JIT = deepjit.JitContext(env_prefix="PK_JIT_")
#: folder of the shared header (pk_native.h) every native source may include
INCLUDE_DIR = Path(__file__).resolve().parent
#: instruction-set levels, best first; each maps to compiler flags below
ISA_LEVELS = ("avx512", "avx2", "neon", "generic")
DISABLE_ENV = "PK_NATIVE"
ISA_ENV = "PK_NATIVE_ISA"
#: owner of libraries every backend may use (layout encoders)
SHARED = "portable_kernels"
#: bumped when the C ABI conventions of this module change (part of every build key)
ABI_VERSION = "pk-native-1"

#: ctypes spellings used in function tables
PTR = ctypes.c_void_p
I64 = ctypes.c_int64
I32 = ctypes.c_int32
U32 = ctypes.c_uint32
F32 = ctypes.c_float
F64 = ctypes.c_double


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


@functools.lru_cache(maxsize=None)
def detected_isa() -> tuple[str, frozenset[str]]:
    """(level, extra features) of this machine: level in ISA_LEVELS; extras e.g. {"avx512bf16", "amx"}."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return "neon", frozenset()
    if machine not in ("x86_64", "amd64"):
        return "generic", frozenset()
    flags = _cpu_flags()
    extras = set()
    if "avx512_bf16" in flags:
        extras.add("avx512bf16")
    if {"amx_tile", "amx_bf16"} <= flags:
        extras.add("amx")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "avx512", frozenset(extras)
    if {"avx2", "fma", "f16c"} <= flags:
        return "avx2", frozenset()
    return "generic", frozenset()


def isa() -> str:
    """The level native code is built for: the detected one, or PK_NATIVE_ISA if it names a level
    this machine supports (a request above the machine's level is refused with a warning)."""
    level, _ = detected_isa()
    wanted = os.environ.get(ISA_ENV, "").strip().lower()
    if not wanted:
        return level
    x86 = ("avx512", "avx2", "generic")
    if wanted in x86 and level in x86 and x86.index(wanted) >= x86.index(level):
        return wanted
    if wanted == "generic" or wanted == level:
        return wanted
    warnings.warn(f"{ISA_ENV}={wanted!r} is not supported on this machine (detected {level!r}); "
                  f"using {level!r}", stacklevel=2)
    return level


def compiler_flags(level: str | None = None) -> list[str]:
    """-O3 -fopenmp and the -march of an ISA level; these flags are part of every build key."""
    level = level or isa()
    flags = ["-O3", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-Wall", "-Wno-maybe-uninitialized"]
    if level == "avx512":
        flags += ["-march=x86-64-v4", "-mprefer-vector-width=512"]
        if "avx512bf16" in detected_isa()[1]:
            flags.append("-mavx512bf16")
    elif level == "avx2":
        flags += ["-march=x86-64-v3"]
    elif level == "neon":
        flags += ["-march=armv8-a"]
    return flags


def num_threads() -> int:
    """Threads a native kernel may use: torch's intra-op setting (torch.set_num_threads)."""
    return torch.get_num_threads()


def native_disabled() -> str | None:
    """The reason native code is switched off by the user, or None."""
    value = os.environ.get(DISABLE_ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    return None


class NativeLibrary:
    """One .cpp file of C functions (`extern "C"`), built on first `get()` and loaded with ctypes.

    functions: name -> argtypes (every function returns void or, when listed in `returns`, that
    type). The source's tracked includes (pk_native.h) and the ISA flags go into the build key.
    owner: the backend whose kernels these are, or SHARED (portable_kernels' own helpers).
    """

    def __init__(self, family: str, source: Path, functions: Mapping[str, Sequence[Any]],
                 returns: Mapping[str, Any] | None = None, include_dirs: Sequence[Path] = (),
                 owner: str = SHARED) -> None:
        self.family = family
        self.owner = owner
        self.source = Path(source)
        self.functions = dict(functions)
        self.returns = dict(returns or {})
        self.include_dirs = (INCLUDE_DIR, self.source.parent, *include_dirs)
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._reason: str | None = None
        self._tried_isa: str | None = None
        self.build_seconds: float | None = None
        self.origin: str | None = None

    @property
    def name(self) -> str:
        return f"pk_{self.family}"

    def get(self) -> ctypes.CDLL | None:
        """The loaded library, building it if needed; None when native code is unavailable."""
        lib = self._lib
        if lib is not None:
            return lib
        off = native_disabled()
        if off is not None:
            return None
        level = isa()
        with self._lock:
            if self._tried_isa != level:
                self._tried_isa = level
                self._lib, self._reason = self._load(level)
                if self._lib is None:
                    _warn_once(self.family, self._reason)
            return self._lib

    def reason(self) -> str | None:
        """Why get() returns None (None while it works or before the first attempt)."""
        return native_disabled() or self._reason

    def status(self) -> str:
        off = native_disabled()
        if off is not None:
            return off
        if self._lib is not None:
            how = f"built in {self.build_seconds:.1f} s" if self.origin == "built" else f"from the {self.origin} cache"
            return f"ready ({self._tried_isa}, {how})"
        if self._reason is not None:
            return f"unavailable: {self._reason}"
        return "not built yet (built at first use or by `python -m portable_kernels warmup`)"

    def _load(self, level: str) -> tuple[ctypes.CDLL | None, str | None]:
        start = time.perf_counter()
        try:
            text = self.source.read_text()
            artifact = JIT.build(self.name, text, toolchain="host", kind="ctypes", flags=compiler_flags(level),
                                 include_dirs=[str(d) for d in self.include_dirs], signature=[ABI_VERSION])
            lib = ctypes.CDLL(str(artifact.path))
            for fname, argtypes in self.functions.items():
                fn = getattr(lib, fname)
                fn.argtypes = list(argtypes)
                fn.restype = self.returns.get(fname)
        except deepjit.CompileError as exc:
            first = next((ln for ln in exc.output.splitlines() if "error" in ln), exc.output[:200])
            return None, f"{self.source.name} did not compile ({first.strip()}); see {exc.source_path}"
        except (deepjit.DeepJitError, OSError, AttributeError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        self.build_seconds = time.perf_counter() - start
        self.origin = artifact.origin
        log.debug("native %s: %s in %.2f s (%s)", self.family, artifact.origin, self.build_seconds, level)
        return lib, None


_LIBRARIES: dict[str, NativeLibrary] = {}
_warned = False
_warn_lock = threading.Lock()


def register_library(lib: NativeLibrary) -> NativeLibrary:
    """Make a library known to `libraries()` (doctor, warmup); returns it."""
    _LIBRARIES[lib.family] = lib
    return lib


def libraries() -> dict[str, NativeLibrary]:
    return dict(_LIBRARIES)


def _warn_once(family: str, reason: str | None) -> None:
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(f"portable_kernels: native C++ kernels unavailable ({family}: {reason}); the torch "
                  "reference providers run instead. `python -m portable_kernels doctor` lists every reason.",
                  RuntimeWarning, stacklevel=3)
