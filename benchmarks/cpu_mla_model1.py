"""The cpu backend's sparse MLA decode over FlashMLA's MODEL1 pages (d = 512, 584 bytes per token)
side by side with the same call over V3.2 rows (d = 576, 656 bytes), and the reference provider on
MODEL1 (the contract's fp32 math): one process, paired rounds in rotated order, medians with min-max.

    python benchmarks/cpu_mla_model1.py                       # b=4, s_q=1, h_q=64, topk=512, 1 thread
    python benchmarks/cpu_mla_model1.py --shape 2,2,128,2048 --threads 2 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics

import torch

from portable_kernels.backends.cpu.providers import mla as native
from portable_kernels.core.native.build import detected_isa, isa
from portable_kernels.tools.bench.timing import rotated_rounds
from portable_kernels.ops.attention.decode import HEAD_DIM_V, MlaDecodeInputs, flash_mla_with_kvcache_kernel
from portable_kernels.testing.mla_cases import build_paged_cache, random_indices, random_kv
from portable_kernels.testing.generators import randn
import portable_kernels as pk


def _inputs(b: int, s_q: int, h_q: int, topk: int, d: int) -> MlaDecodeInputs:
    paged = build_paged_cache(random_kv([4 * topk] * b, 1, d, seed=d), 64, seed=d, fp8=True)
    indices, _ = random_indices(paged, s_q, topk, seed=d + 1, invalid_fraction=0.0)
    q = randn(b, s_q, h_q, d, seed=d + 2, dtype=torch.bfloat16)
    meta = pk.MlaMetadata("cpu", b, s_q * h_q, 1, h_q, True, topk)
    return MlaDecodeInputs(q, paged.k_cache, None, None, HEAD_DIM_V, d ** -0.5, False, True, indices, meta, None,
                           torch.empty(b, s_q, h_q, HEAD_DIM_V, dtype=torch.bfloat16), torch.empty(b, h_q, s_q))


def measure(b: int, s_q: int, h_q: int, topk: int, rounds: int) -> dict[str, list[float]]:
    model1, v32 = _inputs(b, s_q, h_q, topk, 512), _inputs(b, s_q, h_q, topk, 576)
    sides = {"native MODEL1": lambda: native.decode_native(model1),
             "native V3.2": lambda: native.decode_native(v32),
             "reference MODEL1": lambda: flash_mla_with_kvcache_kernel(model1)}
    return rotated_rounds(sides, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4,1,64,512", help="b,s_q,h_q,topk")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    b, s_q, h_q, topk = (int(v) for v in args.shape.split(","))
    torch.set_num_threads(args.threads)
    seconds = measure(b, s_q, h_q, topk, args.rounds)
    print(f"sparse decode b={b} s_q={s_q} h_q={h_q} topk={topk}, {args.threads} thread(s), ISA {isa()} "
          f"(detected {detected_isa()}), {args.rounds} rounds; ms median [min, max]")
    base = statistics.median(seconds["native V3.2"])
    for name, s in seconds.items():
        med = statistics.median(s)
        print(f"  {name:18s} {1e3 * med:9.2f} [{1e3 * min(s):.2f}, {1e3 * max(s):.2f}]  x{med / base:.2f} of native V3.2")


if __name__ == "__main__":
    main()
