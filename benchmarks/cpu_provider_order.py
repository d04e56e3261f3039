"""The figures behind the cpu backend's provider order for bf16_gemm_nt: torch-blas against native,
both providers called directly on the same bf16 operands into a bf16 d, paired rounds in one
process, 1 thread, medians with min-max (docs/cpu-backend.md, "Provider order per ISA").

    python benchmarks/cpu_provider_order.py                         # this CPU as it is
    PK_NATIVE_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/cpu_provider_order.py                     # both sides on AVX2
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from portable_kernels.backends.cpu.providers import gemm as cpu_gemm
from portable_kernels.core.native.build import detected_isa, isa


def pair(m: int, n: int, k: int, rounds: int) -> list[float]:
    """Per-round ratios torch-blas time / native time (> 1: native faster)."""
    gen = torch.Generator().manual_seed(m)
    a = torch.randn(m, k, generator=gen).bfloat16()
    b = torch.randn(n, k, generator=gen).bfloat16()
    native = SimpleNamespace(a=a, b=b, c=None, d=torch.empty(m, n, dtype=torch.bfloat16))
    blas = SimpleNamespace(a=a, b=b, c=None, d=torch.empty(m, n, dtype=torch.bfloat16))
    cpu_gemm.bf16_gemm_nt_native(native)  # build and warm both
    cpu_gemm.bf16_gemm_nt_blas(blas)
    ratios = []
    for r in range(rounds):
        sides = [(cpu_gemm.bf16_gemm_nt_native, native), (cpu_gemm.bf16_gemm_nt_blas, blas)]
        seconds = {}
        for fn, call in (sides if r % 2 == 0 else sides[::-1]):  # alternate which side goes first
            t = time.perf_counter()
            fn(call)
            seconds[fn] = time.perf_counter() - t
        ratios.append(seconds[cpu_gemm.bf16_gemm_nt_blas] / seconds[cpu_gemm.bf16_gemm_nt_native])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    level, extras = detected_isa()
    print(f"cpu: detected {level} {sorted(extras)}, native built for {isa()}, torch bf16 hardware: "
          f"{cpu_gemm.torch_bf16_has_hardware()} -> torch-blas priority {cpu_gemm.blas_priority()}, "
          f"native {cpu_gemm.PRIORITY}")
    for m in args.m:
        r = pair(m, args.n, args.k, args.rounds)
        print(f"M={m} N={args.n} K={args.k}: torch-blas / native time {statistics.median(r):.2f} "
              f"({min(r):.2f}-{max(r):.2f})")


if __name__ == "__main__":
    main()
