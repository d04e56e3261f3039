"""The conformance kit's engine: case registry, runner and report.

A case is a seeded closure that runs one public op on the currently selected backend (the runner
wraps it in `use_backend`) and returns its error metric, raising `CaseFailure` when the result is
outside the contract. Declines (no provider, or a layout the backend cannot hold) are recorded as
unsupported with their reason, not as failures.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Iterable, TextIO

import attrs
import torch

from ..core.dispatch import trace_providers
from ..core.errors import BackendUnavailableError, LayoutError, NoKernelError
from ..core.registry import available_backends, registry, run_device, use_backend


class CaseFailure(AssertionError):
    """A conformance case produced a result outside its op's contract."""


class CaseNotApplicable(Exception):
    """A case does not apply where it runs (e.g. a value check on a device where value checks are
    off); reported as unsupported with the reason."""


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
    """One op's outcome. `providers`: how many passing cases each provider of the backend ran (a
    case that runs several ops counts only this op's calls); `provided`: whether the backend
    registers any provider for the op at all."""

    op: str
    cases: int
    passed: int
    unsupported: dict[str, str]
    failures: tuple[Failure, ...]
    worst_error: float
    seconds: float
    providers: dict[str, int] = attrs.field(factory=dict)
    provided: bool = True

    @property
    def ok(self) -> bool:
        return not self.failures


#: unsupported cases listed in full per op before the rest is summarized as "N more"
SHOWN_UNSUPPORTED = 5


def _indent(text: str) -> str:
    return text.replace("\n", "\n      ")


@attrs.frozen
class ConformanceReport:
    backend: str
    device: str
    ops: dict[str, OpReport]
    options: dict[str, Any] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ops.values())

    def format_table(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())) or "defaults"
        lines = [f"conformance of backend {self.backend!r} on {self.device} (options: {opts})",
                 f"{'op':40s} {'cases':>5s} {'pass':>5s} {'fail':>5s} {'unsup':>5s} {'worst err':>10s} {'time':>7s}"
                 f"  providers"]
        missing = [r.op for r in self.ops.values() if not r.provided]
        for r in self.ops.values():
            if not r.provided:
                continue
            ran = ", ".join(f"{name} x{count}" for name, count in sorted(r.providers.items())) or "-"
            lines.append(f"{r.op:40s} {r.cases:5d} {r.passed:5d} {len(r.failures):5d} {len(r.unsupported):5d} "
                         f"{r.worst_error:10.2e} {r.seconds:6.1f}s  {ran}")
        if missing:
            lines.append(f"not provided by {self.backend!r} ({len(missing)} ops): {', '.join(missing)}")
        for r in self.ops.values():
            for f in r.failures:
                lines.append(f"FAIL {r.op} [{f.label}] seed={f.seed}: {_indent(f.message)}")
            if not r.provided:
                continue
            items = list(r.unsupported.items())
            for label, reason in items[:SHOWN_UNSUPPORTED]:
                lines.append(f"unsupported {r.op} [{label}]: {_indent(reason)}")
            if len(items) > SHOWN_UNSUPPORTED:
                lines.append(f"unsupported {r.op}: {len(items) - SHOWN_UNSUPPORTED} more")
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


def _run_case(case: Case, device: torch.device) -> tuple[str, float | str, list[tuple[str, str, str]]]:
    torch.manual_seed(case.seed)
    with trace_providers() as ran:
        try:
            return "pass", float(case.run(device)), ran
        except (NoKernelError, LayoutError, CaseNotApplicable) as exc:
            return "unsupported", str(exc), ran
        except Exception as exc:  # every other outcome is a failure of the backend under test
            return "fail", f"{type(exc).__name__}: {exc}", ran


def run_conformance(backend: str | None = None, ops: Iterable[str] | None = None, quick: bool = False,
                    progress: TextIO | None = None, **options) -> ConformanceReport:
    """Run every op's contract cases on one backend and return a structured report.

    backend:  a registered backend name (default "cpu"); it runs on its native device when present,
              else in emulation on CPU tensors. `options` are the backend's options (e.g. arch="sm100"),
              checked against what it declares.
    ops:      restrict to these op names (default: every op with cases)
    quick:    fewer, smaller cases (the CI size)
    progress: a stream (e.g. sys.stderr) to report each op as it runs
    """
    from ..core.registry import check_options
    name = backend or "cpu"
    device = _device_for(name)
    check_options(registry().backend(name), options, "run_conformance")
    selected = list(ops) if ops is not None else covered_ops()
    unknown = [op for op in selected if op not in _FACTORIES]
    if unknown:
        raise ValueError(f"no conformance cases for {unknown}; ops with cases: {covered_ops()}")
    provided = set(registry().ops(name))
    reports = {}
    for i, op in enumerate(selected, 1):
        start = time.perf_counter()
        passed, worst, failures, unsupported, ran_by = 0, 0.0, [], {}, Counter()
        cases = cases_for(op, quick)
        if progress is not None:
            print(f"[{i}/{len(selected)}] {op}: {len(cases)} cases ...", file=progress, flush=True)
        with use_backend(name, **options):
            for case in cases:
                status, value, ran = _run_case(case, device)
                if status == "pass":
                    passed += 1
                    worst = max(worst, value)
                    ran_by.update(p for o, b, p in ran if o == op and b == name)
                elif status == "unsupported":
                    unsupported[case.label] = value
                else:
                    failures.append(Failure(case.label, case.seed, value))
        reports[op] = OpReport(op, len(cases), passed, unsupported, tuple(failures), worst,
                               time.perf_counter() - start, dict(ran_by), op in provided)
    return ConformanceReport(name, str(device), reports, dict(options))
