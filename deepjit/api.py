"""The compile API: validate a request, key it, and serve it from memory, from disk or by building.

Rule: one build per key at a time in a process (others wait on it); failures are never cached;
nothing reaches the disk cache unless the compiler succeeded and its output checked out whole.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import inspect
import logging
import os
import platform
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import cache, trust
from .env import Environment, Settings
from .errors import CompileError, InvalidArgumentError, ToolchainNotFoundError
from .formats import artifact_problem
from .key import KEY_FORMAT, digest_of, scan_includes, stamps_unchanged
from .toolchains import Request, Spelling, Tool, Toolchain, ToolchainName, compiler_identity, get_toolchain
from .trust import VerifiedFile

__all__ = ["Artifact", "JitContext", "compile", "compile_to_path", "build", "cache_key", "configure", "default_context"]

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,128}$")
_DEFINE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BUILD_ATTEMPTS = 3


@dataclass(frozen=True)
class Artifact:
    """A built artifact. `origin` says where this call got it: "memory", "disk" or "built"."""

    name: str
    digest: str
    toolchain: str
    kind: str
    path: Path
    entry: Path | None
    origin: str
    sha256: str
    manifest: Mapping[str, Any] = field(repr=False, compare=False)


Defines = Mapping[str, "str | int | float | bool | None"]


def _sequence_of_str(argument: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise InvalidArgumentError(
            f"{argument} must be a list of strings, got the single string {value!r}; write {argument}=[...] "
            "with one argument per item (commands are never split by a shell)"
        )
    items = tuple(value)
    for index, item in enumerate(items):
        if not isinstance(item, str) or "\0" in item:
            raise InvalidArgumentError(f"{argument}[{index}]={item!r} must be a string without NUL bytes")
    return items


def _define_value(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise InvalidArgumentError(f"defines[{key!r}]={value!r} must be a str, int, float, bool or None")


def _normalize(
    name: str,
    source: str,
    toolchain: str | ToolchainName,
    kind: str | None,
    flags: Sequence[str],
    include_dirs: Sequence[str | os.PathLike[str]],
    defines: Defines | None,
    arch: str | Sequence[str] | None,
    signature: str | Sequence[str],
) -> tuple[Request, Toolchain]:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"name={name!r} is not valid: use 1 to 128 of [A-Za-z0-9_] (it names the cache entry and the "
            "module), e.g. name='pk_cpu_gemm'"
        )
    if not isinstance(source, str) or not source.strip():
        raise InvalidArgumentError(f"source must be a non-empty str of code, got {type(source).__name__}")
    chain = get_toolchain(toolchain)
    kind = chain.default_kind if kind is None else kind
    if kind not in chain.kinds:
        raise InvalidArgumentError(f"kind={kind!r} is not built by toolchain={chain.name!r}; use one of {list(chain.kinds)}")
    if kind == "pybind11" and name[0].isdigit():
        raise InvalidArgumentError(f"name={name!r} must not start with a digit for kind='pybind11' (it is the module name)")
    if isinstance(include_dirs, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(
            f"include_dirs must be a list of folders, got the single value {include_dirs!r}; wrap it in [...]"
        )
    dirs = []
    for index, folder in enumerate(include_dirs):
        path = Path(os.path.abspath(os.fspath(folder)))
        if not path.is_dir():
            raise InvalidArgumentError(f"include_dirs[{index}]={os.fspath(folder)!r} is not an existing folder")
        dirs.append(path)
    pairs = []
    for key, value in sorted((defines or {}).items()):
        if not isinstance(key, str) or not _DEFINE_RE.match(key):
            raise InvalidArgumentError(f"defines key {key!r} is not a C identifier; use names like 'BLOCK_M'")
        pairs.append((key, _define_value(key, value)))
    if arch is None:
        arches: tuple[str, ...] = ()
    elif isinstance(arch, str):
        arches = (arch,)
    else:
        arches = _sequence_of_str("arch", arch)
    chain.check_arch(kind, arches)
    signature_items = (signature,) if isinstance(signature, str) else _sequence_of_str("signature", signature)
    request = Request(
        name=name,
        source=source,
        toolchain=chain.name,
        kind=kind,
        flags=_sequence_of_str("flags", flags),
        include_dirs=tuple(dirs),
        defines=tuple(pairs),
        arch=arches,
        signature=signature_items,
    )
    return request, chain


@dataclass(frozen=True)
class _Keyed:
    request: Request
    chain: Toolchain
    settings: Settings
    tools: tuple[Tool, ...]
    identities: dict[str, str]
    document: dict[str, Any]
    digest: str
    stamps: tuple[Any, ...]
    write_root: Path | None


class JitContext:
    """Compiles and caches for one library. Its knobs are read as `<env_prefix>NAME`, then
    `DEEPJIT_NAME`; `default_cache_dir` is used when neither sets CACHE_DIR."""

    def __init__(
        self,
        env_prefix: str | None = None,
        *,
        default_cache_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.env = Environment(env_prefix, environ)
        self.default_cache_dir = Path(default_cache_dir) if default_cache_dir is not None else None
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self._requests: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
        self._artifacts: dict[str, Artifact] = {}
        self._loaded: dict[str, Any] = {}
        self._forced: set[str] = set()
        self._scratch: Path | None = None

    # --- public ------------------------------------------------------------------------------------

    def settings(self) -> Settings:
        """The knobs as this context reads them now."""
        return self.env.settings(self.default_cache_dir)

    def compile(
        self,
        name: str,
        source: str,
        *,
        toolchain: str | ToolchainName,
        kind: str | None = None,
        flags: Sequence[str] = (),
        include_dirs: Sequence[str | os.PathLike[str]] = (),
        defines: Defines | None = None,
        arch: str | Sequence[str] | None = None,
        signature: str | Sequence[str] = (),
    ) -> Any:
        """Build (or reuse) and load. Returns a module (pybind11), a ctypes.CDLL (ctypes), a
        CudaModule (cuda) or an AscendBinary (ascend)."""
        request, chain, settings, fast_key, digest = self._recall(
            name, source, toolchain, kind, flags, include_dirs, defines, arch, signature)
        loaded = self._loaded.get(digest) if digest is not None else None
        if loaded is not None:
            return loaded
        return self._serve(request, chain, settings, fast_key, load=True)[1]

    def build(
        self,
        name: str,
        source: str,
        *,
        toolchain: str | ToolchainName,
        kind: str | None = None,
        flags: Sequence[str] = (),
        include_dirs: Sequence[str | os.PathLike[str]] = (),
        defines: Defines | None = None,
        arch: str | Sequence[str] | None = None,
        signature: str | Sequence[str] = (),
    ) -> Artifact:
        """Build (or reuse) without loading; says where the artifact came from."""
        request, chain, settings, fast_key, digest = self._recall(
            name, source, toolchain, kind, flags, include_dirs, defines, arch, signature)
        artifact = self._artifacts.get(digest) if digest is not None else None
        if artifact is not None:
            return replace(artifact, origin="memory")
        return self._serve(request, chain, settings, fast_key, load=False)[0]

    def _recall(self, name, source, toolchain, kind, flags, include_dirs, defines, arch, signature):
        """Normalize a request and look it up in memory: (request, chain, settings, fast_key, digest),
        digest None unless this process served the request before, its includes are unchanged and
        no forced rebuild is due."""
        request, chain = _normalize(name, source, toolchain, kind, flags, include_dirs, defines, arch, signature)
        snapshot = self.env.snapshot()
        settings = self.env.settings(self.default_cache_dir, snapshot)
        fast_key = (request, snapshot, chain.tool_environment(self.env))
        remembered = self._requests.get(fast_key)
        digest = None
        if remembered is not None:
            known, stamps = remembered
            if stamps_unchanged(stamps) and not self._must_force(settings, known):
                digest = known
        return request, chain, settings, fast_key, digest

    def compile_to_path(self, name: str, source: str, **options: Any) -> Path:
        """build(...).path, never loaded (no device needed); same options as build(). The file is
        checked again (trusted folders, sha256 of its bytes) just before its path is returned, and
        rebuilt if it changed or vanished since this context remembered it."""
        shared = self.settings().shared
        for _ in range(_BUILD_ATTEMPTS):
            artifact = self.build(name, source, **options)
            image = cache.read_verified(artifact.path, artifact.sha256, shared)
            if image is not None:
                image.close()
                return artifact.path
            self._artifacts.pop(artifact.digest, None)
            self._loaded.pop(artifact.digest, None)
        raise cache.CacheError(f"the artifact of {name!r} kept changing or vanishing on disk; is something "
                               "deleting or rewriting the cache?")

    def key(
        self,
        name: str,
        source: str,
        *,
        toolchain: str | ToolchainName,
        kind: str | None = None,
        flags: Sequence[str] = (),
        include_dirs: Sequence[str | os.PathLike[str]] = (),
        defines: Defines | None = None,
        arch: str | Sequence[str] | None = None,
        signature: str | Sequence[str] = (),
    ) -> str:
        """The cache key (sha256 hex digest) the request would use; builds nothing."""
        request, chain = _normalize(name, source, toolchain, kind, flags, include_dirs, defines, arch, signature)
        return self._key(request, chain, self.settings()).digest

    def clear_memory(self) -> None:
        """Forget in-process results (loaded modules stay loaded; the disk cache is untouched)."""
        with self._lock:
            self._requests.clear()
            self._artifacts.clear()
            self._loaded.clear()
            self._forced.clear()

    # --- internals ---------------------------------------------------------------------------------

    def _must_force(self, settings: Settings, digest: str) -> bool:
        return settings.force_rebuild and digest not in self._forced

    def _key_lock(self, digest: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(digest, threading.Lock())

    def _key(self, request: Request, chain: Toolchain, settings: Settings) -> _Keyed:
        tools = chain.tools(self.env)
        write_root = None if settings.disable_cache else cache.writable_root(settings.cache_roots, settings.shared)
        store = cache.IdentityMemo(write_root, settings.shared) if write_root is not None else None
        identities = {tool.role: compiler_identity(tool.path, store) for tool in tools}
        scan = scan_includes(request.source, request.include_dirs)
        symbolic = Spelling(
            tools={tool.role: f"<{tool.role}>" for tool in tools},
            source="<source>",
            output="<output>",
            workdir="<workdir>",
            include_dirs=tuple(f"<include_dirs[{i}]>" for i in range(len(request.include_dirs))),
            symbolic=True,
        )
        document = {
            "format": KEY_FORMAT,
            "name": request.name,
            "toolchain": chain.name,
            "kind": request.kind,
            "source_sha256": hashlib.sha256(request.source.encode("utf-8")).hexdigest(),
            "includes": [list(record) for record in scan.records],
            "compilers": identities,
            "commands": chain.commands(request, symbolic),
            "flags": list(request.flags),
            "defines": [list(pair) for pair in request.defines],
            "arch": list(request.arch),
            "signature": list(request.signature),
            "toolchain_signature": chain.signature(request),
        }
        tool_stamps = tuple((os.path.realpath(t.path), _stat(os.path.realpath(t.path))) for t in tools)
        return _Keyed(request, chain, settings, tools, identities, document, digest_of(document),
                      scan.stamps + tool_stamps, write_root)

    def _serve(
        self, request: Request, chain: Toolchain, settings: Settings, fast_key: tuple[Any, ...], *, load: bool
    ) -> tuple[Artifact, Any]:
        try:
            return self._serve_keyed(request, chain, settings, fast_key, load=load)
        except OSError as exc:  # a cache refusal not caught where it happened: still say where and what to do
            where = exc.filename if isinstance(exc.filename, str) else None
            if where is not None and not any(where.startswith(str(root)) for root in settings.cache_roots):
                raise
            raise trust.io_error(exc, where or settings.cache_roots[0], "use the cache at") from exc

    def _serve_keyed(
        self, request: Request, chain: Toolchain, settings: Settings, fast_key: tuple[Any, ...], *, load: bool
    ) -> tuple[Artifact, Any]:
        keyed = self._key(request, chain, settings)
        digest = keyed.digest
        with self._key_lock(digest):
            for _ in range(_BUILD_ATTEMPTS):
                artifact = None if self._must_force(settings, digest) else self._artifacts.get(digest)
                image = None
                try:
                    if artifact is None:
                        artifact, image = self._obtain(keyed)
                        self._artifacts[digest] = replace(artifact, origin="memory")
                        self._loaded.pop(digest, None)
                        if settings.force_rebuild:
                            self._forced.add(digest)
                    loaded = None
                    if load:
                        loaded = self._loaded.get(digest)
                        if loaded is None:
                            if image is None:
                                image = cache.read_verified(artifact.path, artifact.sha256, settings.shared)
                            if image is None:  # changed or removed on disk since it was remembered: get it again
                                self._artifacts.pop(digest, None)
                                continue
                            loaded = chain.load(image, request)
                            self._loaded[digest] = loaded
                finally:
                    if image is not None:
                        image.close()
                self._requests[fast_key] = (digest, keyed.stamps)
                return artifact, loaded
        raise cache.CacheError(f"artifact of {request.name!r} kept changing on disk while being loaded")

    def _obtain(self, keyed: _Keyed) -> tuple[Artifact, VerifiedFile]:
        """A disk hit, or a build under the key's cross-process lock (after looking again under it)."""
        request, settings = keyed.request, keyed.settings
        if keyed.write_root is None:
            return self._build_uncached(keyed)
        force = self._must_force(settings, keyed.digest)
        expected = keyed.chain.artifact_filename(request)
        cleared = 0
        for _ in range(_BUILD_ATTEMPTS):
            if not force:
                hit, _ = cache.lookup(settings.cache_roots, request.name, keyed.digest, shared=settings.shared,
                                      artifact_name=expected)
                if hit is not None:
                    self._say(settings, f"disk hit {hit.entry.path}")
                    return _artifact_from(hit, keyed, "disk"), hit.file
            from . import locks  # only builds lock; a disk hit does not pay for the import

            root = self._open_write_root(keyed)
            with root, locks.key_lock(root, request.name, keyed.digest, settings.shared, self._waiting(settings)):
                saw_bad = False
                if not force:  # another process may have built it while we waited for the lock
                    hit, saw_bad = cache.lookup(settings.cache_roots, request.name, keyed.digest,
                                                shared=settings.shared, artifact_name=expected)
                    if hit is not None:
                        self._say(settings, f"disk hit {hit.entry.path} (built by another process meanwhile)")
                        return _artifact_from(hit, keyed, "disk"), hit.file
                try:
                    built = self._build(keyed, root, replace_existing=force or saw_bad)
                except cache.BuildFolderRemoved as exc:
                    cleared += 1
                    self._say(settings, f"{exc}: the cache was cleared during the build; building again")
                    continue
            if built is not None:
                return built
            force = False  # another builder published first; use theirs
        if cleared:
            raise cache.CacheError(
                f"the cache was cleared during the build of {request.name!r} ({cleared} of {_BUILD_ATTEMPTS} "
                "attempts had their build folder removed while the compiler ran); nothing was published. "
                "Run again once the clean-up is over"
            )
        raise cache.CacheError(f"cache entry for {request.name!r} kept disappearing after publication")

    def _open_write_root(self, keyed: _Keyed) -> trust.Folder:
        """The write root, checked and open (created again if a clean-up removed it since keying)."""
        assert keyed.write_root is not None
        reason = cache.ensure_root(keyed.write_root, keyed.settings.shared)
        root = cache.open_root(keyed.write_root, keyed.settings.shared) if reason is None else None
        if root is None:
            raise cache.CacheError(
                f"the cache root {keyed.write_root} became unusable during the call ({reason or 'removed'}); "
                "set DEEPJIT_CACHE_DIR to a writable folder, or DEEPJIT_DISABLE_CACHE=1"
            )
        return root

    def _waiting(self, settings: Settings) -> Callable[[Path], None]:
        def say(lock: Path) -> None:
            self._say(settings, f"waiting for another process building the same key (lock {lock})")

        return say

    def _scratch_dir(self) -> Path:
        import shutil
        import tempfile

        with self._lock:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="deepjit-nocache-"))
                atexit.register(shutil.rmtree, self._scratch, True)
            return self._scratch

    def _build_uncached(self, keyed: _Keyed) -> tuple[Artifact, VerifiedFile]:
        """DISABLE_CACHE: build in this context's private scratch folder, never published."""
        scratch = cache.open_root(self._scratch_dir(), False)
        if scratch is None:
            raise cache.CacheError(f"the scratch folder {self._scratch_dir()} of DEEPJIT_DISABLE_CACHE was removed")
        with scratch:
            for _ in range(_BUILD_ATTEMPTS):
                try:
                    built = self._build(keyed, scratch, replace_existing=False, publish=False)
                except cache.BuildFolderRemoved:
                    continue
                assert built is not None
                return built
        raise cache.CacheError(f"the scratch folder of {keyed.request.name!r} kept being removed during the build")

    def _build(
        self, keyed: _Keyed, root: trust.Folder, *, replace_existing: bool, publish: bool = True
    ) -> tuple[Artifact, VerifiedFile] | None:
        """Compile in a new folder under `root`/.tmp, check the output, and (unless `publish` is
        False) commit and publish it. None if another builder's entry won."""
        request, chain, settings = keyed.request, keyed.chain, keyed.settings
        pol = trust.policy(settings.shared)
        started = time.perf_counter()
        if publish:
            from . import maintenance  # only builds sweep; a disk hit does not pay for the import

            maintenance.sweep_stale(root, settings.tmp_max_age_s, shared=settings.shared)
        build = cache.new_build_dir(root, request.name, keyed.digest, settings.shared)
        self._say(settings, f"building {request.name}.{keyed.digest[:16]} in {build.path}")
        image = None
        source_name = chain.source_filename(request)
        output_name = chain.artifact_filename(request)
        try:
            with trust.guarded(build.path / source_name, "write the source"):
                trust.write_new_file_at(build, source_name, request.source.encode("utf-8"))
            # Relative paths in a working directory named through our descriptor: the compiler works
            # in the folder we created, whatever is renamed above it meanwhile.
            spelling = Spelling(
                tools={tool.role: tool.path for tool in keyed.tools},
                source=source_name,
                output=output_name,
                workdir=".",
                include_dirs=tuple(str(d) for d in request.include_dirs),
                symbolic=False,
            )
            commands = chain.commands(request, spelling)
            outputs = []
            for command in commands:
                status, text = _run(command, build, settings)
                outputs.append(text)
                if status != 0:
                    _check_not_removed(build)
                    kept = self._keep_failure(keyed, root if publish else None, text)
                    raise CompileError(
                        f"{chain.name} build of {request.name!r} failed; nothing was published",
                        command=command, output=text, source_path=kept, returncode=status,
                    )
            try:
                image = trust.open_verified(build, output_name, pol)
            except trust.Corrupt:
                image = None
            problem = artifact_problem(image.data if image is not None else None, chain.artifact_format(request))
            if problem is not None:
                _check_not_removed(build)
                log_text = "\n".join(outputs)
                kept = self._keep_failure(keyed, root if publish else None, log_text)
                raise CompileError(
                    f"{chain.name} build of {request.name!r}: the compiler exited 0 but {problem}; "
                    "nothing was published",
                    command=commands[-1], output=log_text, source_path=kept, returncode=0,
                )
            assert image is not None
            with trust.guarded(build.path, "clean up intermediate files in"):
                _remove_intermediates(build, keep={source_name, output_name})
            manifest = self._manifest(keyed, commands, "\n".join(outputs), source_name, output_name, image, started)
            if not publish:
                return _artifact(keyed, image.path, None, "built", manifest), image
            _check_not_removed(build)
            cache.commit(build, manifest, settings.shared)
            final, ours = cache.publish(root, build, request.name, keyed.digest, replace=replace_existing,
                                        shared=settings.shared)
        except BaseException:
            if image is not None:
                image.close()
            cache.discard_build(root, build)
            raise
        finally:
            build.close()
        if not ours:
            image.close()
            self._say(settings, f"another builder published {final} first; using it")
            return None
        self._say(settings, f"published {final}")
        image.path = final / output_name
        return _artifact(keyed, image.path, final, "built", manifest), image

    def _keep_failure(self, keyed: _Keyed, root: trust.Folder | None, log_text: str) -> Path | None:
        """Keep the failed source for inspection (best effort: a full disk must not hide the CompileError)."""
        request = keyed.request
        source_name = keyed.chain.source_filename(request)
        try:
            if root is None:
                path = Path(self._scratch_dir()) / f"failed.{keyed.digest[:16]}.{source_name}"
                path.write_text(request.source, encoding="utf-8")
                return path
            return cache.save_failure(root, request.name, keyed.digest, source_name, request.source, log_text,
                                      keyed.settings.shared)
        except (OSError, cache.CacheError) as exc:
            log.warning("deepjit: could not keep the failed source of %s: %s", request.name, exc)
            return None

    def _manifest(
        self, keyed: _Keyed, commands: list[list[str]], output_text: str, source_name: str, artifact_name: str,
        image: VerifiedFile, started: float,
    ) -> dict[str, Any]:
        from . import __version__

        request = keyed.request
        return {
            "manifest_format": cache.MANIFEST_FORMAT,
            "deepjit_version": __version__,
            "name": request.name,
            "digest": keyed.digest,
            "toolchain": request.toolchain,
            "kind": request.kind,
            "source": source_name,
            "artifact": artifact_name,
            "artifact_sha256": image.sha256,
            "artifact_bytes": len(image.data),
            "commands": commands,
            "compilers": {
                tool.role: {"path": tool.path, "chosen_by": tool.chosen_by, "version": keyed.identities[tool.role]}
                for tool in keyed.tools
            },
            "options": {
                "flags": list(request.flags),
                "include_dirs": [str(d) for d in request.include_dirs],
                "defines": dict(request.defines),
                "arch": list(request.arch),
                "signature": list(request.signature),
            },
            "key_inputs": keyed.document,
            "compiler_output": output_text,
            "created_unix": time.time(),
            "build_seconds": round(time.perf_counter() - started, 3),
            "host": platform.node(),
            "python": platform.python_version(),
        }

    @staticmethod
    def _say(settings: Settings, message: str) -> None:
        log.debug("deepjit: %s", message)
        if settings.verbose:
            sys.stderr.write(f"deepjit: {message}\n")


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _check_not_removed(build: trust.Folder) -> None:
    """A compiler failing because its folder was deleted under it is a clean-up race, not a CompileError."""
    if build.removed():
        raise cache.BuildFolderRemoved(f"the build folder {build.path} was removed while the compiler ran")


def _remove_intermediates(build: trust.Folder, keep: set[str]) -> None:
    """An entry holds the source and the artifact only (plus manifest and marker, written later)."""
    for child in os.listdir(build.fd):
        if child not in keep:
            trust.remove_at(build.fd, child)


def _run(command: list[str], build: trust.Folder, settings: Settings) -> tuple[int, str]:
    import subprocess

    if settings.print_commands:
        sys.stderr.write(f"deepjit: (in {build.path}) {shlex.join(command)}\n")
    try:
        completed = subprocess.run(
            command, cwd=build.cwd(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace",
        )
    except OSError as exc:
        _check_not_removed(build)
        raise ToolchainNotFoundError(f"cannot run {command[0]!r}: {exc}") from exc
    if settings.verbose and completed.stdout:
        sys.stderr.write(completed.stdout if completed.stdout.endswith("\n") else completed.stdout + "\n")
    return completed.returncode, completed.stdout


def _artifact(keyed: _Keyed, path: Path, entry: Path | None, origin: str, manifest: Mapping[str, Any]) -> Artifact:
    return Artifact(
        name=keyed.request.name, digest=keyed.digest, toolchain=keyed.request.toolchain, kind=keyed.request.kind,
        path=path, entry=entry, origin=origin, sha256=str(manifest["artifact_sha256"]), manifest=manifest,
    )


def _artifact_from(hit: cache.Hit, keyed: _Keyed, origin: str) -> Artifact:
    return _artifact(keyed, hit.artifact, hit.entry.path, origin, hit.manifest)


# --- module-level default context ------------------------------------------------------------------

_default = JitContext()


def default_context() -> JitContext:
    return _default


def configure(env_prefix: str | None = None, *, default_cache_dir: str | os.PathLike[str] | None = None) -> JitContext:
    """Replace the module-level context (for applications). Libraries should hold their own
    `JitContext(env_prefix="MYLIB_JIT_")` instead, so two libraries never fight over the default."""
    global _default
    _default = JitContext(env_prefix, default_cache_dir=default_cache_dir)
    return _default


def _on_default(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A module-level function that calls `method` on the current default context, with the
    method's signature (minus self) and docstring. It looks the default up at call time, so
    `configure()` takes effect for functions imported earlier."""
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return method(_default, *args, **kwargs)

    signature = inspect.signature(method)
    call.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    call.__name__ = call.__qualname__ = name
    return call


compile = _on_default(JitContext.compile, "compile")  # noqa: A001 - the name the issue asks for
build = _on_default(JitContext.build, "build")
compile_to_path = _on_default(JitContext.compile_to_path, "compile_to_path")
cache_key = _on_default(JitContext.key, "cache_key")
