"""Backends, their kernel providers, and the rule that picks a backend for a call.

Selection: an explicit `use_backend(name)` > the backend of prepared inputs > the tensors'
device type. Inside a backend, providers are tried by descending priority; the first with no
reason to decline runs (`portable_kernels.core.dispatch` caches that choice per call signature).
Backends arrive through the entry-point group `portable_kernels.backends` (ours and third
parties' alike), loaded once under a lock and published only when complete; a broken plugin is
reported, never fatal.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
import pkgutil
import threading
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping

import attrs
import torch

from .contract import QuantArg, contracts
from .errors import BackendUnavailableError, ContractError, LayoutError, NoKernelError
from .formats import PLAIN, Format
from ..layouts.kv_cache import FLASHMLA_FP8_KV, KVCacheFormat
from .providers import CheckFn, KernelFn, Limit, Provider, first_accepting

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "portable_kernels.backends"


class Backend:
    """A hardware family. Plugins subclass this and pass an instance to `Registry.add_backend`.

    name:          unique name ("cpu", "nvidia", "ascend", or a plugin's)
    device_types:  torch device types it runs on natively ("cpu", "cuda", "npu", ...)
    emulation:     whether it also runs on CPU tensors when chosen explicitly (use_backend or
                   prepared inputs); its bytes are then checked by the same contracts on the CPU
    moe_alignment: per-expert segment alignment its grouped GEMM wants (NVIDIA 128, Ascend 256)
    options:       the options it understands, each with its allowed values (nvidia: arch)
    not_mapped:    op -> why this backend has no kernel of its own for it (the oracle answers;
                   NoKernelError and doctor quote the reason)
    """

    name: str = ""
    device_types: tuple[str, ...] = ()
    emulation: bool = False
    #: row alignment of each expert segment in the MoE contiguous layout (DeepGEMM: 128)
    moe_alignment: int = 128
    options: Mapping[str, tuple[Any, ...]] = {}
    not_mapped: Mapping[str, str] = {}

    def unavailable_reason(self) -> str | None:
        """None when the backend can run on its native devices here, else why not."""
        return None

    def variants(self) -> list[dict[str, Any]]:
        """Option sets worth showing side by side (the demo runs one column per variant)."""
        return [{}]

    def default_options(self, device: torch.device) -> dict[str, Any]:
        """Options implied by a device (e.g. the GPU architecture)."""
        return {}

    def format_for(self, op: str, arg: QuantArg, options: Mapping[str, Any]) -> Format:
        """The Format this backend stores a quantized argument of an op in. Default: PLAIN (a
        backend that declares no Formats reads the logical form)."""
        return PLAIN

    def formats(self) -> tuple[Format, ...]:
        """Every Format `format_for` may answer (for doctor and validation)."""
        return (PLAIN,)

    def place_encoded(self, fmt: Format, data: torch.Tensor) -> torch.Tensor:
        """The encoded data of a `fmt` operand as this backend's device kernels read it, once at ingest
        (e.g. a device-private tile format the device's matmul prefers). Default: as encoded."""
        return data

    def kv_cache_format(self, options: Mapping[str, Any]) -> KVCacheFormat:
        """The byte order its decode kernels read the 656-byte FP8 KV cache in. Default: FlashMLA's."""
        return FLASHMLA_FP8_KV


#: (backend name, options as sorted pairs) forced by use_backend, or None
_forced: contextvars.ContextVar[tuple[str, tuple[tuple[str, Any], ...]] | None] = contextvars.ContextVar(
    "portable_kernels_forced_backend", default=None)
#: the forced (backend, options) as stored (hashable, no copy): the cache key dispatch uses per call
forced_key = _forced.get


def check_options(backend: Backend, options: Mapping[str, Any], where: str) -> None:
    """Refuse options a backend does not declare, or values outside the declared ones."""
    for key, value in options.items():
        if key not in backend.options:
            known = ", ".join(f"{k} in {list(v)}" for k, v in backend.options.items()) or "none"
            raise ContractError(f"{where}: backend {backend.name!r} has no option {key!r} (its options: {known}). "
                                f"Fix: spell the option as the backend declares it, or drop it.")
        allowed = backend.options[key]
        if value not in allowed:
            raise ContractError(f"{where}: option {key}={value!r} of backend {backend.name!r} is not one of "
                                f"{list(allowed)}. Fix: pass one of those values.")


@contextlib.contextmanager
def use_backend(name: str, **options: Any) -> Iterator[None]:
    """Force a backend for the ops called inside the block (like torch's sdpa_kernel).

    `options` are the backend's options such as `arch="sm100"` for the nvidia backend in emulation;
    an option the backend does not declare is a ContractError listing the ones it has.
    """
    backend = registry().backend(name)  # fail early on an unknown name
    check_options(backend, options, "use_backend")
    token = _forced.set((name, tuple(sorted(options.items()))))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_backend() -> tuple[str, dict[str, Any]] | None:
    """The backend and options forced by the innermost use_backend, or None."""
    forced = _forced.get()
    return None if forced is None else (forced[0], dict(forced[1]))


@attrs.frozen
class EpEngine:
    """An expert-parallel low-latency engine a backend offers to `ep.Buffer` (DeepEP's
    low_latency_dispatch / low_latency_combine pair on that chip's own collectives).

    name, backend: how doctor and trace_providers name it ("mc2" of "ascend")
    build:       Buffer -> the engine (an object with `dispatch` and `combine`, as
                 portable_kernels.ops.ep.low_latency_exchange.LowLatencyEngine)
    unavailable: process group -> why the engine cannot serve that group (None: it can)
    priority:    engines are tried highest first; without one, the Buffer's all-to-all engine runs
    """

    name: str
    backend: str
    build: Callable[[Any], Any]
    unavailable: Callable[[Any], str | None]
    priority: int = 0
    doc: str = ""


class Registry:
    """Holds backends and providers; loads plugins from entry points once, lazily.

    `generation` grows with every registration, so caches of selections know when to forget.
    """

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._providers: dict[tuple[str, str], list[Provider]] = {}
        self._broken: dict[str, str] = {}
        self._ep_engines: list[EpEngine] = []
        self._loaded = False
        self._loading_thread: int | None = None
        self._lock = threading.RLock()
        self.generation = 0

    # -- registration (called by plugins' register(registry)) --------------------------------
    def add_backend(self, backend: Backend) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(f"add_backend takes a portable_kernels.Backend instance, got {type(backend).__name__}")
        if not backend.name or not backend.name.isidentifier():
            raise ValueError(f"backend name {backend.name!r} must be a Python identifier")
        with self._lock:
            if backend.name in self._backends:
                raise ValueError(f"backend {backend.name!r} is already registered")
            self._backends[backend.name] = backend
            self.generation += 1

    def add_provider(self, provider: Provider) -> None:
        known = contracts()
        if provider.op not in known:
            raise ValueError(f"cannot register provider {provider.name!r}: no op named {provider.op!r} "
                             f"(ops: {', '.join(sorted(known))})")
        with self._lock:
            if provider.backend not in self._backends:
                raise ValueError(f"register backend {provider.backend!r} before its providers")
            entries = self._providers.setdefault((provider.op, provider.backend), [])
            if any(p.name == provider.name for p in entries):
                raise ValueError(f"provider {provider.name!r} of {provider.op} on {provider.backend} is already "
                                 f"registered; give the new one another name")
            entries.append(provider)
            entries.sort(key=lambda p: -p.priority)
            self.generation += 1

    def add_ep_engine(self, engine: EpEngine) -> None:
        """Offer an EP low-latency engine (a plugin may add its own, like a provider)."""
        with self._lock:
            if engine.backend not in self._backends:
                raise ValueError(f"register backend {engine.backend!r} before its EP engines")
            if any((e.backend, e.name) == (engine.backend, engine.name) for e in self._ep_engines):
                raise ValueError(f"EP engine {engine.name!r} of {engine.backend} is already registered")
            self._ep_engines.append(engine)
            self._ep_engines.sort(key=lambda e: -e.priority)
            self.generation += 1

    def ep_engines(self) -> list[EpEngine]:
        self.ensure_loaded()
        return list(self._ep_engines)

    def select_ep_engine(self, group: Any) -> tuple[EpEngine | None, dict[str, str]]:
        """The first registered EP engine (by priority) that can serve `group`, and every other
        engine's reason; (None, reasons) when none can (the caller's all-to-all engine runs)."""
        reasons: dict[str, str] = {}
        for engine in self.ep_engines():
            try:
                why = engine.unavailable(group)
            except Exception as exc:  # a probe that fails is a reason, never a crash
                why = f"its availability check raised {type(exc).__name__}: {exc}"
            if why is None:
                return engine, reasons
            reasons[f"{engine.backend}.{engine.name}"] = why
        return None, reasons

    def kernel(self, op: str, backend: str, name: str, *, priority: int = 0,
               formats: Mapping[str, Iterable[Format]] | None = None,
               dtypes: Mapping[str, Iterable[torch.dtype]] | None = None, devices: Iterable[str] = (),
               limits: Iterable[Limit] = (), check: CheckFn | None = None,
               shape_class: Callable[[Any], Hashable] | None = None, doc: str = "") -> Callable[[KernelFn], KernelFn]:
        """Decorator form of `add_provider`: `@registry.kernel("topk", "mychip", "native", ...)` on a
        function of the op's inputs value."""
        def wrap(fn: KernelFn) -> KernelFn:
            self.add_provider(Provider(op, backend, name, fn, priority, formats or {}, dtypes or {}, devices, limits,
                                       check, shape_class, doc))
            return fn
        return wrap

    # -- discovery ----------------------------------------------------------------------------
    def ensure_loaded(self) -> None:
        """Load every plugin once. Other threads wait until loading is complete; a plugin's own
        register function may query the registry while it loads (it sees what is there so far)."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading_thread == threading.get_ident():
                return
            self._loading_thread = threading.get_ident()
            try:
                for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                    self.load_plugin(ep.name, ep.load)
            finally:
                self._loading_thread = None
                self._loaded = True

    def load_plugin(self, name: str, loader: Callable[[], Callable[["Registry"], None]]) -> None:
        """Run one plugin's register function; record (not raise) any failure."""
        try:
            loader()(self)
        except Exception as exc:  # a broken plugin must not break the library
            self.record_broken(name, exc)

    def register_modules(self, package: ModuleType, label: str) -> None:
        """Call `register(self)` of every module of `package` whose name does not start with "_", in
        name order: a backend's providers/ folder (one module per op family, no central list). A
        module that fails to import or register is recorded as broken ("<label>.<module>") and the
        others still register."""
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            if info.name.startswith("_"):
                continue
            try:
                importlib.import_module(f"{package.__name__}.{info.name}").register(self)
            except Exception as exc:
                self.record_broken(f"{label}.{info.name}", exc)

    def record_broken(self, name: str, exc: BaseException) -> None:
        """Remember that a plugin (or one part of one, e.g. "cpu.mla") failed to load, and why."""
        log.warning("backend plugin %r failed to load: %s", name, exc)
        with self._lock:
            self._broken[name] = f"{type(exc).__name__}: {exc}"

    # -- queries ------------------------------------------------------------------------------
    def backends(self) -> dict[str, Backend]:
        self.ensure_loaded()
        return dict(self._backends)

    def broken_plugins(self) -> dict[str, str]:
        self.ensure_loaded()
        return dict(self._broken)

    def backend(self, name: str) -> Backend:
        self.ensure_loaded()
        backend = self._backends.get(name)
        if backend is None:
            known = ", ".join(sorted(self._backends)) or "none"
            broken = "".join(f"\n  plugin {k!r} failed to load: {v}" for k, v in self._broken.items())
            raise BackendUnavailableError(
                f"backend {name!r} is not registered (registered: {known}).{broken}\n"
                f"Fix: install the plugin package that provides it, or use one of the registered names.")
        return backend

    def providers(self, op: str, backend: str) -> list[Provider]:
        self.ensure_loaded()
        return list(self._providers.get((op, backend), ()))

    def ops(self, backend: str) -> list[str]:
        self.ensure_loaded()
        return sorted(op for (op, b) in self._providers if b == backend)

    def select_provider(self, op: str, backend: str, inputs: Any) -> Provider:
        """The first provider of `backend` for `op`, by priority, with no reason to decline `inputs`
        (uncached: `portable_kernels.core.dispatch` caches this choice for calls)."""
        chosen = first_accepting(self.providers(op, backend), inputs)
        if isinstance(chosen, dict):
            raise NoKernelError(op, backend, {**not_mapped_reasons(self._backends.get(backend), op), **chosen})
        return chosen

    def backend_for_device(self, device: torch.device) -> Backend:
        self.ensure_loaded()
        for backend in self._backends.values():
            if device.type in backend.device_types:
                return backend
        raise BackendUnavailableError(
            f"no registered backend runs on device type {device.type!r} "
            f"(registered: {', '.join(f'{b.name}{list(b.device_types)}' for b in self._backends.values())}). "
            f"Fix: install the backend plugin for this device.")


_REGISTRY = Registry()
#: the process-wide registry (what registry() returns), for the hot path's generation check
REGISTRY = _REGISTRY


def not_mapped_reasons(backend: Backend | None, op: str) -> dict[str, list[str]]:
    """The backend's own word on why it has no kernel for `op`, as a NoKernelError reason entry."""
    why = None if backend is None else backend.not_mapped.get(op)
    return {"not mapped": [why]} if why else {}


def registry() -> Registry:
    """The process-wide registry."""
    return _REGISTRY


@attrs.frozen
class Selection:
    """The backend chosen for one call, and the options its Formats take."""

    backend: Backend
    options: Mapping[str, Any]
    explicit: bool


def common_device(op: str, tensors: Iterable[torch.Tensor]) -> torch.device | None:
    """The one device every tensor is on (None without tensors); ContractError if they differ."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        listed = ", ".join(sorted(str(d) for d in devices))
        raise ContractError(f"{op}: tensors are on different devices ({listed}); move every argument to one device.")
    return next(iter(devices), None)


def select_backend(op: str, device: torch.device | None, tags: Mapping[str, tuple[str, tuple]],
                   requested: str | None = None, options: Mapping[str, Any] | None = None) -> Selection:
    """Apply the selection rule for one call.

    device:    the call's device (None: no tensor argument)
    tags:      argument name -> (backend name, options) of each prepared argument
    requested: a backend asked for by the caller of prepare_inputs (same rank as use_backend)
    options:   extra options from that caller (e.g. arch)
    """
    reg = registry()
    forced = _forced.get()
    tag_backends = sorted({backend for backend, _ in tags.values()})
    if len(tag_backends) > 1:
        listing = ", ".join(f"{arg} for {b!r}" for arg, (b, _) in tags.items())
        raise LayoutError(f"{op}: arguments were prepared for different backends ({listing}). "
                          f"Fix: prepare every argument for one backend with prepare_inputs.")
    opts: dict[str, Any] = {}
    if requested is not None:
        name, explicit = requested, True
    elif forced is not None:
        name, explicit = forced[0], True
        opts.update(forced[1])
    elif tag_backends:
        name, explicit = tag_backends[0], True
    elif device is not None:
        name, explicit = reg.backend_for_device(device).name, False
    else:
        raise ContractError(f"{op}: no tensor argument to choose a backend from; pass tensors or use_backend(...).")
    if tag_backends and tag_backends[0] != name:
        arg = next(iter(tags))
        raise LayoutError(f"{op}: argument '{arg}' was prepared for backend {tag_backends[0]!r} but the call runs "
                          f"on backend {name!r}. Fix: prepare it again with prepare_inputs(..., backend={name!r}), "
                          f"or call inside use_backend({tag_backends[0]!r}).")
    backend = reg.backend(name)
    if options:
        check_options(backend, options, op)
        opts.update(options)
    for _, params in tags.values():  # options a prepared argument was made under, unless overridden
        for key, value in params:
            opts.setdefault(key, value)
    if device is not None:
        _check_runnable(op, backend, device, explicit)
        opts = {**backend.default_options(device), **opts}
    return Selection(backend, opts, explicit)


def _check_runnable(op: str, backend: Backend, device: torch.device, explicit: bool) -> None:
    if device.type in backend.device_types:
        reason = backend.unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(f"{op}: backend {backend.name!r} is unavailable: {reason}")
        return
    if device.type == "cpu" and backend.emulation and explicit:
        return
    where = list(backend.device_types) + (["cpu (emulation)"] if backend.emulation else [])
    raise ContractError(f"{op}: backend {backend.name!r} runs on {where}, but the tensors are on {device}. "
                        f"Fix: move the tensors to one of those devices, or choose another backend.")


@attrs.frozen
class BackendInfo:
    """What `available_backends()` reports for one backend."""

    name: str
    device_types: tuple[str, ...]
    available: bool
    reason: str | None
    emulation: bool
    providers: Mapping[str, tuple[str, ...]]
    formats: tuple[Format, ...] = ()
    details: Mapping[str, tuple[Provider, ...]] = attrs.field(factory=dict)
    not_mapped: Mapping[str, str] = attrs.field(factory=dict)


def _device_present(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    return bool(module is not None and getattr(module, "is_available", lambda: False)())


def run_device(info: BackendInfo) -> torch.device | None:
    """Where a backend runs here: its first native device that is present, else CPU tensors in
    emulation if it has that, else None."""
    if info.available:
        for device_type in info.device_types:
            if _device_present(device_type):
                return torch.device(device_type)
    return torch.device("cpu") if info.emulation else None


def available_backends() -> dict[str, BackendInfo]:
    """Every registered backend: its devices, Formats, providers per op, and availability with the
    reason. Plugins that failed to load appear with available=False and the error as the reason."""
    reg = registry()
    out: dict[str, BackendInfo] = {}
    for name, backend in reg.backends().items():
        try:
            reason = backend.unavailable_reason()
        except Exception as exc:  # a backend's probe must not break the report
            reason = f"availability check failed: {type(exc).__name__}: {exc}"
        try:
            formats = tuple(backend.formats())
        except Exception as exc:
            log.warning("backend %r failed to list its formats: %s", name, exc)
            formats = ()
        details = {op: tuple(reg.providers(op, name)) for op in reg.ops(name)}
        providers = {op: tuple(p.name for p in ps) for op, ps in details.items()}
        out[name] = BackendInfo(name, tuple(backend.device_types), reason is None, reason, backend.emulation,
                                providers, formats, details, dict(backend.not_mapped))
    for name, reason in reg.broken_plugins().items():
        out.setdefault(name, BackendInfo(name, (), False, f"plugin failed to load: {reason}", False, {}))
    return out
