"""Toolchains: how to find each compiler, name its identity, spell its command lines and load its output.

Rule: commands are argument lists built from a request; the same function spells them with real
paths (to run) and with placeholders (for the cache key), so the key never contains a path.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import platform
import re
import shutil
import sys
import threading
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Protocol

from . import loader
from .env import Environment
from .errors import InvalidArgumentError, ToolchainNotFoundError
from .formats import ArtifactFormat
from .trust import VerifiedFile

__all__ = ["ToolchainName", "Request", "Tool", "Toolchain", "get_toolchain", "TOOLCHAINS", "compiler_identity"]


class ToolchainName(str, Enum):
    HOST = "host"
    CUDA = "cuda"
    ASCEND = "ascend"


@dataclass(frozen=True)
class Request:
    """A validated, normalized build request (built by the API from the caller's arguments)."""

    name: str
    source: str
    toolchain: str
    kind: str
    flags: tuple[str, ...]
    include_dirs: tuple[Path, ...]
    defines: tuple[tuple[str, str | None], ...]
    arch: tuple[str, ...]
    signature: tuple[str, ...]


@dataclass(frozen=True)
class Tool:
    """A resolved program: its role ("cxx", "nvcc", "bisheng", "ld.lld"), path, and what chose it."""

    role: str
    path: str
    chosen_by: str


@dataclass(frozen=True)
class Spelling:
    """Paths to put into a command: real ones to run it, placeholders to hash it."""

    tools: dict[str, str]
    source: str
    output: str
    workdir: str
    include_dirs: tuple[str, ...]
    symbolic: bool

    def system_include(self, label: str, resolve: Any) -> str:
        return f"<{label}>" if self.symbolic else resolve()


def _find_program(candidate: str) -> str | None:
    if os.sep in candidate:
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    return shutil.which(candidate)


def _define_flags(defines: tuple[tuple[str, str | None], ...]) -> list[str]:
    return [f"-D{key}" if value is None else f"-D{key}={value}" for key, value in defines]


# --- compiler identity ------------------------------------------------------------------------------

_identity_lock = threading.Lock()
_identities: dict[tuple[str, tuple[int, int, int]], str] = {}


class IdentityStore(Protocol):
    """Where `--version` outputs are remembered between processes (the cache's .compilers/ folder)."""

    def get(self, key: str) -> str | None: ...

    def put(self, key: str, text: str) -> None: ...


def compiler_identity(path: str, store: IdentityStore | None = None) -> str:
    """The `--version` output of a program, memoized by its real path and stat (and in `store`
    when given), so a fresh process does not pay a subprocess per cache hit."""
    real = os.path.realpath(path)
    st = os.stat(real)
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    memo_key = (real, stamp)
    with _identity_lock:
        if memo_key in _identities:
            return _identities[memo_key]
    store_key = hashlib.sha256(repr(memo_key).encode()).hexdigest()[:32]
    text = store.get(store_key) if store is not None else None
    if text is not None:
        with _identity_lock:
            _identities[memo_key] = text
        return text
    import subprocess

    try:
        completed = subprocess.run(
            [path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
    except OSError as exc:
        raise ToolchainNotFoundError(f"cannot run {path!r} --version: {exc}") from exc
    if completed.returncode != 0:
        raise ToolchainNotFoundError(
            f"{path!r} --version exited with status {completed.returncode}; is it a compiler?\n{completed.stdout}"
        )
    text = completed.stdout.strip()
    if store is not None:
        store.put(store_key, text)
    with _identity_lock:
        _identities[memo_key] = text
    return text


# --- toolchains ---------------------------------------------------------------------------------------


class Toolchain:
    """Base class. Subclasses name their kinds and say how to build and load each."""

    name: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    default_kind: ClassVar[str]
    source_suffix: ClassVar[str]

    def check_arch(self, kind: str, arch: tuple[str, ...]) -> None:
        if arch:
            raise InvalidArgumentError(f"arch={arch!r} has no meaning for toolchain={self.name!r}; remove it")

    def tools(self, env: Environment) -> tuple[Tool, ...]:
        raise NotImplementedError

    def tool_environment(self, env: Environment) -> tuple[str | None, ...]:
        """Every variable that tool resolution reads (used to revalidate in-process hits)."""
        raise NotImplementedError

    def signature(self, request: Request) -> dict[str, str]:
        return {}

    def artifact_filename(self, request: Request) -> str:
        raise NotImplementedError

    def artifact_format(self, request: Request) -> ArtifactFormat:
        return ArtifactFormat.ELF

    def commands(self, request: Request, spelling: Spelling) -> list[list[str]]:
        raise NotImplementedError

    def load(self, image: VerifiedFile, request: Request) -> Any:
        """Load the artifact whose bytes `image` read and hashed (through its open descriptor)."""
        raise NotImplementedError

    def source_filename(self, request: Request) -> str:
        return f"{request.name}{self.source_suffix}"


def _resolve(env: Environment, role: str, knob: str, fallbacks: list[tuple[str, str]]) -> Tool:
    """Try the knob (prefixed, then DEEPJIT_), then each (candidate, description) in order."""
    value, variable = env.lookup(knob)
    if value is not None:
        found = _find_program(value)
        if found is None:
            raise ToolchainNotFoundError(
                f"{variable}={value!r} is not an executable program; point it at the {role} binary or unset it"
            )
        return Tool(role, found, variable or knob)
    for candidate, description in fallbacks:
        found = _find_program(candidate)
        if found is not None:
            return Tool(role, found, description)
    prefixes = " or ".join(p + knob for p in env.prefixes)
    tried = ", ".join(c for c, _ in fallbacks)
    raise ToolchainNotFoundError(f"{role} not found (tried {tried}); install it or set {prefixes} to its path")


class HostToolchain(Toolchain):
    """g++ (or $CXX): a pybind11 extension module or a plain C-ABI shared library for ctypes."""

    name = ToolchainName.HOST.value
    kinds = ("pybind11", "ctypes")
    default_kind = "pybind11"
    source_suffix = ".cpp"
    BASE_FLAGS = ("-shared", "-fPIC", "-std=c++17", "-O2")

    def tools(self, env: Environment) -> tuple[Tool, ...]:
        fallbacks = []
        if env.raw("CXX"):
            fallbacks.append((env.raw("CXX"), "$CXX"))
        fallbacks.append(("g++", "g++ on PATH"))
        return (_resolve(env, "cxx", "CXX", fallbacks),)

    def tool_environment(self, env: Environment) -> tuple[str | None, ...]:
        return (env.lookup("CXX")[0], env.raw("CXX"), env.raw("PATH"))

    def signature(self, request: Request) -> dict[str, str]:
        signature = {"machine": platform.machine(), "platform": sys.platform}
        if request.kind == "pybind11":
            signature["python_extension"] = importlib.machinery.EXTENSION_SUFFIXES[0]
            signature["pybind11"] = _pybind11().__version__
        return signature

    def artifact_filename(self, request: Request) -> str:
        if request.kind == "pybind11":
            return request.name + importlib.machinery.EXTENSION_SUFFIXES[0]
        return f"lib{request.name}.so"

    def commands(self, request: Request, spelling: Spelling) -> list[list[str]]:
        command = [spelling.tools["cxx"], *self.BASE_FLAGS]
        if request.kind == "pybind11":
            command += [
                "-fvisibility=hidden",
                "-I" + spelling.system_include("pybind11-include", lambda: _pybind11().get_include()),
                "-I" + spelling.system_include("python-include", _python_include),
                f"-DDEEPJIT_MODULE_NAME={request.name}",
            ]
        command += ["-I" + d for d in spelling.include_dirs]
        command += _define_flags(request.defines)
        command += [spelling.source, *request.flags, "-o", spelling.output]
        return [command]

    def load(self, image: VerifiedFile, request: Request) -> Any:
        if request.kind == "pybind11":
            return loader.load_pybind11(image, request.name)
        return loader.load_ctypes(image)


def _pybind11() -> Any:
    try:
        import pybind11
    except ImportError as exc:
        raise ToolchainNotFoundError(
            "kind='pybind11' needs the pybind11 package; pip install pybind11 (or use kind='ctypes')"
        ) from exc
    return pybind11


def _python_include() -> str:
    import sysconfig

    return sysconfig.get_paths()["include"]


_CUDA_ARCH_RE = re.compile(r"^sm_\d{2,3}[af]?$")


class CudaToolchain(Toolchain):
    """nvcc: a cubin for one arch, or a fatbin for several; loaded through the CUDA driver API."""

    name = ToolchainName.CUDA.value
    kinds = ("cubin", "fatbin")
    default_kind = "cubin"
    source_suffix = ".cu"
    BASE_FLAGS = ("-std=c++17",)

    def check_arch(self, kind: str, arch: tuple[str, ...]) -> None:
        if not arch:
            raise InvalidArgumentError("toolchain='cuda' needs arch, e.g. arch='sm_90a' (or a tuple for a fatbin)")
        for one in arch:
            if not _CUDA_ARCH_RE.match(one):
                raise InvalidArgumentError(f"arch={one!r} is not a CUDA arch; use the form 'sm_90a', 'sm_100a'")
        if kind == "cubin" and len(arch) != 1:
            raise InvalidArgumentError(f"kind='cubin' takes one arch, got arch={arch!r}; use kind='fatbin' for several")

    def tools(self, env: Environment) -> tuple[Tool, ...]:
        fallbacks = [
            (os.path.join(home, "bin", "nvcc"), f"${variable}/bin/nvcc")
            for variable in ("CUDA_HOME", "CUDA_PATH")
            if (home := env.raw(variable))
        ]
        fallbacks += [("nvcc", "nvcc on PATH"), ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda")]
        return (_resolve(env, "nvcc", "NVCC", fallbacks),)

    def tool_environment(self, env: Environment) -> tuple[str | None, ...]:
        return (env.lookup("NVCC")[0], env.raw("CUDA_HOME"), env.raw("CUDA_PATH"), env.raw("PATH"))

    def signature(self, request: Request) -> dict[str, str]:
        return {"arch": ",".join(request.arch)}

    def artifact_filename(self, request: Request) -> str:
        return f"{request.name}.{request.kind}"

    def artifact_format(self, request: Request) -> ArtifactFormat:
        return ArtifactFormat.ELF if request.kind == "cubin" else ArtifactFormat.FATBIN

    def commands(self, request: Request, spelling: Spelling) -> list[list[str]]:
        command = [spelling.tools["nvcc"], f"-{request.kind}", *self.BASE_FLAGS]
        if request.kind == "cubin":
            command.append(f"-arch={request.arch[0]}")
        else:
            command += [f"-gencode=arch=compute_{a[3:]},code={a}" for a in request.arch]
        command += ["-I" + d for d in spelling.include_dirs]
        command += _define_flags(request.defines)
        command += [spelling.source, *request.flags, "-o", spelling.output]
        return [command]

    def load(self, image: VerifiedFile, request: Request) -> Any:
        return loader.CudaModule(image.data, path=image.path)


_ASCEND_ARCH_RE = re.compile(r"^dav-[a-z0-9][a-z0-9-]*$")


class AscendToolchain(Toolchain):
    """bisheng compiles Ascend C to an object, ld.lld links it into a loadable kernel object."""

    name = ToolchainName.ASCEND.value
    kinds = ("object",)
    default_kind = "object"
    source_suffix = ".cpp"
    BASE_FLAGS = ("-c", "-x", "cce", "-O2", "-std=c++17")

    def check_arch(self, kind: str, arch: tuple[str, ...]) -> None:
        if len(arch) != 1 or not _ASCEND_ARCH_RE.match(arch[0]):
            raise InvalidArgumentError(
                f"toolchain='ascend' needs one AI Core arch, got arch={arch!r}; e.g. arch='dav-c220-vec'"
            )

    def tools(self, env: Environment) -> tuple[Tool, ...]:
        fallbacks = []
        if home := env.raw("ASCEND_HOME_PATH"):
            path = os.path.join(home, "compiler", "ccec_compiler", "bin", "bisheng")
            fallbacks.append((path, "$ASCEND_HOME_PATH"))
        fallbacks.append(("bisheng", "bisheng on PATH"))
        bisheng = _resolve(env, "bisheng", "BISHENG", fallbacks)
        beside = os.path.join(os.path.dirname(bisheng.path), "ld.lld")
        linker = _resolve(env, "ld.lld", "LD_LLD", [(beside, "next to bisheng"), ("ld.lld", "ld.lld on PATH")])
        return (bisheng, linker)

    def tool_environment(self, env: Environment) -> tuple[str | None, ...]:
        return (env.lookup("BISHENG")[0], env.lookup("LD_LLD")[0], env.raw("ASCEND_HOME_PATH"), env.raw("PATH"))

    def signature(self, request: Request) -> dict[str, str]:
        return {"arch": request.arch[0]}

    def artifact_filename(self, request: Request) -> str:
        return f"{request.name}.o"

    def commands(self, request: Request, spelling: Spelling) -> list[list[str]]:
        unlinked = os.path.join(spelling.workdir, f"{request.name}.unlinked.o")
        compile_step = [spelling.tools["bisheng"], *self.BASE_FLAGS, f"--cce-aicore-arch={request.arch[0]}"]
        compile_step += ["-I" + d for d in spelling.include_dirs]
        compile_step += _define_flags(request.defines)
        compile_step += [spelling.source, *request.flags, "-o", unlinked]
        link_step = [spelling.tools["ld.lld"], "-m", "aicorelinux", "-Ttext=0", unlinked, "-static", "-o", spelling.output]
        return [compile_step, link_step]

    def load(self, image: VerifiedFile, request: Request) -> Any:
        return loader.AscendBinary(image.path, load_from=image.proc_path)


TOOLCHAINS: dict[str, Toolchain] = {
    t.name: t for t in (HostToolchain(), CudaToolchain(), AscendToolchain())
}


def get_toolchain(toolchain: str | ToolchainName) -> Toolchain:
    key = toolchain.value if isinstance(toolchain, ToolchainName) else toolchain
    try:
        return TOOLCHAINS[key]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"toolchain={toolchain!r} is unknown; use one of {sorted(TOOLCHAINS)}"
        ) from None
