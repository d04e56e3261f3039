"""The runner: every chosen case on every chosen backend, op and peer side by side, into one document.

Rule: one process, one thread count at a time (torch.set_num_threads, which the native providers
follow), inputs built outside the timed region inside the backend's use_backend block, and the
provider that ran recorded from dispatch.trace_providers. A backend that runs on CPU tensors only
in emulation is labelled so on every case: its times are not its chip's.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import sys
from typing import Any, Iterator, Sequence

import attrs
import torch

from ...core.dispatch import trace_providers
from ...core.errors import PortableKernelsError
from ...core.registry import available_backends, registry, run_device, use_backend
from .case import SIZES, Case
from .cases import FAMILIES, cases_of, per_backend
from .machine import load_average, machine, versions
from .progress import Mode, Progress
from .timing import paired_rounds, peak_memory_mib, synchronizer

#: the document format written by run_bench (bumped when a field changes meaning)
SCHEMA = "portable_kernels.tools.bench/1"


class BenchUsageError(ValueError):
    """A bad request to the bench (unknown backend or family, bad number): the CLI prints one line."""


@attrs.frozen
class Target:
    """Where cases run: a backend with its options on a device (backend None: a family that calls none)."""

    backend: str | None
    options: dict[str, Any]
    device: torch.device
    emulation: bool

    @property
    def label(self) -> str:
        name = self.backend or "-"
        if self.options:
            name += "[" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items())) + "]"
        return name + (" (emulated)" if self.emulation else "")


def parse_backend(spec: str) -> tuple[str, dict[str, str]]:
    """'nvidia' or 'nvidia:arch=sm100[,key=value...]' -> (name, options)."""
    name, _, rest = spec.partition(":")
    options = {}
    for pair in filter(None, rest.split(",")):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BenchUsageError(f"--backend takes NAME or NAME:KEY=VALUE[,KEY=VALUE], got {spec!r}")
        options[key] = value
    return name, options


def resolve_targets(specs: Sequence[str] | None = None) -> list[Target]:
    """The targets for --backend specs; none given: every backend available on a device present here
    (no emulation unless asked for by name)."""
    infos = available_backends()
    targets = []
    if not specs:
        for name, info in infos.items():
            device = run_device(info)
            if info.available and info.providers and device is not None and device.type in info.device_types:
                targets.append(Target(name, registry().backend(name).default_options(device), device, False))
        return sorted(targets, key=lambda t: (t.backend != "cpu", t.backend or ""))
    for spec in specs:
        name, options = parse_backend(spec)
        info = infos.get(name)
        if info is None:
            raise BenchUsageError(f"unknown backend {name!r}; known: {', '.join(sorted(infos))}")
        device = run_device(info)
        if device is None or not info.providers:
            raise BenchUsageError(f"backend {name!r} cannot run here: {info.reason or 'it has no providers'}")
        backend = registry().backend(name)
        options = {**backend.default_options(device), **options}
        with use_backend(name, **options):  # refuses options the backend does not declare
            pass
        targets.append(Target(name, options, device, device.type not in info.device_types))
    return targets


def resolve_families(names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise BenchUsageError(f"unknown family {unknown[0]!r}; known: {', '.join(FAMILIES)}")
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def _backend(target: Target) -> Iterator[None]:
    if target.backend is None:
        yield
    else:
        with use_backend(target.backend, **target.options):
            yield


def _plan(targets: list[Target], names: list[str], size: str,
          match: Sequence[str] | None = None) -> list[tuple[Target, Case]]:
    """(target, case) pairs in run order; families that call no backend run once per device; with
    `match`, only cases whose label contains one of its strings."""
    work = _all_work(targets, names, size)
    if match:
        work = [(t, c) for t, c in work if any(m in c.label for m in match)]
    return work


def _all_work(targets: list[Target], names: list[str], size: str) -> list[tuple[Target, Case]]:
    work: list[tuple[Target, Case]] = []
    devices_done: set[str] = set()
    for target in targets:
        for family in names:
            if per_backend(family):
                work += [(target, case) for case in cases_of(family, size)]
    for target in targets:
        if str(target.device) in devices_done:
            continue
        devices_done.add(str(target.device))
        device_target = Target(None, {}, target.device, False)
        for family in names:
            if not per_backend(family):
                work += [(device_target, case) for case in cases_of(family, size)]
    return work


def _judged(case: Case, target: Target) -> bool:
    """Whether the case's targets apply here: not on the tiny set, not in emulation, and only where
    they were set (a backend's name, or the device type for a family that calls no backend)."""
    where = target.backend or target.device.type
    return case.judged and not target.emulation and (case.target_on is None or where in case.target_on)


def _record(case: Case, target: Target, threads: int) -> dict[str, Any]:
    judged = _judged(case, target)
    return {
        "family": case.family, "case": case.name, "shape": case.shape, "op": case.op_label, "peer": case.peer_label,
        "backend": target.backend, "options": dict(target.options), "device": str(target.device),
        "emulation": target.emulation, "threads": threads,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "target": case.target if judged else None, "limit_us": case.limit_us if judged else None,
        "target_source": (case.target_source or None) if judged else None,
        "provider": None, "providers": [], "op_seconds": None, "peer_seconds": None, "ratio": None,
        "op_calls": None, "peer_calls": None, "met": None, "bytes_moved": None, "op_gbps": None, "peer_gbps": None,
        "peak_mib": None, "note": None, "skipped": None, "error": None,
    }


def _met(rec: dict[str, Any]) -> bool | None:
    checks = []
    if rec["target"] is not None:
        checks.append(rec["ratio"]["median"] >= rec["target"])
    if rec["limit_us"] is not None:
        checks.append(rec["op_seconds"]["median"] * 1e6 <= rec["limit_us"])
    return all(checks) if checks else None


def run_case(case: Case, target: Target, threads: int, rounds: int, min_seconds: float) -> dict[str, Any]:
    """Build, warm, trace and time one case on one target; a case the backend cannot run is recorded
    as skipped with the reason, any other failure as an error (the run goes on)."""
    rec = _record(case, target, threads)
    if case.devices is not None and target.device.type not in case.devices:
        rec["skipped"] = f"the case runs on {', '.join(case.devices)} only"
        return rec
    sync = synchronizer(target.device)
    try:
        with _backend(target):
            inputs = case.build(target.device)
            with trace_providers() as ran:
                case.op(inputs)
            sync()
            op, peer = (lambda: case.op(inputs)), (lambda: case.peer(inputs))
            peer()
            timed = paired_rounds(op, peer, sync, rounds, min_seconds)
            if case.memory:
                rec["peak_mib"] = {"op": peak_memory_mib(op, target.device),
                                   "peer": peak_memory_mib(peer, target.device)}
    except PortableKernelsError as exc:
        rec["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return rec
    except Exception as exc:  # a benchmark goes on past one broken case, and says which
        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return rec
    names = sorted({p for _, _, p in ran})
    rec["providers"] = sorted({f"{op_name}/{backend}/{p}" for op_name, backend, p in ran})
    rec["provider"] = ",".join(names) if names else (inputs.get("provider") if isinstance(inputs, dict) else None)
    rec.update(op_seconds=timed.op.to_json(), peer_seconds=timed.peer.to_json(), ratio=timed.ratio.to_json(),
               op_calls=timed.op_calls, peer_calls=timed.peer_calls)
    extra = inputs if isinstance(inputs, dict) else {}
    rec["note"] = extra.get("note")
    moved = extra.get("bytes_moved")
    if moved:
        rec.update(bytes_moved=moved, op_gbps=moved / timed.op.median / 1e9, peer_gbps=moved / timed.peer.median / 1e9)
    rec["met"] = _met(rec)
    return rec


def _summary_of(rec: dict[str, Any]) -> str:
    if rec["skipped"]:
        return "skipped"
    if rec["error"]:
        return "ERROR"
    return f"ratio {rec['ratio']['median']:.2f}"


def run_bench(backends: Sequence[str] | None = None, families: Sequence[str] | None = None, size: str = "quick",
              rounds: int = 5, threads: Sequence[int] | None = None, min_seconds: float = 0.02,
              progress: Mode = "auto", command: str | None = None,
              match: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the cases and return the document `report.write_json` writes.

    backends: specs 'NAME' or 'NAME:KEY=VALUE,...' (None: every backend available natively here);
    families: family names (None: all); size: "tiny", "quick" or "full"; rounds: paired rounds per
    case; threads: torch thread counts to run at (None: the current one); min_seconds: the shortest
    timed batch; progress: "auto" (tqdm if installed), "tqdm", "plain" or "none"; match: only cases
    whose label ("name shape") contains one of these strings.
    """
    if size not in SIZES:
        raise BenchUsageError(f"unknown case set {size!r}; known: {', '.join(SIZES)}")
    if rounds < 1:
        raise BenchUsageError(f"--rounds must be >= 1, got {rounds}")
    if min_seconds <= 0:
        raise BenchUsageError(f"min_seconds must be > 0, got {min_seconds}")
    original_threads = torch.get_num_threads()
    thread_counts = list(threads) if threads else [original_threads]
    if any(t < 1 for t in thread_counts):
        raise BenchUsageError(f"--threads must be positive ints, got {thread_counts}")
    targets = resolve_targets(backends)
    if not targets:
        raise BenchUsageError("no backend can run here")
    names = resolve_families(families)
    work = _plan(targets, names, size, match)
    if not work:
        raise BenchUsageError(f"no case of the {size} set matches {list(match or [])} in families {names}")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command or " ".join(sys.argv),
        "machine": machine(),
        "versions": versions(),
        "settings": {"size": size, "rounds": rounds, "min_seconds": min_seconds, "threads": thread_counts,
                     "families": names, "match": list(match) if match else None,
                     "targets": [{"backend": t.backend, "options": t.options, "device": str(t.device),
                                  "emulation": t.emulation} for t in targets]},
        "cases": [],
    }
    bar = Progress(len(work) * len(thread_counts), progress)
    try:
        for count in thread_counts:
            torch.set_num_threads(count)
            for target, case in work:
                bar.start(f"{target.label} {count}t {case.label}")
                rec = run_case(case, target, count, rounds, min_seconds)
                doc["cases"].append(rec)
                bar.done(_summary_of(rec))
                gc.collect()
    finally:
        bar.close()
        torch.set_num_threads(original_threads)
    doc["machine"]["load_average_end"] = load_average()
    doc["summary"] = summarize(doc["cases"])
    return doc


def summarize(records: list[dict[str, Any]]) -> dict[str, int]:
    measured = [r for r in records if not r["skipped"] and not r["error"]]
    return {
        "cases": len(records),
        "measured": len(measured),
        "skipped": sum(1 for r in records if r["skipped"]),
        "errors": sum(1 for r in records if r["error"]),
        "with_target": sum(1 for r in measured if r["met"] is not None),
        "met": sum(1 for r in measured if r["met"] is True),
        "missed": sum(1 for r in measured if r["met"] is False),
        "emulated": sum(1 for r in measured if r["emulation"]),
    }
