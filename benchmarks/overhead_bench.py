"""Per-call wrapper overhead of the public ops: µs of (public call) − (direct provider call).

The provider's own time is taken out exactly: after a warm-up call, the selected provider in the
op's cached plan is swapped for one that returns the result it computed (the call's validation,
selection, conversion and output allocation all still run), so the public call then costs the
wrapper alone. The real provider, called directly, is timed beside it for context. Rounds of
`calls` calls alternate between the two in one process; the median wrapper time and its spread
(min..max over rounds) are printed. Times are this thread's CPU time (time.thread_time), so other
processes on a shared machine add little noise. Run: `python benchmarks/overhead_bench.py [--rounds 15]`.
Targets (issue "Kernel interface v2"): prepared fp8_gemm_nt <= 5 µs, topk <= 5 µs, casts <= 5 µs,
flash_mla_with_kvcache <= 15 µs, raw-tuple fp8_gemm_nt <= 25 µs (it converts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import torch

import portable_kernels as pk
import attrs

from portable_kernels.core.dispatch import plan_for, provider_for
from portable_kernels.ops.gemm.dense import FP8_GEMM_NT, GemmInputs
from portable_kernels.ops.attention.decode import FLASH_MLA_WITH_KVCACHE, MlaDecodeInputs
from portable_kernels.ops.quant.fp8 import PER_TOKEN_CAST, CastInputs
from portable_kernels.ops.topk import TOPK, TopkInputs

TARGETS_US = {"fp8_gemm_nt prepared": 5.0, "fp8_gemm_nt raw tuples": 25.0, "topk": 5.0, "per_token_cast_to_fp8": 5.0,
              "per_token_cast_to_fp8 prepare_for": 5.0, "flash_mla_with_kvcache": 15.0}


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
    # CPU time of this thread: on a shared machine, time spent waiting for a core is not counted
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def _provider_free(contract, inputs, direct: Callable[[], Any]) -> None:
    """Make the cached plan of (contract, inputs) run a provider that returns `direct()`'s result."""
    result = direct()
    plan = plan_for(contract, inputs)
    plan.provider = attrs.evolve(plan.provider_for(inputs), fn=lambda call: result)


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any], Callable[[], None]]]:
    torch.manual_seed(0)
    x = torch.randn(1, 128, dtype=torch.bfloat16)
    w = torch.randn(128, 128, dtype=torch.bfloat16)
    a = pk.per_token_cast_to_fp8(x, prepare_for=pk.fp8_gemm_nt)
    b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(w))["b"]
    d = torch.empty(1, 128, dtype=torch.bfloat16)
    gemm_inputs = GemmInputs(a, b, d, None)
    gemm = provider_for(FP8_GEMM_NT, gemm_inputs).fn
    raw_a, raw_b = tuple(pk.per_token_cast_to_fp8(x)), tuple(pk.per_block_cast_to_fp8(w))

    scores = torch.randn(1, 1024)
    topk_inputs = TopkInputs(scores, 8, None, False, False, torch.int64, 2**31 - 1, float("-inf"), True)
    topk = provider_for(TOPK, topk_inputs).fn

    xc = torch.randn(4, 256)
    cast_inputs = CastInputs(xc, (1, 128), False, pk.PLAIN)
    cast = provider_for(PER_TOKEN_CAST, cast_inputs).fn

    q = torch.randn(1, 1, 16, 576, dtype=torch.bfloat16)
    cache = torch.randn(4, 64, 1, 576, dtype=torch.bfloat16)
    table = torch.arange(4, dtype=torch.int32)[None]
    seqlens = torch.tensor([200], dtype=torch.int32)
    meta, splits = pk.get_mla_metadata(seqlens, 16, 1)
    out, lse = torch.empty(1, 1, 16, 512, dtype=torch.bfloat16), torch.empty(1, 16, 1)
    mla_inputs = MlaDecodeInputs(q, cache, table, seqlens, 512, 576 ** -0.5, False, False, None, meta, splits, out, lse)
    mla = provider_for(FLASH_MLA_WITH_KVCACHE, mla_inputs).fn

    def free(contract, inputs, direct):
        return lambda: _provider_free(contract, inputs, direct)

    raw_inputs = GemmInputs(pk.per_token_cast_to_fp8(x), pk.per_block_cast_to_fp8(w), d, None)
    return {
        "fp8_gemm_nt prepared": (lambda: pk.fp8_gemm_nt(a, b, d), lambda: gemm(gemm_inputs),
                                 free(FP8_GEMM_NT, gemm_inputs, lambda: gemm(gemm_inputs))),
        "fp8_gemm_nt raw tuples": (lambda: pk.fp8_gemm_nt(raw_a, raw_b, d), lambda: gemm(gemm_inputs),
                                   free(FP8_GEMM_NT, raw_inputs, lambda: gemm(gemm_inputs))),
        "topk": (lambda: pk.topk(scores, 8), lambda: topk(topk_inputs), free(TOPK, topk_inputs,
                                                                             lambda: topk(topk_inputs))),
        "per_token_cast_to_fp8": (lambda: pk.per_token_cast_to_fp8(xc), lambda: cast(cast_inputs),
                                  free(PER_TOKEN_CAST, cast_inputs, lambda: cast(cast_inputs))),
        "per_token_cast_to_fp8 prepare_for": (lambda: pk.per_token_cast_to_fp8(xc, prepare_for=pk.fp8_gemm_nt),
                                              lambda: cast(cast_inputs),
                                              free(PER_TOKEN_CAST, cast_inputs, lambda: cast(cast_inputs))),
        "flash_mla_with_kvcache": (lambda: pk.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits,
                                                                     out=out, lse=lse),
                                   lambda: mla(mla_inputs), free(FLASH_MLA_WITH_KVCACHE, mla_inputs,
                                                                 lambda: mla(mla_inputs))),
    }


def call_walk(fn: Callable[[], Any], root: str) -> list[tuple[str, str]]:
    """(file, function) of every Python call under `root` during fn() (the walk of one op call)."""
    calls: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            calls.append((os.path.relpath(frame.f_code.co_filename, root), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def print_walk() -> None:
    """The walk of a prepared fp8_gemm_nt call: up to the provider, and in all (provider included)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(pk.__file__)))
    torch.manual_seed(0)
    x, w = torch.randn(8, 256, dtype=torch.bfloat16), torch.randn(64, 256, dtype=torch.bfloat16)
    for backend, options in (("cpu", {}), ("nvidia", {"arch": "sm90"}), ("nvidia", {"arch": "sm100"})):
        with pk.use_backend(backend, **options):
            a = pk.per_token_cast_to_fp8(x, use_ue8m0=True, prepare_for=pk.fp8_gemm_nt)
            b = pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(w, use_ue8m0=True))["b"]
            d = torch.empty(8, 64, dtype=torch.bfloat16)
            pk.fp8_gemm_nt(a, b, d)
            calls = call_walk(lambda: pk.fp8_gemm_nt(a, b, d), root)
        provider = provider_for(FP8_GEMM_NT, GemmInputs(a, b, d, None)).fn.__code__.co_name
        upto = next(i for i, (_, name) in enumerate(calls) if name == provider)
        label = f"{backend} {options.get('arch', '')}".strip()
        print(f"walk of a prepared fp8_gemm_nt on {label}: {upto} Python calls in "
              f"{len({f for f, _ in calls[:upto]})} files up to the provider; {len(calls)} calls in "
              f"{len({f for f, _ in calls})} files in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--walk", action="store_true", help="print the call walk of a prepared fp8_gemm_nt")
    args = parser.parse_args()
    if args.walk:
        print_walk()
        return
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", pk.ImplicitConversionWarning)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.rounds} rounds x {args.calls} calls")
    print(f"{'case':38s} {'wrapper µs':>11s} {'spread':>15s} {'target':>7s} {'provider µs':>12s}")
    cases = _cases()
    for name, (public, direct, _) in cases.items():
        public(), direct()  # warm: plans cached, first-call warnings issued
    for name, (public, direct, make_free) in cases.items():
        make_free()
        public()
        wrap, prov = [], []
        for _ in range(args.rounds):
            wrap.append(_per_call_us(public, args.calls))
            prov.append(_per_call_us(direct, max(1, args.calls // 20)))
        med = statistics.median(wrap)
        target = TARGETS_US[name]
        flag = "ok" if med <= target else "MISS"
        print(f"{name:38s} {med:11.2f} {min(wrap):6.2f}..{max(wrap):6.2f} {target:5.0f} {flag:4s} "
              f"{statistics.median(prov):10.1f}")


if __name__ == "__main__":
    main()
