"""`python -m portable_kernels demo`: one DeepSeek-sized FP8 FFN GEMM on every runnable backend.

It asks the registry which backends can run here (natively, or in emulation on CPU tensors) and
which layout variants each offers, so a new backend shows up without editing this file.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import attrs
import torch

from .errors import LayoutError, NoKernelError
from .gemm import fp8_gemm_nt
from .numerics import calc_diff
from .prepare import prepare_inputs
from .quantization import dequantize, per_block_cast_to_fp8, per_token_cast_to_fp8
from .registry import available_backends, registry, run_device, use_backend

#: DeepSeek-V3 routed-expert gate projection: hidden 7168 -> intermediate 2048, one batch of tokens.
DEMO_SHAPE = {"m": 128, "n": 2048, "k": 7168}


@attrs.frozen
class DemoRow:
    backend: str
    device: str
    layout: str
    diff_dequantized: float
    diff_unquantized: float
    seconds: float
    note: str = ""


def runnable_targets() -> list[tuple[str, torch.device, dict[str, Any]]]:
    """(backend, device, layout options) for every backend that can run here, one per variant."""
    targets = []
    for name, info in available_backends().items():
        if not info.providers:
            continue
        device = run_device(info)
        if device is None:
            continue
        for options in registry().backend(name).variants():
            targets.append((name, device, options))
    return targets


def _time(fn, repeats: int = 3) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run_demo(m: int = DEMO_SHAPE["m"], n: int = DEMO_SHAPE["n"], k: int = DEMO_SHAPE["k"],
             seed: int = 0) -> list[DemoRow]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, dtype=torch.float32) * k ** -0.5).to(torch.bfloat16)
    # Power-of-two scales, so every backend's layout (UE8M0 ones included) carries them exactly.
    weight = per_block_cast_to_fp8(w, use_ue8m0=True)
    exact = x.double() @ w.double().T
    rows = []
    for name, device, options in runnable_targets():
        where = str(device) if device.type in registry().backend(name).device_types else f"{device} (emulation)"
        try:
            with use_backend(name, **options):
                prepared = prepare_inputs(fp8_gemm_nt, device=device, b=weight)["b"]
                act = per_token_cast_to_fp8(x.to(device), use_ue8m0=True, prepare_for=fp8_gemm_nt)
                reference = dequantize(act).double().cpu() @ dequantize(prepared).double().cpu().T
                d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
                seconds = _time(lambda: fp8_gemm_nt(act, prepared, d))
        except (NoKernelError, LayoutError) as exc:  # a backend without these ops (a partial plugin) is reported
            first = str(exc).splitlines()[0]
            rows.append(DemoRow(name, where, "-", math.nan, math.nan, math.nan, f"skipped: {first}"))
            continue
        out = d.double().cpu()
        rows.append(DemoRow(name, where, _layout_name(prepared.tag),
                            calc_diff(out, reference), calc_diff(out, exact), seconds))
    return rows


def _layout_name(tag) -> str:
    arch = tag.param("arch")
    return f"{tag.format}" + (f" [{arch}]" if arch else "")


#: calc_diff bound the demo calls a pass: the GEMM against its dequantized operands (bf16 output)
PASS_BOUND = 1e-5


def format_verdicts(rows: list[DemoRow]) -> str:
    """One line per backend row: pass/fail against the contract, or why it was skipped."""
    lines = []
    for r in rows:
        label = f"{r.backend}{' ' + r.layout if r.layout != '-' else ''}"
        if r.note:
            lines.append(f"  {label}: not run ({r.note.removeprefix('skipped: ')})")
        elif r.diff_dequantized <= PASS_BOUND:
            lines.append(f"  {label}: PASS (diff vs dequantized {r.diff_dequantized:.1e} <= {PASS_BOUND:.0e})")
        else:
            lines.append(f"  {label}: FAIL (diff vs dequantized {r.diff_dequantized:.1e} > {PASS_BOUND:.0e})")
    return "verdict:\n" + "\n".join(lines)


def format_legend() -> str:
    return ("legend: diff = calc_diff = 1 - 2·Σxy/Σ(x²+y²) in float64 (0 = identical); 'vs dequant' compares with "
            "the product of the dequantized operands (the kernel's own error), 'vs exact' with the unquantized "
            "product (the error of FP8 itself). time = median of 3 runs; 'emulated' = a backend run on CPU tensors "
            "from its own bytes through its layout-reference oracle (a correctness check, not that chip's speed).")


def format_table(rows: list[DemoRow]) -> str:
    header = ("backend", "device", "weight scale layout", "diff vs dequant", "diff vs exact", "time")
    body = [(r.backend, r.device, r.layout, r.note) if r.note else
            (r.backend, r.device, r.layout, f"{r.diff_dequantized:.2e}", f"{r.diff_unquantized:.2e}",
             f"{r.seconds * 1e3:.1f} ms" + (" (emulated)" if "emulation" in r.device else "")) for r in rows]
    widths = [max(len(str(row[i])) for row in [header, *body] if len(row) == len(header) or i < 3)
              for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
