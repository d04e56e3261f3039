"""What the torch.library boundary costs per call: the public op in eager mode vs the same call
through `torch.ops.portable_kernels.<op>` (what a torch.compile graph, vLLM or SGLang runs), and the
`is_compiling()` check every public op now starts with.

As in overhead_bench.py, the selected provider is swapped for one returning its precomputed result,
so both calls cost their wrappers only: the eager column is the v2 hot path, the torch.ops column
adds the dispatcher (arguments to and from C++), rebuilding prepared operands from tensors plus
static attributes (checked), and the output checks. Rounds alternate the two calls in one process;
times are this thread's CPU time; printed: median µs per call and the spread (min..max of rounds).
Run: `python benchmarks/custom_ops_bench.py [--rounds 15 --calls 2000]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from typing import Any, Callable

import torch

import portable_kernels as pk
from portable_kernels.core.compiled import is_compiling
from portable_kernels.core.dispatch import provider_for
from portable_kernels.ops.gemm.dense import FP8_GEMM_NT, GemmInputs
from portable_kernels.ops.attention.decode import FLASH_MLA_WITH_KVCACHE, MlaDecodeInputs
from portable_kernels.ops.quant.fp8 import PER_TOKEN_CAST, CastInputs
from portable_kernels.ops.topk import TOPK, TopkInputs
from portable_kernels.torch_ops import operand_args

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_bench import _provider_free  # noqa: E402  (the same provider swap as the eager benchmark)


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    torch.manual_seed(0)
    ops = torch.ops.portable_kernels
    contract = pk.get_contract("fp8_gemm_nt")
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    a = pk.per_token_cast_to_fp8(x, prepare_for=pk.fp8_gemm_nt)
    b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(torch.randn(128, 128)))["b"]
    d = torch.empty(1, 128, dtype=torch.bfloat16)
    gemm_args = (*operand_args(a, contract, "a"), *operand_args(b, contract, "b"), d, None, None)
    gemm = GemmInputs(a, b, d, None)
    _provider_free(FP8_GEMM_NT, gemm, lambda: provider_for(FP8_GEMM_NT, gemm).fn(gemm))

    scores = torch.randn(1, 1024)
    top = TopkInputs(scores, 8, None, False, False, torch.int64, 2**31 - 1, float("-inf"), True)
    _provider_free(TOPK, top, lambda: provider_for(TOPK, top).fn(top))
    xc = torch.randn(4, 256)
    cast = CastInputs(xc, (1, 128), False, pk.PLAIN)
    _provider_free(PER_TOKEN_CAST, cast, lambda: provider_for(PER_TOKEN_CAST, cast).fn(cast))

    q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.arange(4, dtype=torch.int32)[None]
    seqlens = torch.tensor([200], dtype=torch.int32)
    meta, splits = pk.get_mla_metadata(seqlens, 16, 1)
    out, lse = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16), torch.empty(1, 16, 1)
    decode = MlaDecodeInputs(q, cache, table, seqlens, 512, 576 ** -0.5, False, False, None, meta, splits, out, lse)
    _provider_free(FLASH_MLA_WITH_KVCACHE, decode,
                   lambda: provider_for(FLASH_MLA_WITH_KVCACHE, decode).fn(decode))
    mla_args = (q, cache, table, seqlens, 512, list(meta.tensors), meta.num_splits, meta.backend, meta.batch_size,
                meta.num_q_tokens_per_head_k, meta.num_heads_k, meta.num_heads_q, meta.is_fp8_kvcache, meta.topk, True,
                None, False, False, None, out, lse)
    return {
        "fp8_gemm_nt prepared 1x128x128": (lambda: pk.fp8_gemm_nt(a, b, d),
                                           lambda: ops.fp8_gemm_nt.default(*gemm_args)),
        "topk 1x1024 k=8": (lambda: pk.topk(scores, 8),
                            lambda: ops.topk.default(scores, 8, False, None, None, torch.int64, False, 2**31 - 1,
                                                     float("-inf"), True)),
        "per_token_cast_to_fp8 4x256": (lambda: pk.per_token_cast_to_fp8(xc),
                                        lambda: ops.per_token_cast_to_fp8.default(xc, 128, False, "", "a", "", "",
                                                                                  [])),
        "flash_mla_with_kvcache b1 h16 s_k200": (
            lambda: pk.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits, out=out, lse=lse),
            lambda: ops.flash_mla_with_kvcache.default(*mla_args)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    check = min(timeit.repeat(is_compiling, number=200_000, repeat=7)) / 200_000 * 1e9
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.calls} calls")
    print(f"is_compiling() check at the top of every public op: {check:.0f} ns (best of 7 x 200k)")
    header = ("case", "eager µs", "spread", "torch.ops µs", "spread", "boundary µs")
    print(f"{header[0]:38s} {header[1]:>9s} {header[2]:>15s} {header[3]:>13s} {header[4]:>15s} {header[5]:>12s}")
    for name, (eager, through_op) in _cases().items():
        eager(), through_op()
        e, o = [], []
        for _ in range(args.rounds):
            e.append(_per_call_us(eager, args.calls))
            o.append(_per_call_us(through_op, args.calls))
        me, mo = statistics.median(e), statistics.median(o)
        print(f"{name:38s} {me:9.1f} {min(e):6.1f}..{max(e):6.1f} {mo:13.1f} {min(o):6.1f}..{max(o):6.1f} "
              f"{mo - me:12.1f}")


if __name__ == "__main__":
    main()
