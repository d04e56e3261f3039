"""Device check of the nvidia backend on one GPU: builds, checks and times everything in one call,
sized to finish in under 8 minutes on an H200, and prints ratios side by side, last a summary
against the issue's targets. Every printed line also goes to docs/device-runs/<date>-nvidia-<gpu>.log.

Run on a GPU machine (repository root, after `pip install --no-deps --no-build-isolation -e .` and
`pip install triton`):
    python benchmarks/device_check_nvidia.py            # full conformance, then timings
    python benchmarks/device_check_nvidia.py --quick    # quick conformance (saves ~1-2 min)
    TRITON_INTERPRET=1 python benchmarks/device_check_nvidia.py --dry-run   # CPU plumbing check
Sections (each prints its wall time; timings are skipped, with a note, once the budget runs out):
1. environment: GPU, driver, torch/CUDA/triton versions, vendor packages present;
2. build: the CUDA C++ layout encoders (deepjit, nvcc) for sm_90a and sm_100a, loaded and checked
   byte for byte against the torch layouts on this GPU;
3. checks: conformance of every op on cuda tensors (the "providers" column says which provider ran
   each case), GPU-encoded layouts identical to CPU-encoded ones;
4. timings, each provider of the nvidia backend called directly on the same inputs, median of
   rounds (min-max spread), against the peer a user would otherwise run, in this process:
   fp8_gemm_nt vs torch._scaled_mm blockwise and DeepGEMM's published H800 TFLOPS; bf16 vs
   torch.matmul; grouped vs torch._grouped_mm; MLA decode, casts, routing as % of measured copy
   bandwidth; topk vs torch.topk; varlen attention vs torch SDPA; CUDA encoders vs torch layouts;
5. summary against the issue's targets (PASS/MISS per target, with the measured figure).
Exit status 1 if a check failed, 0 otherwise (a missed speed target is reported, not an error).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import portable_kernels as pk
from portable_kernels.core.registry import registry

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 450  # 7.5 min: timings stop early (with a note) past this
LOG_LINES: list[str] = []
START = time.perf_counter()

#: DeepGEMM README (commit 327ec92, 2025-04-09), H800, FP8 1x128 x 128x128: (M, N, K) -> TFLOPS
DEEPGEMM_H800_DENSE = {
    (64, 2112, 7168): 206, (64, 24576, 1536): 289, (64, 32768, 512): 219, (64, 7168, 16384): 336,
    (64, 4096, 7168): 287, (64, 7168, 2048): 295, (128, 2112, 7168): 352, (128, 24576, 1536): 535,
    (128, 32768, 512): 358, (128, 7168, 16384): 645, (128, 4096, 7168): 533, (128, 7168, 2048): 510,
    (4096, 2112, 7168): 1127, (4096, 24576, 1536): 1212, (4096, 32768, 512): 775, (4096, 7168, 16384): 1520,
    (4096, 4096, 7168): 1410, (4096, 7168, 2048): 1168,
}
#: same source: contiguous grouped (G, M per group, N, K) and masked (G, M per group, N, K) -> TFLOPS
DEEPGEMM_H800_CONTIGUOUS = {(4, 8192, 4096, 7168): 1346, (4, 8192, 7168, 2048): 1214, (8, 4096, 4096, 7168): 1346,
                            (8, 4096, 7168, 2048): 1214}
DEEPGEMM_H800_MASKED = {(1, 1024, 4096, 7168): 1233, (1, 1024, 7168, 2048): 925, (2, 512, 4096, 7168): 1040,
                        (2, 512, 7168, 2048): 916, (4, 256, 4096, 7168): 932}
#: FlashMLA's README figure for its decode on H800 (memory-bound configuration)
FLASHMLA_H800_GBS = 3000

TARGETS: list[tuple[str, str, float | None, bool | None]] = []  # (target, measured, value, passed)


def say(line: str = "") -> None:
    print(line, flush=True)
    LOG_LINES.append(line)


def elapsed() -> float:
    return time.perf_counter() - START


def over_budget() -> bool:
    return elapsed() > BUDGET_SECONDS


# -- timing --------------------------------------------------------------------------------------------


class Timer:
    """Median and spread of `rounds` rounds, each long enough to average launch noise."""

    def __init__(self, device: torch.device, rounds: int = 5, round_seconds: float = 0.02):
        self.device, self.rounds, self.round_seconds = device, rounds, round_seconds

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _round(self, fn: Callable[[], Any], iters: int) -> float:
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) / iters
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, float, float]:
        """(median, min, max) seconds per call."""
        fn()
        self._sync()
        probe = self._round(fn, 1)
        iters = max(1, min(200, int(self.round_seconds / max(probe, 1e-7))))
        samples = [self._round(fn, iters) for _ in range(self.rounds)]
        return statistics.median(samples), min(samples), max(samples)


def fmt_time(t: tuple[float, float, float]) -> str:
    med, lo, hi = t
    return f"{med * 1e6:9.1f} us [{lo * 1e6:.1f}-{hi * 1e6:.1f}]"


def provider(op: str, name: str):
    for p in registry().providers(op, "nvidia"):
        if p.name == name:
            return p
    return None


def run_provider(op: str, name: str, inputs: Any) -> tuple[Callable[[], Any] | None, str]:
    """(callable running provider `name` of `op` on `inputs`, or None; the reason it declined)."""
    p = provider(op, name)
    if p is None:
        return None, "not registered"
    reasons = p.not_supported_reasons(inputs)
    if reasons:
        return None, "; ".join(reasons)[:110]
    return (lambda: p.fn(inputs)), ""


def target(text: str, measured: str, value: float | None, goal: float | None, higher_is_better: bool = True) -> None:
    passed = None if value is None or goal is None else (value >= goal if higher_is_better else value <= goal)
    TARGETS.append((text, measured, value, passed))


# -- 1. environment ---------------------------------------------------------------------------------------


def environment(device: torch.device) -> None:
    say(f"date {datetime.datetime.now().isoformat(timespec='seconds')}  host {platform.node()}  "
        f"python {platform.python_version()}")
    say(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        import triton
        from portable_kernels.backends.nvidia.kernels import runtime
        say(f"triton {triton.__version__}, mode {runtime.current_mode()}, autotune {runtime.autotune_enabled()}")
    except Exception as exc:
        say(f"triton unavailable: {exc}")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        say(f"GPU {props.name}, capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
            f"{props.total_memory / 2**30:.0f} GiB")
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
            say(f"driver {driver}")
        except Exception as exc:
            say(f"driver: nvidia-smi failed ({exc})")
    for package in ("deep_gemm", "flash_mla", "deep_select"):
        try:
            module = importlib.import_module(package)
            say(f"{package}: importable ({getattr(module, '__version__', 'version unknown')})")
        except Exception as exc:
            say(f"{package}: not importable ({type(exc).__name__})")
    info = pk.available_backends()["nvidia"]
    say(f"nvidia backend: available={info.available} reason={info.reason}")


# -- 2. build ------------------------------------------------------------------------------------------------


def build_cuda_encoders(device: torch.device) -> list[str]:
    from portable_kernels.backends.nvidia import cuda as encoders
    from portable_kernels.layouts import ceil_to_ue8m0, sm100_ue8m0_encode_from_blocks, sm90_sfa_encode
    problems = []
    for arch in ("sm90", "sm100"):
        t0 = time.perf_counter()
        try:
            artifact = encoders.build(arch)
            say(f"deepjit cuda build {arch}: {artifact.origin} in {time.perf_counter() - t0:.1f} s -> {artifact.path}")
        except Exception as exc:
            problems.append(f"CUDA encoders did not build for {arch}: {exc}")
            say(problems[-1])
    if device.type != "cuda":
        return problems
    g = torch.Generator().manual_seed(0)
    try:
        for mn, kb in ((3, 4), (4096, 56), (7168, 16)):
            sf = torch.rand(mn, kb, generator=g) + 0.01
            got = encoders.sm90_sfa_encode(sf.to(device))
            if got.stride() != sm90_sfa_encode(sf).stride() or not torch.equal(got.cpu(), sm90_sfa_encode(sf)):
                problems.append(f"CUDA sm90 encoder differs from the layout for {mn}x{kb}")
            blocks = ceil_to_ue8m0(torch.rand(-(-mn // 128), kb, generator=g) + 0.01)
            if not torch.equal(encoders.sm100_pack(blocks.to(device), mn, 128).cpu(),
                               sm100_ue8m0_encode_from_blocks(blocks, mn, 128)):
                problems.append(f"CUDA sm100 packer differs from the layout for {mn}x{kb}")
        say(f"CUDA encoders loaded through deepjit and byte-identical to the layouts: {not problems}")
    except Exception as exc:
        problems.append(f"CUDA encoders failed on the GPU: {type(exc).__name__}: {exc}")
        say(problems[-1])
    return problems


# -- 3. checks -----------------------------------------------------------------------------------------------


def conformance(quick: bool) -> list[str]:
    from portable_kernels.backends.nvidia.kernels import runtime
    from portable_kernels.testing import run_conformance
    runtime.set_autotune(False)  # correctness needs no tuning; one config per call compiles far less
    previous = os.environ.get("PK_CHECK_VALUES")
    os.environ["PK_CHECK_VALUES"] = "1"  # run the providers' value checks (NaN, cache references) on cuda too
    t0 = time.perf_counter()
    try:
        report = run_conformance(backend="nvidia", quick=quick)
    finally:
        runtime.set_autotune(None)
        if previous is None:
            os.environ.pop("PK_CHECK_VALUES", None)
        else:
            os.environ["PK_CHECK_VALUES"] = previous
    for line in report.format_table().splitlines():
        say(line)
    cases = sum(r.cases for r in report.ops.values())
    passed = sum(r.passed for r in report.ops.values())
    say(f"conformance: {passed}/{cases} cases passed in {time.perf_counter() - t0:.1f} s")
    return [] if report.ok else ["conformance failures on nvidia/cuda"]


def same_bytes_as_cpu(device: torch.device) -> list[str]:
    problems = []
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 1000, generator=gen), torch.randn(260, 1000, generator=gen) / 30
    a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_block_cast_to_fp8(w, use_ue8m0=True)
    for arch in ("sm90", "sm100"):
        on_cpu = pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia", arch=arch, a=a, b=b)
        with pk.use_backend("nvidia", arch=arch):
            on_dev = pk.prepare_inputs(pk.fp8_gemm_nt, device=device, a=a, b=b)
            for arg in ("a", "b"):
                if on_cpu[arg].scale.stride() != on_dev[arg].scale.stride() or \
                        not torch.equal(on_cpu[arg].scale, on_dev[arg].scale.cpu()):
                    problems.append(f"{arch} {arg}: GPU-encoded scales differ from CPU-encoded ones")
            d = torch.empty(96, 260, device=device)
            pk.fp8_gemm_nt(on_dev["a"], on_dev["b"], d)
        ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
        diff = pk.calc_diff(d.cpu(), ref)
        say(f"fp8_gemm_nt {arch} on {device}: calc_diff vs the dequantized reference {diff:.2e}")
        if diff > 1e-6:
            problems.append(f"{arch}: result off the reference (calc_diff {diff:.2e})")
    return problems


# -- 4. timings ----------------------------------------------------------------------------------------------


def copy_bandwidth(device: torch.device, timer: Timer, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    gbs = 2 * nbytes / t[0] / 1e9
    say(f"copy bandwidth ({nbytes / 2**20:.0f} MiB read + written): {gbs:.0f} GB/s  ({fmt_time(t)})")
    return gbs


def _prepared_gemm(m: int, n: int, k: int, arch: str, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(device=device, dtype=torch.bfloat16)
    with pk.use_backend("nvidia", arch=arch):
        a = pk.per_token_cast_to_fp8(x, use_ue8m0=arch == "sm100", prepare_for=pk.fp8_gemm_nt)
        b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(w, use_ue8m0=arch == "sm100"))["b"]
    return a, b


def time_fp8_gemm(device: torch.device, timer: Timer, shapes: list[tuple[int, int, int]]) -> None:
    from portable_kernels.ops.gemm.dense import GemmInputs
    say("\nfp8_gemm_nt (sm90 bytes, bf16 d): Triton vs torch._scaled_mm blockwise vs DeepGEMM published (H800)")
    say(f"{'M':>5s} {'N':>6s} {'K':>6s} | {'triton':>30s} {'TF':>6s} | {'scaled_mm':>30s} {'TF':>6s} | "
        f"{'t/s':>5s} | {'DG H800':>7s} {'t/DG':>5s} | deep_gemm")
    small, large = [], []
    for m, n, k in shapes:
        if over_budget():
            say("  (budget reached: remaining shapes skipped)")
            break
        a, b = _prepared_gemm(m, n, k, "sm90", device)
        flops = 2 * m * n * k
        cols, tf = {}, {}
        outs = {}
        for name in ("triton", "scaled_mm", "deep_gemm"):
            d = torch.empty(m, n, device=device, dtype=torch.bfloat16)
            fn, why = run_provider("fp8_gemm_nt", name, GemmInputs(a, b, d, None))
            if fn is None:
                cols[name] = f"declined: {why[:22]}"
                continue
            t = timer(fn)
            cols[name], tf[name], outs[name] = fmt_time(t), flops / t[0] / 1e12, d
        ratio = tf["triton"] / tf["scaled_mm"] if "triton" in tf and "scaled_mm" in tf else None
        pub = DEEPGEMM_H800_DENSE.get((m, n, k))
        vs_pub = tf.get("triton", 0) / pub if pub else None
        if "triton" in outs and "scaled_mm" in outs:
            agree = pk.calc_diff(outs["triton"].float(), outs["scaled_mm"].float())
            if agree > 1e-4:
                say(f"  WARNING triton and scaled_mm disagree at {m}x{n}x{k}: calc_diff {agree:.2e}")
        say(f"{m:5d} {n:6d} {k:6d} | {cols.get('triton', '-'):>30s} {tf.get('triton', 0):6.0f} | "
            f"{cols.get('scaled_mm', '-'):>30s} {tf.get('scaled_mm', 0):6.0f} | "
            f"{ratio if ratio is not None else float('nan'):5.2f} | {pub or 0:7d} "
            f"{vs_pub if vs_pub is not None else float('nan'):5.2f} | {cols.get('deep_gemm', '-')}")
        if ratio is not None:
            (small if m <= 64 else large if m >= 256 else []).append(ratio)
    if small:
        target("fp8_gemm_nt >= 1.0x _scaled_mm at M <= 64", f"worst {min(small):.2f}x", min(small), 1.0)
    if large:
        target("fp8_gemm_nt >= 0.8x _scaled_mm at M >= 256", f"worst {min(large):.2f}x", min(large), 0.8)


def time_bf16_gemm(device: torch.device, timer: Timer, shapes: list[tuple[int, int, int]]) -> None:
    from portable_kernels.ops.gemm.dense import GemmInputs
    say("\nbf16_gemm_nt: Triton vs cuBLAS (torch.matmul into d)")
    ratios = []
    for m, n, k in shapes:
        if over_budget():
            say("  (budget reached)")
            break
        g = torch.Generator().manual_seed(1)
        a = torch.randn(m, k, generator=g).to(device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, generator=g).to(device=device, dtype=torch.bfloat16)
        d = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        fn, why = run_provider("bf16_gemm_nt", "triton", GemmInputs(a, b, d, None))
        t_ref = timer(lambda: torch.matmul(a, b.T, out=d))
        if fn is None:
            say(f"{m:5d} {n:6d} {k:6d} triton declined: {why}")
            continue
        t = timer(fn)
        ratios.append(t_ref[0] / t[0])
        say(f"{m:5d} {n:6d} {k:6d} | triton {fmt_time(t)} {2 * m * n * k / t[0] / 1e12:6.0f} TF | "
            f"matmul {fmt_time(t_ref)} {2 * m * n * k / t_ref[0] / 1e12:6.0f} TF | {ratios[-1]:5.2f}x")
    if ratios:
        target("bf16_gemm_nt >= 0.9x cuBLAS", f"worst {min(ratios):.2f}x", min(ratios), 0.9)


def time_grouped(device: torch.device, timer: Timer, contiguous: list, masked: list) -> None:
    from portable_kernels.ops.gemm.grouped import ContiguousGroupedInputs, MaskedGroupedInputs
    from portable_kernels.layouts import contiguous_m_indices
    say("\ngrouped GEMMs: bf16 Triton vs torch._grouped_mm; fp8 Triton (sm90) vs DeepGEMM published (H800)")
    ratios = []
    for g_, m_per, n, k in contiguous:
        if over_budget():
            say("  (budget reached)")
            break
        gen = torch.Generator().manual_seed(2)
        m_indices = contiguous_m_indices(torch.full((g_,), m_per), 128).to(device)
        m = m_indices.numel()
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=torch.bfloat16)
        b = (torch.randn(g_, n, k, generator=gen) * k ** -0.5).to(device=device, dtype=torch.bfloat16)
        d = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        call = ContiguousGroupedInputs(a, b, d, m_indices, False, 128, None)
        flops = 2 * g_ * m_per * n * k
        row = f"contiguous G={g_} m={m_per} N={n} K={k} bf16 |"
        times = {}
        for name in ("triton", "grouped_mm"):
            fn, why = run_provider("m_grouped_bf16_gemm_nt_contiguous", name, call)
            if fn is None:
                row += f" {name} declined: {why[:40]} |"
                continue
            times[name] = timer(fn)
            row += f" {name} {fmt_time(times[name])} {flops / times[name][0] / 1e12:5.0f} TF |"
        if len(times) == 2:
            ratios.append(times["grouped_mm"][0] / times["triton"][0])
            row += f" {ratios[-1]:.2f}x"
        say(row)
        # fp8 at the same shape, against DeepGEMM's published figure
        with pk.use_backend("nvidia", arch="sm90"):
            qa = pk.per_token_cast_to_fp8(a, prepare_for=pk.m_grouped_fp8_gemm_nt_contiguous)
            qb = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, b=pk.per_block_cast_to_fp8(b))["b"]
        fn, why = run_provider("m_grouped_fp8_gemm_nt_contiguous", "triton",
                               ContiguousGroupedInputs(qa, qb, d, m_indices, False, 128, None))
        if fn is not None:
            t = timer(fn)
            pub = DEEPGEMM_H800_CONTIGUOUS.get((g_, m_per, n, k))
            say(f"contiguous G={g_} m={m_per} N={n} K={k} fp8  | triton {fmt_time(t)} {flops / t[0] / 1e12:5.0f} TF"
                f" | DeepGEMM H800 {pub or '-'} TF")
    for g_, m_per, n, k in masked:
        if over_budget():
            break
        gen = torch.Generator().manual_seed(3)
        a = torch.randn(g_, m_per, k, generator=gen).to(device=device, dtype=torch.bfloat16)
        b = (torch.randn(g_, n, k, generator=gen) * k ** -0.5).to(device=device, dtype=torch.bfloat16)
        d = torch.empty(g_, m_per, n, device=device, dtype=torch.bfloat16)
        masked_m = torch.full((g_,), m_per, dtype=torch.int32, device=device)
        flops = 2 * g_ * m_per * n * k
        times = {}
        row = f"masked G={g_} m={m_per} N={n} K={k} bf16 |"
        for name in ("triton", "grouped_mm"):
            fn, why = run_provider("m_grouped_bf16_gemm_nt_masked", name, MaskedGroupedInputs(a, b, d, masked_m, m_per))
            if fn is None:
                row += f" {name} declined: {why[:40]} |"
                continue
            times[name] = timer(fn)
            row += f" {name} {fmt_time(times[name])} {flops / times[name][0] / 1e12:5.0f} TF |"
        if len(times) == 2:
            ratios.append(times["grouped_mm"][0] / times["triton"][0])
            row += f" {ratios[-1]:.2f}x  (DeepGEMM fp8 H800: {DEEPGEMM_H800_MASKED.get((g_, m_per, n, k), '-')} TF)"
        say(row)
    if ratios:
        target("grouped bf16 >= 0.9x torch._grouped_mm", f"worst {min(ratios):.2f}x", min(ratios), 0.9)


def time_mla(device: torch.device, timer: Timer, copy_gbs: float, cases: list) -> None:
    from portable_kernels.layouts import pack_fp8_kv_cache
    from portable_kernels.ops.attention.decode import MlaDecodeInputs
    say("\nMLA decode (h_q 128, s_q 1, d 576): KV bytes read / time, as % of copy bandwidth")
    shares = []
    for b, s_k, fp8, topk in cases:
        if over_budget():
            say("  (budget reached)")
            break
        block = 64
        blocks = b * (-(-s_k // block))
        gen = torch.Generator().manual_seed(4)
        if fp8:
            lat = torch.randn(blocks, block, 1, 512, generator=gen).to(device)
            rope = torch.randn(blocks, block, 1, 64, generator=gen).to(device=device, dtype=torch.bfloat16)
            cache = pack_fp8_kv_cache(lat, rope)
            del lat, rope
        else:
            cache = torch.randn(blocks, block, 1, 576, generator=gen).to(device=device, dtype=torch.bfloat16)
        table = torch.arange(blocks, dtype=torch.int32, device=device).view(b, -1)
        seqlens = torch.full((b,), s_k, dtype=torch.int32, device=device)
        q = torch.randn(b, 1, 128, 576, generator=gen).to(device=device, dtype=torch.bfloat16)
        indices = None
        if topk:
            indices = torch.randint(0, s_k, (b, 1, topk), generator=gen, dtype=torch.int32).to(device)
            indices += (torch.arange(b, dtype=torch.int32, device=device) * table.shape[1] * block)[:, None, None]
        with pk.use_backend("nvidia"):
            meta, splits = pk.get_mla_metadata(seqlens, 128, 1, 128, fp8, topk)
        out = torch.empty(b, 1, 128, 512, device=device, dtype=torch.bfloat16)
        lse = torch.empty(b, 128, 1, device=device)
        call = MlaDecodeInputs(q, cache, table, seqlens, 512, 576 ** -0.5, False, fp8, indices, meta, splits, out, lse)
        read = (b * topk if topk else b * s_k) * (656 if fp8 else 1152)
        row = f"b={b:3d} s_k={s_k:5d} {'fp8' if fp8 else 'bf16'} {'topk=' + str(topk) if topk else 'dense':9s} |"
        for name in ("triton", "flash_mla"):
            fn, why = run_provider("flash_mla_with_kvcache", name, call)
            if fn is None:
                row += f" {name}: declined ({why[:40]}) |"
                continue
            t = timer(fn)
            gbs = read / t[0] / 1e9
            row += f" {name} {fmt_time(t)} {gbs:6.0f} GB/s {100 * gbs / copy_gbs:4.0f}% |"
            if name == "triton" and not topk and s_k >= 4096:
                shares.append(gbs / copy_gbs)
        kernels = importlib.import_module("portable_kernels.backends.nvidia.kernels.mla_decode")
        t_flash_numerics = timer(lambda: kernels.flash_mla_with_kvcache(
            q, cache, table, seqlens, 576 ** -0.5, False, fp8, indices, meta.tensors[0], splits, out, lse,
            split_p=False)) if meta.tensors else None
        if t_flash_numerics:
            row += f" triton bf16-P (FlashMLA numerics) {fmt_time(t_flash_numerics)}"
        say(row)
        cache = None  # frees the cache before the next case allocates its own
    if shares:
        target("MLA decode >= 60% of copy bandwidth at s >= 4k", f"worst {100 * min(shares):.0f}%", min(shares), 0.6)
    say(f"(FlashMLA reports ~{FLASHMLA_H800_GBS} GB/s on H800)")


def time_varlen(device: torch.device, timer: Timer, cases: list) -> None:
    """flash_attn_varlen_func (DeepSeek's dense prefill: d 192, d_v 128, causal): the Triton kernel
    (split-P, its default; and bf16 P, flash-attention's numerics) vs torch SDPA on the same rows
    (equal lengths, so a [b, h, s, d] view; causal from the top-left equals bottom-right here)."""
    from portable_kernels.ops.attention.prefill import VarlenInputs
    say("\nvarlen attention (d 192, d_v 128, causal): TFLOPS (causal half counted), Triton vs torch SDPA")
    ratios = []
    for b, s, h in cases:
        if over_budget():
            say("  (budget reached)")
            break
        gen = torch.Generator().manual_seed(6)
        q, k = (torch.randn(b * s, h, 192, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(b * s, h, 128, generator=gen).to(device=device, dtype=torch.bfloat16)
        cu = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=device)
        out = torch.empty(b * s, h, 128, device=device, dtype=torch.bfloat16)
        lse = torch.empty(b * s, h, device=device)
        call = VarlenInputs(q, k, v, cu, cu, s, s, 192 ** -0.5, True, out, lse)
        flops = 2 * b * h * s * s * (192 + 128) / 2
        row = f"b={b} s={s:5d} h={h:3d} |"
        fn, why = run_provider("flash_attn_varlen_func", "triton", call)
        t = None
        if fn is None:
            row += f" triton: declined ({why[:40]}) |"
        else:
            t = timer(fn)
            row += f" triton {fmt_time(t)} {flops / t[0] / 1e12:6.1f} TFLOPS |"
            kernels = importlib.import_module("portable_kernels.backends.nvidia.kernels.varlen_attention")
            t_half = timer(lambda: kernels.flash_attn_varlen_func(q, k, v, cu, cu, s, 192 ** -0.5, True, out, lse,
                                                                  split_p=False))
            row += f" bf16-P {fmt_time(t_half)} {flops / t_half[0] / 1e12:6.1f} |"
        qs, ks, vs = (x.view(b, s, h, -1).transpose(1, 2) for x in (q, k, v))
        try:
            t_ref = timer(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                                                  scale=192 ** -0.5))
            row += f" sdpa {fmt_time(t_ref)} {flops / t_ref[0] / 1e12:6.1f}"
            if t is not None:
                ratios.append(t_ref[0] / t[0])
                row += f" | {ratios[-1]:5.2f}x"
        except RuntimeError as exc:
            row += f" sdpa: {str(exc)[:60]}"
        say(row)
        q = k = v = out = None
    if ratios:
        target("varlen attention vs torch SDPA (no target set)", f"worst {min(ratios):.2f}x", min(ratios), None)


def time_topk(device: torch.device, timer: Timer, cases: list) -> None:
    from portable_kernels.ops.topk import TopkInputs
    say("\ntopk (fp32, unsorted): Triton vs torch.topk")
    ratios = []
    for b, n, k in cases:
        if over_budget():
            break
        x = torch.randn(b, n, generator=torch.Generator().manual_seed(5)).to(device)
        fn, why = run_provider("topk", "triton", TopkInputs(x, k, None, False, False, torch.int64, 2 ** 31 - 1,
                                                            float("-inf"), True))
        t_ref = timer(lambda: torch.topk(x, k, dim=1, sorted=False))
        if fn is None:
            say(f"{b}x{n} k={k}: triton declined: {why}")
            continue
        t = timer(fn)
        ratios.append(t_ref[0] / t[0])
        say(f"{b:4d} x {n:7d} k={k:5d} | triton {fmt_time(t)} | torch.topk {fmt_time(t_ref)} | {ratios[-1]:5.2f}x")
    if ratios:
        target("topk >= 1.0x torch.topk", f"worst {min(ratios):.2f}x", min(ratios), 1.0)


def time_casts(device: torch.device, timer: Timer, copy_gbs: float, m: int, k: int) -> None:
    from portable_kernels.ops.swiglu import SwigluCastInputs
    from portable_kernels.layouts import PLAIN, SM90, SM100
    from portable_kernels.ops.quant.fp8 import CastInputs
    say(f"\nquantizers on bf16 [{m}, {k}]: bytes read + written / time, as % of copy bandwidth")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(6)).to(device=device, dtype=torch.bfloat16)
    shares = []
    cases = [("per_token_cast_to_fp8", (1, 128), fmt, fmt is SM100) for fmt in (PLAIN, SM90, SM100)]
    cases += [("per_block_cast_to_fp8", (128, 128), fmt, fmt is SM100) for fmt in (SM90, SM100)]
    cases += [("per_token_cast_to_fp4", (1, 32), SM100, True)]
    for op, gran, fmt, ue8m0 in cases:
        fn, why = run_provider(op, "triton", CastInputs(x, gran, ue8m0, fmt))
        if fn is None:
            say(f"{op} {fmt.name}: declined: {why}")
            continue
        t = timer(fn)
        out_bytes = m * k // (2 if "fp4" in op else 1)
        moved = m * k * 2 + out_bytes + (m * k // gran[1]) * 4 // max(gran[0], 1)
        gbs = moved / t[0] / 1e9
        shares.append(gbs / copy_gbs)
        say(f"{op:24s} {str(gran):10s} -> {fmt.name:32s} {fmt_time(t)} {gbs:6.0f} GB/s {100 * shares[-1]:4.0f}%")
    xs = torch.randn(m, 2 * (k // 2), generator=torch.Generator().manual_seed(7)).to(device=device,
                                                                                      dtype=torch.bfloat16)
    fn, why = run_provider("swiglu_forward_and_per_token_cast", "triton",
                           SwigluCastInputs(xs, 128, True, None, None, None, None, None, SM100))
    if fn is not None:
        t = timer(fn)
        moved = xs.numel() * 2 + xs.numel() // 2
        gbs = moved / t[0] / 1e9
        shares.append(gbs / copy_gbs)
        say(f"{'swiglu + fp8 cast':24s} {'(1, 128)':10s} -> {SM100.name:32s} {fmt_time(t)} {gbs:6.0f} GB/s "
            f"{100 * shares[-1]:4.0f}%")
    if shares:
        target("casts >= 70% of copy bandwidth", f"worst {100 * min(shares):.0f}%", min(shares), 0.7)


def time_routing(device: torch.device, timer: Timer, copy_gbs: float, t_tokens: int, h: int,
                 experts: int = 256, groups: int = 8) -> None:
    from portable_kernels.ops.moe_routing import fused_mapping_reference, top2_sum_gate_reference
    from portable_kernels.ops.moe_routing.expand import ExpandInputs
    from portable_kernels.ops.moe_routing.gate import GateInputs
    from portable_kernels.ops.moe_routing.reduce import ReduceInputs
    say(f"\nMoE routing (T={t_tokens}, {experts} experts in {groups} groups, top-8 of the best {groups // 2}, H={h})")
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(t_tokens, experts, generator=gen).to(device)
    bias = (torch.randn(experts, generator=gen) * 0.1).to(device)
    gate = (8, groups // 2, groups, 2.5)
    fn, why = run_provider("top2_sum_gate", "triton", GateInputs(logits, bias, *gate, "sigmoid", True, None))
    if fn is not None:
        t = timer(fn)
        t_ref = timer(lambda: top2_sum_gate_reference(logits, bias, *gate))
        say(f"top2_sum_gate   triton {fmt_time(t)} | torch reference {fmt_time(t_ref)} | {t_ref[0] / t[0]:5.2f}x")
    idx, w = top2_sum_gate_reference(logits, bias, *gate)
    rows = -(-(t_tokens * 8 + 127 * experts) // 128) * 128
    pte, _, _, ttp, *_ = fused_mapping_reference(idx, experts, rows, 128)
    x = torch.randn(t_tokens, h, generator=gen).to(device=device, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
    sf = torch.rand(t_tokens, h // 128, generator=gen).to(device)
    out = torch.empty(rows, h, dtype=x.dtype, device=device)
    out_sf = torch.empty(rows, h // 128, device=device)
    fn, why = run_provider("expand_to_fused_with_sf", "triton", ExpandInputs(x, sf, ttp, pte, out, out_sf))
    if fn is not None:
        t = timer(fn)
        gbs = (rows * h + t_tokens * 8 * h) / t[0] / 1e9
        say(f"expand_to_fused_with_sf fp8 triton {fmt_time(t)} {gbs:6.0f} GB/s {100 * gbs / copy_gbs:4.0f}%")
    y = torch.randn(rows, h, generator=gen).to(device=device, dtype=torch.bfloat16)
    red = torch.empty(t_tokens, h, dtype=torch.bfloat16, device=device)
    fn, why = run_provider("reduce_fused", "triton", ReduceInputs(y, None, w, ttp, None, False, red))
    if fn is not None:
        t = timer(fn)
        gbs = (t_tokens * 8 * h * 2 + t_tokens * h * 2) / t[0] / 1e9
        say(f"reduce_fused bf16 weighted triton {fmt_time(t)} {gbs:6.0f} GB/s {100 * gbs / copy_gbs:4.0f}%")


def time_encoders(device: torch.device, timer: Timer) -> None:
    from portable_kernels.backends.nvidia import cuda as encoders
    from portable_kernels.layouts import ceil_to_ue8m0, sm100_ue8m0_encode_from_blocks, sm90_sfa_encode
    say("\nlayout encoders at ingest: CUDA C++ (deepjit) vs the torch layouts, on the GPU")
    for label, mn, kb in (("activations 4096x7168", 4096, 56), ("weight 7168x2048", 7168, 16)):
        sf = (torch.rand(mn, kb, generator=torch.Generator().manual_seed(9)) + 0.01).to(device)
        blocks = ceil_to_ue8m0(torch.rand(-(-mn // 128), kb).to(device) + 0.01)
        t_cuda = timer(lambda: encoders.sm90_sfa_encode(sf))
        t_torch = timer(lambda: sm90_sfa_encode(sf))
        say(f"sm90 SFA {label:24s} cuda {fmt_time(t_cuda)} | torch {fmt_time(t_torch)} | "
            f"{t_torch[0] / t_cuda[0]:5.2f}x")
        t_cuda = timer(lambda: encoders.sm100_pack(blocks, mn, 128))
        t_torch = timer(lambda: sm100_ue8m0_encode_from_blocks(blocks, mn, 128))
        say(f"sm100 pack {label:22s} cuda {fmt_time(t_cuda)} | torch {fmt_time(t_torch)} | "
            f"{t_torch[0] / t_cuda[0]:5.2f}x (cuda includes its power-of-two flag read-back)")


# -- main ------------------------------------------------------------------------------------------------------


def write_log(device: torch.device) -> Path:
    """docs/device-runs/<date>-nvidia-<gpu>-triton.log (a dry run writes to the temp folder instead)."""
    if device.type != "cuda":
        path = Path(tempfile.gettempdir()) / "device_check_nvidia-dry-run.log"
    else:
        name = torch.cuda.get_device_name(device).replace(" ", "-").lower()
        path = ROOT / "docs" / "device-runs" / f"{datetime.date.today()}-nvidia-{name}-triton.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(LOG_LINES) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick conformance cases")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on CPU tensors (set TRITON_INTERPRET=1): checks this script's plumbing only")
    parser.add_argument("--skip-conformance", action="store_true")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, timer = torch.device("cpu"), Timer(torch.device("cpu"), rounds=1, round_seconds=0.0)
    elif torch.cuda.is_available():
        device, timer = torch.device("cuda"), Timer(torch.device("cuda"))
    else:
        print("no GPU: run on a GPU machine, or pass --dry-run with TRITON_INTERPRET=1")
        return 2
    dry = args.dry_run
    problems: list[str] = []
    say(f"== nvidia device check{' (DRY RUN on CPU: plumbing only, timings meaningless)' if dry else ''}")
    environment(device)
    say(f"\n== build ({elapsed():.0f} s)")
    problems += build_cuda_encoders(device)
    if not args.skip_conformance:
        say(f"\n== conformance on {device} ({elapsed():.0f} s)")
        problems += conformance(quick=args.quick or dry)
    say(f"\n== byte identity ({elapsed():.0f} s)")
    problems += same_bytes_as_cpu(device)
    say(f"\n== timings ({elapsed():.0f} s)")
    copy_gbs = copy_bandwidth(device, timer, 2 ** 20 if dry else 2 ** 30)
    if dry:
        time_fp8_gemm(device, timer, [(3, 64, 256)])
        time_bf16_gemm(device, timer, [(3, 64, 128)])
        time_grouped(device, timer, [(2, 40, 64, 128)], [(2, 16, 64, 128)])
        time_mla(device, timer, copy_gbs, [(2, 100, False, None), (2, 100, True, 64)])
        time_topk(device, timer, [(2, 1000, 8)])
        time_varlen(device, timer, [(2, 80, 2)])
        time_casts(device, timer, copy_gbs, 8, 256)
        time_routing(device, timer, copy_gbs, 16, 256, experts=16, groups=4)
    else:
        dense = [(m, n, k) for m in (64, 128, 4096) for (n, k) in
                 ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))]
        time_fp8_gemm(device, timer, dense)
        time_bf16_gemm(device, timer, [(64, 2112, 7168), (64, 7168, 2048), (4096, 4096, 7168), (4096, 7168, 2048)])
        time_grouped(device, timer, [(4, 8192, 4096, 7168), (8, 4096, 7168, 2048)],
                     [(1, 1024, 4096, 7168), (4, 256, 4096, 7168)])
        time_mla(device, timer, copy_gbs, [(64, 4096, False, None), (64, 8192, False, None), (64, 8192, True, None),
                                           (132, 4096, True, None), (64, 8192, True, 2048)])
        time_topk(device, timer, [(1, 1024, 8), (64, 32768, 2048), (1, 131072, 2048), (128, 131072, 2048)])
        time_varlen(device, timer, [(1, 4096, 128), (4, 2048, 128), (16, 1024, 16)])
        time_casts(device, timer, copy_gbs, 4096, 7168)
        time_routing(device, timer, copy_gbs, 4096, 7168)
        time_encoders(device, timer)
    say(f"\n== summary ({elapsed():.0f} s)")
    for text, measured, _, passed in TARGETS:
        verdict = "n/a" if passed is None else ("PASS" if passed else "MISS")
        say(f"{verdict:5s} {text:52s} {measured}")
    say(f"checks: {'all passed' if not problems else problems}")
    say(f"wall time {elapsed():.0f} s")
    path = write_log(device)
    print(f"log written to {path}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
