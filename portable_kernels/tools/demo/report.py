"""The demo's printout: one table row per backend variant, the providers each ran, a verdict line
each, and a legend."""

from __future__ import annotations

from .model import MlaShape, MoeShape
from .run import MLA_BOUND, MOE_BOUND, BackendRun


def _ms(seconds: float, emulated: bool) -> str:
    return f"{seconds * 1e3:.1f} ms" + (" (emulated)" if emulated else "")


def format_header(moe: MoeShape, mla: MlaShape) -> str:
    return (f"MoE layer: T={moe.tokens} H={moe.hidden} I={moe.intermediate} E={moe.experts} ({moe.groups} groups, "
            f"keep {moe.topk_groups}, top-{moe.topk}); FP8 expert weights prepared once per backend\n"
            f"MLA decode: b={mla.batch} h={mla.heads} s_k<={mla.seqlen}, bf16 paged cache (block {mla.block_size})")


def format_table(runs: list[BackendRun]) -> str:
    header = ("backend", "device", "weight format", "weight bytes", "conversions", "MoE diff", "MLA diff",
              "MoE time", "MLA time")
    rows = []
    for r in runs:
        device = r.device + (" (emulation)" if r.emulated else "")
        if r.skipped:
            rows.append((r.label, device, "-", "-", "-", "-", "-", "-", "-"))
            continue
        rows.append((r.label, device, r.weight_format, f"{r.weight_bytes / 2**20:.2f} MiB", str(r.conversions),
                     f"{r.moe_diff:.1e}", f"{r.mla_diff:.1e}", _ms(r.moe_seconds, r.emulated),
                     _ms(r.mla_seconds, r.emulated)))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_providers(runs: list[BackendRun]) -> str:
    lines = ["providers that ran:"]
    for r in runs:
        if r.skipped:
            continue
        ran = ", ".join(f"{op}: {'/'.join(p)}" for op, p in sorted(r.providers.items()))
        lines.append(f"  {r.label}: {ran}")
    return "\n".join(lines)


def format_verdicts(runs: list[BackendRun]) -> str:
    lines = ["verdict:"]
    for r in runs:
        if r.skipped:
            lines.append(f"  {r.label}: not run ({r.skipped})")
        elif r.passed and r.conversions == 0:
            lines.append(f"  {r.label}: PASS — same results as cpu (MoE {r.moe_diff:.1e} <= {MOE_BOUND:.0e}, MLA "
                         f"{r.mla_diff:.1e} <= {MLA_BOUND:.0e}), nothing converted on the hot path")
        else:
            why = [] if r.passed else [f"diff MoE {r.moe_diff:.1e} / MLA {r.mla_diff:.1e}"]
            why += [f"{r.conversions} implicit conversions"] if r.conversions else []
            lines.append(f"  {r.label}: FAIL ({'; '.join(why)})")
    return "\n".join(lines)


def format_legend() -> str:
    return ("legend: diff = calc_diff = 1 - 2·Σxy/Σ(x²+y²) in float64 against the cpu backend's outputs (0 = "
            "identical); weight bytes = data + scales of w13 and w2 in that backend's Format; conversions = implicit "
            "conversions on the hot path (0: weights prepared once, activations quantized into the consumer's "
            "format); time = median of the runs; 'emulated' = a backend run on CPU tensors from its own bytes (its "
            "providers' CPU path or its layout-reference oracle): a correctness check, not that chip's speed.")
