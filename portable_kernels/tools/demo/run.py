"""Run the demo's model code on every backend that can run here, natively or in emulation.

Per backend (and option variant): the weights are prepared once, the MoE layer and the MLA step
run from the same code, and the run records which provider ran each op, the bytes each weight
Format stores, the implicit conversions (0 when everything was prepared), the largest calc_diff
against the cpu backend's outputs and the median time. A backend that lacks an op (a partial
plugin) is reported with the reason, not run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import attrs
import torch

from ...core.conversions import count_implicit_conversions
from ...core.dispatch import trace_providers
from ...core.errors import LayoutError, NoKernelError
from ...core.numerics import calc_diff
from ...core.registry import available_backends, registry, run_device, use_backend
from .model import (MlaShape, MoeShape, PreparedMoe, make_mla_inputs, make_weights, mla_step, moe_forward,
                    prepare_weights)

#: calc_diff against the cpu backend's outputs that the demo calls a pass (the MoE layer's outputs
#: pass through two FP8 casts, where a kernel's last-bit difference can flip a code)
MOE_BOUND = 1e-3
MLA_BOUND = 1e-5


@attrs.frozen
class BackendRun:
    backend: str
    options: dict[str, Any]
    device: str
    emulated: bool
    providers: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    weight_format: str = ""
    weight_bytes: int = 0
    prepare_seconds: float = 0.0
    conversions: int = 0
    moe_diff: float = float("nan")
    mla_diff: float = float("nan")
    moe_seconds: float = float("nan")
    mla_seconds: float = float("nan")
    skipped: str = ""

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return self.backend + (f"[{opts}]" if opts else "")

    @property
    def passed(self) -> bool:
        return not self.skipped and self.moe_diff <= MOE_BOUND and self.mla_diff <= MLA_BOUND


def runnable_targets() -> list[tuple[str, torch.device, dict[str, Any]]]:
    """(backend, device, options) for every backend that can run here, one per option variant."""
    targets = []
    for name, info in available_backends().items():
        if not info.providers:
            continue
        device = run_device(info)
        if device is None:
            continue
        for options in registry().backend(name).variants():
            targets.append((name, device, options))
    return sorted(targets, key=lambda t: (t[0] != "cpu", t[0]))


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _weight_bytes(w: PreparedMoe) -> int:
    return sum(t.data.nbytes + (0 if t.scale is None else t.scale.nbytes) for t in (w.w13, w.w2))


def run_backend(name: str, device: torch.device, options: dict[str, Any], x: torch.Tensor, weights: Any,
                moe: MoeShape, mla_inputs: Any, repeats: int) -> tuple[BackendRun, tuple[torch.Tensor, ...] | None]:
    """One backend variant: prepare once, run both steps, time them; returns the run and its outputs."""
    emulated = device.type not in registry().backend(name).device_types
    base = dict(backend=name, options=dict(options), device=str(device), emulated=emulated)
    try:
        with use_backend(name, **options):
            start = time.perf_counter()
            prepared = prepare_weights(weights, device)
            prepare_seconds = time.perf_counter() - start
            xd = x.to(device)
            with trace_providers() as ran, count_implicit_conversions() as conversions:
                out = moe_forward(xd, prepared, moe).cpu()
                mla_out, mla_lse = mla_step(mla_inputs, device)
            moe_seconds = _median_seconds(lambda: moe_forward(xd, prepared, moe), repeats)
            mla_seconds = _median_seconds(lambda: mla_step(mla_inputs, device), repeats)
    except (NoKernelError, LayoutError) as exc:
        return BackendRun(**base, skipped=str(exc).splitlines()[0]), None
    providers: dict[str, set[str]] = {}
    for op, _, provider in ran:
        providers.setdefault(op, set()).add(provider)
    run = BackendRun(**base, providers={op: tuple(sorted(p)) for op, p in providers.items()},
                     weight_format=prepared.w13.format.name, weight_bytes=_weight_bytes(prepared),
                     prepare_seconds=prepare_seconds, conversions=conversions.count, moe_seconds=moe_seconds,
                     mla_seconds=mla_seconds)
    return run, (out, mla_out.cpu(), mla_lse.cpu())


def run_demo(moe: MoeShape = MoeShape(), mla: MlaShape = MlaShape(), repeats: int = 3,
             seed: int = 0) -> list[BackendRun]:
    """Run the MoE layer and the MLA step on every runnable backend; diffs are against cpu's outputs."""
    weights = make_weights(moe, seed)
    x = torch.randn(moe.tokens, moe.hidden, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    mla_inputs = make_mla_inputs(mla, seed + 2)
    runs, reference = [], None
    for name, device, options in runnable_targets():
        run, outputs = run_backend(name, device, options, x, weights, moe, mla_inputs, repeats)
        if outputs is not None:
            if reference is None:  # the first target is cpu (runnable_targets sorts it first)
                reference = outputs
            run = attrs.evolve(run, moe_diff=calc_diff(outputs[0].float(), reference[0].float()),
                               mla_diff=max(calc_diff(outputs[1].float(), reference[1].float()),
                                            calc_diff(outputs[2], reference[2])))
        runs.append(run)
    return runs
