"""Throughput of the layout encoders on DeepSeek-V3 shapes, against torch.clone of the same traffic.

Run: python benchmarks/layouts_bench.py [--repeat N]

For each case the encoder reads its input and writes its output; "bytes" counts both. The clone
column copies a uint8 buffer of half that size (so it too moves `bytes`), measured in the same run.
ratio = encoder GB/s / clone GB/s (target >= 0.5 on CPU). Times are the best batch of --repeat,
encoder and clone batches interleaved. Weight scales use the fused `*_from_blocks` encoders (the
ingest path). A benchmark, not a test: it prints only.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from portable_kernels.layouts import (
    ascend_mx_encode,
    ascend_mx_encode_from_blocks,
    e2m1_encode,
    nd_to_nz,
    pack_e2m1,
    regranularize_k,
    sm90_sfa_encode,
    sm90_sfb_encode,
    sm100_ue8m0_encode,
    sm100_ue8m0_encode_from_blocks,
)

BLOCK = 128


def _pow2_scales(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return (torch.randint(100, 140, shape, generator=gen, dtype=torch.int32) << 23).view(torch.float32)


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _calls_per_batch(fn: Callable[[], object]) -> int:
    for _ in range(3):  # warm up: first calls pay for page faults and allocator growth
        fn()
    start = time.perf_counter()
    fn()
    return max(1, int(0.02 / max(time.perf_counter() - start, 1e-7)))


def _batch(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _time_pair(enc: Callable[[], object], clone: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best seconds per call of each, batches interleaved so both see the same machine load."""
    n_enc, n_clone = _calls_per_batch(enc), _calls_per_batch(clone)
    t_enc = t_clone = float("inf")
    for _ in range(repeat):
        t_enc = min(t_enc, _batch(enc, n_enc))
        t_clone = min(t_clone, _batch(clone, n_clone))
    return t_enc, t_clone


def _weight_cases(name: str, g: int | None, n: int, k: int, gen: torch.Generator):
    shape = (n // BLOCK, k // BLOCK) if g is None else (g, n // BLOCK, k // BLOCK)
    sf = _pow2_scales(shape, gen)

    return [
        (f"{name} SM90 SFB (as is)", lambda: sm90_sfb_encode(sf), sf),
        (f"{name} SM100 from blocks", lambda: sm100_ue8m0_encode_from_blocks(sf, n), sf),
        (f"{name} Ascend from blocks", lambda: ascend_mx_encode_from_blocks(sf, n, k), sf),
    ]


def _cases(gen: torch.Generator):
    cases = []
    cases += _weight_cases("W 7168x2048", None, 7168, 2048, gen)
    cases += _weight_cases("W 2048x7168", None, 2048, 7168, gen)
    cases += _weight_cases("W 32x2048x7168", 32, 2048, 7168, gen)

    act = _pow2_scales((4096, 7168 // BLOCK), gen)  # 4096 tokens, K = 7168, (1,128) scales
    act32 = regranularize_k(act, 7168, BLOCK, 32)
    cases += [
        ("A 4096x7168 SM90 SFA (TMA-aligned)", lambda: sm90_sfa_encode(act), act),
        ("A 4096x7168 SM100 int32 pack", lambda: sm100_ue8m0_encode(act), act),
        ("A 4096x7168 Ascend (1x32 given) int16", lambda: ascend_mx_encode(act32), act32),
    ]

    w8 = torch.randint(0, 256, (7168, 2048), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = torch.randint(0, 16, (7168, 2048), generator=gen, dtype=torch.uint8)
    wf = torch.randn(7168, 2048, generator=gen).to(torch.bfloat16)
    cases += [
        ("NZ fp8 7168x2048", lambda: nd_to_nz(w8), w8),
        ("FP4 pack codes 7168x2048", lambda: pack_e2m1(codes), codes),
        ("FP4 e2m1_encode bf16 7168x2048", lambda: e2m1_encode(wf), wf),
    ]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = (
        f"{'case':40s} {'bytes':>11s} {'enc us':>10s} {'enc GB/s':>9s} {'clone us':>9s} {'clone GB/s':>10s} {'ratio':>6s}"
    )
    print(header)
    print("-" * len(header))
    for name, fn, inp in _cases(gen):
        out = fn()
        moved = _nbytes(inp) + _nbytes(out)
        buf = torch.empty(max(1, moved // 2), dtype=torch.uint8)
        t_enc, t_clone = _time_pair(fn, buf.clone, args.repeat)
        enc_gbs, clone_gbs = moved / t_enc / 1e9, 2 * buf.numel() / t_clone / 1e9
        ratio = enc_gbs / clone_gbs
        print(
            f"{name:40s} {moved:11d} {t_enc * 1e6:10.1f} {enc_gbs:9.2f} {t_clone * 1e6:9.1f} {clone_gbs:10.2f} {ratio:6.2f}"
        )


if __name__ == "__main__":
    main()
