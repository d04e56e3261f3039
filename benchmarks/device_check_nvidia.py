"""Device check of the nvidia backend on a real GPU: one call builds nothing, checks everything,
times the ingest conversions, and prints a short table last.

Run on a GPU machine (after `pip install --no-deps --no-build-isolation -e .`):
    python benchmarks/device_check_nvidia.py
What it does:
1. reports the backend as the registry sees it (availability, arch from the compute capability);
2. runs the full conformance suite of every op on the nvidia backend natively (cuda tensors);
3. checks that the layouts encoded on the GPU are byte-identical to the ones encoded on the CPU,
   for sm90 and sm100, and that fp8_gemm_nt through each gives the same result as on the CPU;
4. times prepare_inputs of DeepSeek-V3 weight shapes on the GPU against a clone of the same bytes;
5. runs the demo.
A benchmark/check entry, not a test: it prints, and exits non-zero only if a check fails.
"""

from __future__ import annotations

import sys
import time

import torch

import portable_kernels as pk
from portable_kernels.demo import format_table, run_demo
from portable_kernels.testing import run_conformance

WEIGHT_SHAPES = {"w_up 2048x7168": (2048, 7168), "w_down 7168x2048": (7168, 2048),
                 "32 experts 2048x7168": (32, 2048, 7168)}


def _gpu_time(fn, repeat: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeat


def check_same_bytes_as_cpu() -> list[str]:
    problems = []
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1000, generator=gen)
    w = torch.randn(260, 1000, generator=gen) / 30
    a, b = pk.per_token_cast_to_fp8(x, use_ue8m0=True), pk.per_block_cast_to_fp8(w, use_ue8m0=True)
    for arch in ("sm90", "sm100"):
        on_cpu = pk.prepare_inputs(pk.fp8_gemm_nt, backend="nvidia", arch=arch, a=a, b=b)
        with pk.use_backend("nvidia", arch=arch):
            on_gpu = pk.prepare_inputs(pk.fp8_gemm_nt, device="cuda", a=a, b=b)
        for arg in ("a", "b"):
            c, g = on_cpu[arg], on_gpu[arg]
            if c.scale.stride() != g.scale.stride() or not torch.equal(c.scale, g.scale.cpu()):
                problems.append(f"{arch} {arg}: GPU-encoded scales differ from CPU-encoded ones")
        d_cpu = torch.empty(96, 260)
        d_gpu = torch.empty(96, 260, device="cuda")
        pk.fp8_gemm_nt(on_cpu["a"], on_cpu["b"], d_cpu)
        with pk.use_backend("nvidia", arch=arch):
            pk.fp8_gemm_nt(on_gpu["a"], on_gpu["b"], d_gpu)
        diff = pk.calc_diff(d_gpu.cpu(), d_cpu)
        print(f"fp8_gemm_nt {arch}: calc_diff(gpu, cpu emulation) = {diff:.2e}")
        if diff > 1e-6:
            problems.append(f"{arch}: GPU result differs from the CPU emulation (calc_diff {diff:.2e})")
    return problems


def time_ingest() -> list[tuple[str, str, float, float, float]]:
    """Per weight and arch: microseconds per prepare_inputs, and GB/s of the scale bytes it reads and
    writes against a clone moving the same bytes (the fp8 data is already K-major: not copied)."""
    rows = []
    for label, shape in WEIGHT_SHAPES.items():
        w = (torch.randn(*shape, device="cuda") / 64).to(torch.bfloat16)
        q = pk.per_block_cast_to_fp8(w, use_ue8m0=True)
        for arch in ("sm90", "sm100"):
            with pk.use_backend("nvidia", arch=arch):
                prep = lambda: pk.prepare_inputs(pk.fp8_gemm_nt, b=q)  # noqa: E731
                seconds = _gpu_time(prep)
                out = prep()["b"]
            moved = q.scale.numel() * 4 + out.scale.numel() * out.scale.element_size()
            clone_src = torch.empty(max(moved // 2, 1), dtype=torch.uint8, device="cuda")
            clone_s = _gpu_time(lambda: clone_src.clone())
            rows.append((label, arch, seconds * 1e6, moved / seconds / 1e9, moved / clone_s / 1e9))
    return rows


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU: this check needs one")
        return 2
    info = pk.available_backends()["nvidia"]
    arch = pk.registry().backend("nvidia").default_options(torch.device("cuda"))
    print(f"GPU {torch.cuda.get_device_name()} capability {torch.cuda.get_device_capability()} torch {torch.__version__}")
    print(f"nvidia backend: available={info.available} reason={info.reason} default layout options={arch}")
    start = time.perf_counter()
    report = run_conformance(backend="nvidia", quick=False)
    print(report.format_table())
    print(f"conformance wall time {time.perf_counter() - start:.1f} s")
    problems = [] if report.ok else ["conformance failures on nvidia/cuda"]
    problems += check_same_bytes_as_cpu()
    ingest = time_ingest()
    print("fp8_gemm_nt  M=128 N=2048 K=7168 demo:")
    print(format_table(run_demo()))
    print("\nprepare_inputs of a weight (ue8m0 scales) on the GPU: time, and scale bytes moved vs clone")
    print(f"{'shape':24s} {'arch':6s} {'us':>8s} {'GB/s':>8s} {'clone GB/s':>10s} {'ratio':>6s}")
    for label, arch_name, micros, gbs, clone in ingest:
        print(f"{label:24s} {arch_name:6s} {micros:8.1f} {gbs:8.2f} {clone:10.2f} {gbs / clone:6.2f}")
    cases = sum(r.cases for r in report.ops.values())
    passed = sum(r.passed for r in report.ops.values())
    unsupported = sum(len(r.unsupported) for r in report.ops.values())
    print(f"\nSUMMARY conformance nvidia/cuda: {passed}/{cases} passed, {unsupported} unsupported; "
          f"byte identity and GPU-vs-CPU checks: {'ok' if not problems else problems}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
