"""Backends, their kernel providers, and the run-time selection rule.

Selection: an explicit `use_backend(name)` > the layout tag of prepared inputs > the tensors'
device type. Inside a backend, providers are tried by descending priority; the first whose
`supports(**kernel_args)` returns None runs. Backends arrive through the entry-point group
`portable_kernels.backends` (ours and third parties' alike); a broken plugin is reported, not fatal.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from importlib.metadata import entry_points
from typing import Any, Callable, Iterator, Mapping

import attrs
import torch

from .errors import BackendUnavailableError, ContractError, LayoutError, NoKernelError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "portable_kernels.backends"

SupportsFn = Callable[..., "str | None"]


@attrs.frozen
class Provider:
    """One kernel implementing one op on one backend."""

    op: str
    backend: str
    name: str
    fn: Callable[..., Any]
    priority: int = 0
    supports: SupportsFn | None = None

    def decline_reason(self, kwargs: Mapping[str, Any]) -> str | None:
        if self.supports is None:
            return None
        return self.supports(**kwargs)


class Backend:
    """A hardware family. Plugins subclass this and pass an instance to `Registry.add_backend`.

    name:          unique name ("cpu", "nvidia", "ascend", or a plugin's)
    device_types:  torch device types it runs on natively ("cpu", "cuda", "npu", ...)
    emulation:     whether it also runs on CPU tensors when chosen explicitly (use_backend or
                   prepared inputs); its bytes are then checked by the same contracts on the CPU
    moe_alignment: per-expert segment alignment its grouped GEMM wants (NVIDIA 128, Ascend 256)
    """

    name: str = ""
    device_types: tuple[str, ...] = ()
    emulation: bool = False
    #: row alignment of each expert segment in the MoE contiguous layout (DeepGEMM: 128)
    moe_alignment: int = 128

    def unavailable_reason(self) -> str | None:
        """None when the backend can run on its native devices here, else why not."""
        return None

    def variants(self) -> list[dict[str, Any]]:
        """Layout option sets worth showing side by side (the demo runs one column per variant)."""
        return [{}]

    def default_options(self, device: torch.device) -> dict[str, Any]:
        """Layout options implied by a device (e.g. the GPU architecture)."""
        return {}

    def layout_for(self, op: str, arg: str, role: str, options: Mapping[str, Any]):
        """The `Layout` this backend wants for a quantized argument of an op (see layout.py)."""
        raise NotImplementedError(f"backend {self.name!r} declares no layouts")

    def decode(self, prepared):
        """PreparedTensor in one of this backend's formats -> QuantTensor with the same numbers."""
        raise NotImplementedError(f"backend {self.name!r} cannot decode {prepared.tag}")


@attrs.frozen
class Selection:
    """The backend chosen for one call, and the options its layouts take."""

    backend: Backend
    options: Mapping[str, Any]
    explicit: bool


_forced: contextvars.ContextVar[tuple[str, dict[str, Any]] | None] = contextvars.ContextVar(
    "portable_kernels_forced_backend", default=None)


@contextlib.contextmanager
def use_backend(name: str, **options: Any) -> Iterator[None]:
    """Force a backend for the ops called inside the block (like torch's sdpa_kernel).

    `options` are layout options such as `arch="sm100"` for the nvidia backend in emulation.
    """
    registry().backend(name)  # fail early on an unknown name
    token = _forced.set((name, dict(options)))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_backend() -> tuple[str, dict[str, Any]] | None:
    return _forced.get()


class Registry:
    """Holds backends and providers; loads plugins from entry points once, lazily."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._providers: dict[tuple[str, str], list[Provider]] = {}
        self._broken: dict[str, str] = {}
        self._loaded = False
        self._lock = threading.RLock()

    # -- registration (called by plugins' register(registry)) --------------------------------
    def add_backend(self, backend: Backend) -> None:
        if not backend.name or not backend.name.isidentifier():
            raise ValueError(f"backend name {backend.name!r} must be a Python identifier")
        with self._lock:
            if backend.name in self._backends:
                raise ValueError(f"backend {backend.name!r} is already registered")
            self._backends[backend.name] = backend

    def add_provider(self, provider: Provider) -> None:
        with self._lock:
            if provider.backend not in self._backends:
                raise ValueError(f"register backend {provider.backend!r} before its providers")
            entries = self._providers.setdefault((provider.op, provider.backend), [])
            if any(p.name == provider.name for p in entries):
                raise ValueError(f"provider {provider.name!r} of {provider.op} on {provider.backend} exists")
            entries.append(provider)
            entries.sort(key=lambda p: -p.priority)

    def kernel(self, op: str, backend: str, name: str, *, priority: int = 0,
               supports: SupportsFn | None = None) -> Callable[[Callable], Callable]:
        """Decorator form of `add_provider`."""
        def wrap(fn: Callable) -> Callable:
            self.add_provider(Provider(op, backend, name, fn, priority, supports))
            return fn
        return wrap

    # -- discovery ----------------------------------------------------------------------------
    def ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                self.load_plugin(ep.name, ep.load)

    def load_plugin(self, name: str, loader: Callable[[], Callable[["Registry"], None]]) -> None:
        """Run one plugin's register function; record (not raise) any failure."""
        try:
            loader()(self)
        except Exception as exc:  # a broken plugin must not break the library
            self.record_broken(name, exc)

    def record_broken(self, name: str, exc: BaseException) -> None:
        """Remember that a plugin (or one part of one, e.g. "cpu.mla") failed to load, and why."""
        log.warning("backend plugin %r failed to load: %s", name, exc)
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
        if name not in self._backends:
            known = ", ".join(sorted(self._backends)) or "none"
            broken = "".join(f"\n  plugin {k!r} failed to load: {v}" for k, v in self._broken.items())
            raise BackendUnavailableError(
                f"backend {name!r} is not registered (registered: {known}).{broken}\n"
                f"Fix: install the plugin package that provides it, or use one of the registered names.")
        return self._backends[name]

    def providers(self, op: str, backend: str) -> list[Provider]:
        self.ensure_loaded()
        return list(self._providers.get((op, backend), ()))

    def ops(self, backend: str) -> list[str]:
        self.ensure_loaded()
        return sorted(op for (op, b) in self._providers if b == backend)

    def backend_for_device(self, device: torch.device) -> Backend:
        self.ensure_loaded()
        for backend in self._backends.values():
            if device.type in backend.device_types:
                return backend
        raise BackendUnavailableError(
            f"no registered backend runs on device type {device.type!r} "
            f"(registered: {', '.join(f'{b.name}{list(b.device_types)}' for b in self._backends.values())}). "
            f"Fix: install the backend plugin for this device.")

    def select_provider(self, op: str, backend: str, kwargs: Mapping[str, Any]) -> Provider:
        reasons: dict[str, str] = {}
        for provider in self.providers(op, backend):
            reason = provider.decline_reason(kwargs)
            if reason is None:
                return provider
            reasons[provider.name] = reason
        raise NoKernelError(op, backend, reasons)


_REGISTRY = Registry()


def registry() -> Registry:
    """The process-wide registry."""
    return _REGISTRY


def _devices(tensors: list[torch.Tensor]) -> torch.device | None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        listed = ", ".join(sorted(str(d) for d in devices))
        raise ContractError(f"tensors are on different devices ({listed}); move every argument to one device.")
    return next(iter(devices), None)


def select_backend(op: str, tensors: list[torch.Tensor], tags: Mapping[str, str],
                   requested: str | None = None, options: Mapping[str, Any] | None = None) -> Selection:
    """Apply the selection rule for one call.

    tensors:   every tensor the call touches (for the device rule and the same-device check)
    tags:      argument name -> backend name of each prepared argument
    requested: a backend asked for by the caller of prepare_inputs (same rank as use_backend)
    """
    reg = registry()
    device = _devices(tensors)
    forced = forced_backend()
    tag_backends = sorted(set(tags.values()))
    if len(tag_backends) > 1:
        listing = ", ".join(f"{arg} for {b!r}" for arg, b in tags.items())
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
        opts.update(options)
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
    """Every registered backend: its devices, providers per op, and availability with the reason.

    Plugins that failed to load appear with available=False and the error as the reason.
    """
    reg = registry()
    out: dict[str, BackendInfo] = {}
    for name, backend in reg.backends().items():
        try:
            reason = backend.unavailable_reason()
        except Exception as exc:  # a backend's probe must not break the report
            reason = f"availability check failed: {type(exc).__name__}: {exc}"
        providers = {op: tuple(p.name for p in reg.providers(op, name)) for op in reg.ops(name)}
        out[name] = BackendInfo(name, tuple(backend.device_types), reason is None, reason,
                                backend.emulation, providers)
    for name, reason in reg.broken_plugins().items():
        out.setdefault(name, BackendInfo(name, (), False, f"plugin failed to load: {reason}", False, {}))
    return out
