"""The conformance kit's engine: case registry, runner and report.

A case is a seeded closure that runs one public op on the currently selected backend (the runner
wraps it in `use_backend`) and returns its error metric, raising `CaseFailure` when the result is
outside the contract. Declines (no provider, or a layout the backend cannot hold) are recorded as
unsupported with their reason, not as failures.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

import attrs
import torch

from ..errors import BackendUnavailableError, LayoutError, NoKernelError
from ..registry import available_backends, run_device, use_backend


class CaseFailure(AssertionError):
    """A conformance case produced a result outside its op's contract."""


@attrs.frozen
class Case:
    """One reproducible check: op, a label naming the shape/edge, the seed, and the check itself."""

    op: str
    label: str
    seed: int
    run: Callable[[torch.device], float]


CaseFactory = Callable[[bool], Iterable[Case]]
_FACTORIES: dict[str, list[CaseFactory]] = {}


def conformance_cases(op: str) -> Callable[[CaseFactory], CaseFactory]:
    """Register a factory `f(quick) -> cases` for an op."""
    def add(factory: CaseFactory) -> CaseFactory:
        _FACTORIES.setdefault(op, []).append(factory)
        return factory
    return add


def cases_for(op: str, quick: bool) -> list[Case]:
    return [case for factory in _FACTORIES.get(op, ()) for case in factory(quick)]


def covered_ops() -> list[str]:
    return sorted(_FACTORIES)


@attrs.frozen
class Failure:
    label: str
    seed: int
    message: str


@attrs.frozen
class OpReport:
    op: str
    cases: int
    passed: int
    unsupported: dict[str, str]
    failures: tuple[Failure, ...]
    worst_error: float
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures


@attrs.frozen
class ConformanceReport:
    backend: str
    device: str
    ops: dict[str, OpReport]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ops.values())

    def format_table(self) -> str:
        lines = [f"conformance of backend {self.backend!r} on {self.device}",
                 f"{'op':40s} {'cases':>5s} {'pass':>5s} {'fail':>5s} {'unsup':>5s} {'worst err':>10s} {'time':>7s}"]
        for r in self.ops.values():
            lines.append(f"{r.op:40s} {r.cases:5d} {r.passed:5d} {len(r.failures):5d} {len(r.unsupported):5d} "
                         f"{r.worst_error:10.2e} {r.seconds:6.1f}s")
        for r in self.ops.values():
            for f in r.failures:
                lines.append(f"FAIL {r.op} [{f.label}] seed={f.seed}: {f.message}")
            for label, reason in list(r.unsupported.items())[:3]:
                lines.append(f"unsupported {r.op} [{label}]: {reason.splitlines()[0]}")
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


def _device_for(backend: str) -> torch.device:
    info = available_backends().get(backend)
    if info is None:
        raise BackendUnavailableError(f"backend {backend!r} is not registered; see `python -m portable_kernels doctor`.")
    device = run_device(info)
    if device is not None:
        return device
    raise BackendUnavailableError(f"backend {backend!r} cannot run here: {info.reason}")


def _run_case(case: Case, device: torch.device) -> tuple[str, float | str]:
    torch.manual_seed(case.seed)
    try:
        return "pass", float(case.run(device))
    except (NoKernelError, LayoutError) as exc:
        return "unsupported", str(exc)
    except Exception as exc:  # every other outcome is a failure of the backend under test
        return "fail", f"{type(exc).__name__}: {exc}"


def run_conformance(backend: str | None = None, ops: Iterable[str] | None = None, quick: bool = False,
                    **options) -> ConformanceReport:
    """Run every op's contract cases on one backend and return a structured report.

    backend: a registered backend name (default "cpu"); it runs on its native device when present,
             else in emulation on CPU tensors. `options` are layout options (e.g. arch="sm100").
    ops:     restrict to these op names (default: every op with cases)
    quick:   fewer, smaller cases (the CI size)
    """
    name = backend or "cpu"
    device = _device_for(name)
    selected = list(ops) if ops is not None else covered_ops()
    unknown = [op for op in selected if op not in _FACTORIES]
    if unknown:
        raise ValueError(f"no conformance cases for {unknown}; ops with cases: {covered_ops()}")
    reports = {}
    for op in selected:
        start = time.perf_counter()
        passed, worst, failures, unsupported = 0, 0.0, [], {}
        cases = cases_for(op, quick)
        with use_backend(name, **options):
            for case in cases:
                status, value = _run_case(case, device)
                if status == "pass":
                    passed += 1
                    worst = max(worst, value)
                elif status == "unsupported":
                    unsupported[case.label] = value
                else:
                    failures.append(Failure(case.label, case.seed, value))
        reports[op] = OpReport(op, len(cases), passed, unsupported, tuple(failures), worst,
                               time.perf_counter() - start)
    return ConformanceReport(name, str(device), reports)
