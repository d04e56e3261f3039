"""Bytes and FLOPs per call of a few device-check shapes per kernel family, against the H200
(sm90) and B200 (sm100) peaks: the lower bound on a call's time, max(bytes / HBM bandwidth,
FLOPs / tensor-core peak), and which of the two binds.

Bytes are the compulsory traffic (every operand read once, every output written once); a kernel
that reads more (top-k's histogram passes, a GEMM's re-reads past L2) is slower than its bound.
Peaks are dense (no sparsity) datasheet figures; see docs/nvidia.md for the sources.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

Precision = Literal["bf16", "fp8", "none"]


@attrs.frozen
class Peak:
    """One GPU's datasheet peaks (dense tensor-core FLOP/s, HBM bytes/s)."""

    gpu: str
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float

    def flops(self, precision: Precision) -> float:
        return {"bf16": self.bf16_flops, "fp8": self.fp8_flops, "none": math.inf}[precision]


#: NVIDIA H200 SXM datasheet: 4.8 TB/s HBM3e; 1,979 TFLOPS bf16 and 3,958 fp8 *with sparsity*, halved
H200 = Peak("H200 SXM", 4.8e12, 989e12, 1979e12)
#: NVIDIA HGX B200 datasheet (per GPU): 8 TB/s HBM3e; 4.5 PFLOPS bf16 and 9 fp8 *with sparsity*, halved
B200 = Peak("B200", 8.0e12, 2250e12, 4500e12)
PEAKS = {"sm90": H200, "sm100": B200}


@attrs.frozen
class Problem:
    """One call: its family, a readable shape and the bytes / FLOPs it must move and compute."""

    family: str
    shape: str
    bytes: int
    flops: int
    precision: Precision


@attrs.frozen
class Bound:
    problem: Problem
    peak: Peak
    memory_s: float
    compute_s: float

    @property
    def time_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.problem.flops / self.problem.bytes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _fp8_gemm(m: int, n: int, k: int) -> Problem:
    scales = 4 * (m * _cdiv(k, 128) + _cdiv(n, 128) * _cdiv(k, 128))
    return Problem("fp8_gemm", f"M={m} N={n} K={k}", m * k + n * k + scales + 2 * m * n, 2 * m * n * k, "fp8")


def _bf16_gemm(m: int, n: int, k: int) -> Problem:
    return Problem("bf16_gemm", f"M={m} N={n} K={k}", 2 * (m * k + n * k + m * n), 2 * m * n * k, "bf16")


def _fp8_fp4_gemm(m: int, n: int, k: int) -> Problem:
    # the kernel widens E2M1 to e4m3 in registers: fp8 tensor-core rate
    scales = 4 * m * _cdiv(k, 128) + n * _cdiv(k, 32)
    return Problem("fp8_fp4_gemm", f"M={m} N={n} K={k}", m * k + n * k // 2 + scales + 2 * m * n, 2 * m * n * k, "fp8")


def _grouped_contiguous(g: int, m: int, n: int, k: int) -> Problem:
    rows = g * m
    scales = 4 * (rows * _cdiv(k, 128) + g * _cdiv(n, 128) * _cdiv(k, 128))
    return Problem("grouped_contiguous", f"fp8 G={g} m={m} N={n} K={k}",
                   rows * k + g * n * k + scales + 2 * rows * n + 4 * rows, 2 * rows * n * k, "fp8")


def _grouped_masked(g: int, m: int, n: int, k: int) -> Problem:
    rows = g * m
    return Problem("grouped_masked", f"bf16 G={g} m={m} N={n} K={k}", 2 * (rows * k + g * n * k + rows * n),
                   2 * rows * n * k, "bf16")


def _mla(b: int, s_k: int, fp8: bool, topk: int | None) -> Problem:
    h, d_qk, d_v = 128, 576, 512
    keys = topk or s_k
    cache = b * keys * (656 if fp8 else 2 * d_qk) + (4 * b * topk if topk else 4 * b * _cdiv(s_k, 64))
    kind = f"{'fp8' if fp8 else 'bf16'} cache" + (f", sparse top-{topk}" if topk else "")
    return Problem("mla_decode", f"b={b} s_k={s_k} h_q={h} {kind}", cache + 2 * b * h * (d_qk + d_v) + 4 * b * h,
                   2 * b * h * keys * (d_qk + d_v), "bf16")


def _topk(rows: int, cols: int, k: int) -> Problem:
    return Problem("topk", f"fp32 {rows}x{cols} k={k}", 4 * rows * cols + 4 * rows * k, 0, "none")


def _cast_fp8(t: int, h: int) -> Problem:
    return Problem("cast_fp8", f"bf16 {t}x{h} -> e4m3 1x128", 2 * t * h + t * h + 4 * t * _cdiv(h, 128), 0, "none")


def _cast_fp4(t: int, h: int) -> Problem:
    return Problem("cast_fp4", f"bf16 {t}x{h} -> e2m1 1x32", 2 * t * h + t * h // 2 + t * _cdiv(h, 32), 0, "none")


def _moe_gate(t: int, experts: int) -> Problem:
    return Problem("moe_gate", f"T={t} experts={experts} top-8", 4 * t * experts + 4 * experts + t * 8 * 12, 0, "none")


def _moe_expand(t: int, h: int) -> Problem:
    row = h + 4 * _cdiv(h, 128)
    return Problem("moe_expand", f"fp8 T={t} H={h} top-8", t * row + 8 * t * row + 4 * 8 * t, 0, "none")


def _moe_reduce(t: int, h: int) -> Problem:
    return Problem("moe_reduce", f"bf16 T={t} H={h} top-8", 8 * t * h * 2 + 4 * 8 * t + 2 * t * h, 0, "none")


def _mqa_logits(s_q: int, s_k: int, h: int, d: int) -> Problem:
    return Problem("mqa_logits", f"s_q={s_q} s_k={s_k} h={h} d={d} fp32 logits",
                   s_q * h * d + s_k * (d + 4) + 4 * s_q * h + 4 * s_q * s_k, 2 * s_q * s_k * h * d, "fp8")


def _paged_mqa_logits(b: int, ctx: int, h: int, d: int) -> Problem:
    return Problem("paged_mqa_logits", f"b={b} next_n=1 ctx={ctx} h={h} d={d}",
                   b * ctx * (d + 4) + b * h * d + 4 * b * h + 4 * b * ctx + 4 * b * _cdiv(ctx, 64),
                   2 * b * ctx * h * d, "fp8")


#: shapes from benchmarks/device_check_nvidia.py (DeepSeek-V3 sizes), a few per family
PROBLEMS = (
    _fp8_gemm(64, 2112, 7168), _fp8_gemm(4096, 7168, 2048), _fp8_gemm(4096, 24576, 1536),
    _bf16_gemm(64, 2112, 7168), _bf16_gemm(4096, 4096, 7168),
    _fp8_fp4_gemm(4096, 7168, 2048),
    _grouped_contiguous(4, 8192, 4096, 7168), _grouped_masked(4, 256, 4096, 7168),
    _mla(64, 8192, False, None), _mla(64, 8192, True, None), _mla(64, 8192, True, 2048),
    _topk(64, 32768, 2048), _topk(128, 131072, 2048),
    _cast_fp8(4096, 7168), _cast_fp4(4096, 7168),
    _moe_gate(4096, 256), _moe_expand(4096, 7168), _moe_reduce(4096, 7168),
    _mqa_logits(4096, 4096, 64, 128), _paged_mqa_logits(64, 8192, 64, 128),
)


def bounds(arch: str) -> list[Bound]:
    """The roofline bound of every PROBLEMS entry on `arch`'s GPU."""
    peak = PEAKS[arch]
    return [Bound(p, peak, p.bytes / peak.hbm_bytes_per_s, p.flops / peak.flops(p.precision)) for p in PROBLEMS]


def format_bounds(arch: str) -> str:
    """A markdown table of `bounds(arch)`."""
    peak = PEAKS[arch]
    lines = [f"roofline on {peak.gpu}: {peak.hbm_bytes_per_s / 1e12:g} TB/s, dense {peak.bf16_flops / 1e12:g} bf16 / "
             f"{peak.fp8_flops / 1e12:g} fp8 TFLOPS",
             "| family | shape | MB | GFLOP | FLOP/B | bound | lower bound us |", "|---|---|---|---|---|---|---|"]
    for b in bounds(arch):
        p = b.problem
        lines.append(f"| {p.family} | {p.shape} | {p.bytes / 1e6:.1f} | {p.flops / 1e9:.1f} | {b.intensity:.0f} "
                     f"| {b.bound}{'' if p.precision == 'none' else ' (' + p.precision + ')'} | {b.time_s * 1e6:.1f} |")
    return "\n".join(lines)
