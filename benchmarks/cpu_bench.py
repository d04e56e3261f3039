"""The cpu backend's native providers against the torch code a user would write instead.

Run: python benchmarks/cpu_bench.py [--rounds 5] [--threads 1,2] [--only NAME ...] [--quick]

Each case pairs the library's public op (prepared inputs, the cpu backend, its "native" provider)
with the plain torch a user would otherwise write, in one process: every round times both (each
repeated until it has run >= 20 ms), and the table shows per side the median time with its
min-max over the rounds, and the median of the per-round ratios (baseline time / native time) with
its spread. Targets are those of issue 12. The thread count is set with torch.set_num_threads for
both sides. A benchmark, not a test: it prints only (and the date, torch version, CPU and load).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

import portable_kernels as pk
from portable_kernels.backends.cpu.native import topk as native_topk
from portable_kernels.dispatch import trace_providers
from portable_kernels.layouts import dequantize_fp8_kv_cache, pack_fp8_kv_cache
from portable_kernels.quantization import dequantize_reference, quantize_blocks_reference
from portable_kernels.fp4 import swiglu_forward_and_per_token_cast_reference
from portable_kernels.moe_routing.expand import expand_to_fused_reference
from portable_kernels.moe_routing.reduce import reduce_fused_reference

Fn = Callable[[], object]


def _timed(fn: Fn) -> float:
    """Seconds per call: repeat until >= 20 ms have passed (at least once)."""
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= 0.02:
            return elapsed / calls


def pair(native: Fn, baseline: Fn, rounds: int) -> dict:
    tn, tb, ratios = [], [], []
    for _ in range(rounds):
        a, b = _timed(native), _timed(baseline)
        tn.append(a)
        tb.append(b)
        ratios.append(b / a)
    return {"native": tn, "baseline": tb, "ratio": ratios}


# -- operand builders ------------------------------------------------------------------------------------

def _fp8_pair(m: int, n: int, k: int, ue8m0: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * k ** -0.5).bfloat16()
    a = pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0)
    b = pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0)
    return a, b


def _dequant_bf16(q) -> torch.Tensor:
    return dequantize_reference(q).bfloat16()


# -- cases: each returns (native, baseline, target ratio, note) ------------------------------------------

def gemm_decode(m: int, n: int = 2048, k: int = 7168):
    a, b = _fp8_pair(m, n, k)
    p = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = torch.empty(m, n, dtype=torch.bfloat16)

    def baseline():  # dequantize both operands every call, then matmul
        return torch.matmul(_dequant_bf16(a), _dequant_bf16(b).T)
    return (lambda: pk.fp8_gemm_nt(p["a"], p["b"], d)), baseline, 3.0, "vs per-call dequantize + matmul"


def gemm_prefill(m: int, n: int, k: int, ue8m0: bool = False):
    a, b = _fp8_pair(m, n, k, ue8m0)
    p = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    w_bf16 = _dequant_bf16(b)  # the weight dequantized once (a bf16 copy kept by the user)

    def baseline():
        return torch.matmul(_dequant_bf16(a), w_bf16.T)
    return (lambda: pk.fp8_gemm_nt(p["a"], p["b"], d)), baseline, 1.0, "vs bf16 weight dequantized once + matmul"


def gemm_bf16(m: int, n: int, k: int, out: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(n, k, generator=g).bfloat16()
    d = torch.empty(m, n, dtype=out)
    if out == torch.bfloat16:
        return (lambda: pk.bf16_gemm_nt(a, b, d)), (lambda: torch.matmul(a, b.T)), 0.95, "vs torch.matmul bf16"
    # fp32 out: the user upcasts (bf16 matmul cannot return fp32 on CPU)
    return (lambda: pk.bf16_gemm_nt(a, b, d)), (lambda: torch.matmul(a.float(), b.float().T)), 0.95, \
        "fp32 d vs torch.matmul in fp32"


def grouped(kind: str, g: int, rows: int, n: int, k: int):
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(g, n, k, generator=gen) * k ** -0.5).bfloat16()
    if kind == "masked":
        x = torch.randn(g, rows, k, generator=gen).bfloat16()
        masked_m = torch.full((g,), rows, dtype=torch.int32)
        a = pk.per_token_cast_to_fp8(x)
        b = pk.per_block_cast_to_fp8(w)
        p = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_masked, a=a, b=b)
        d = torch.empty(g, rows, n, dtype=torch.bfloat16)
        wd = _dequant_bf16(b)

        def baseline():
            ad = _dequant_bf16(a)
            return [torch.matmul(ad[i, :rows], wd[i].T) for i in range(g)]
        return (lambda: pk.m_grouped_fp8_gemm_nt_masked(p["a"], p["b"], d, masked_m, rows)), baseline, 1.0, \
            "fp8 vs loop of matmul (weights dequantized once)"
    x = torch.randn(g * rows, k, generator=gen).bfloat16()
    m_indices = torch.arange(g, dtype=torch.int32).repeat_interleave(rows)
    d = torch.empty(g * rows, n, dtype=torch.bfloat16)
    return (lambda: pk.m_grouped_bf16_gemm_nt_contiguous(x, w, d, m_indices)), \
        (lambda: [torch.matmul(x[i * rows:(i + 1) * rows], w[i].T) for i in range(g)]), 1.0, \
        "bf16 vs loop of matmul"


def mla(b: int, s_k: int, fp8: bool, sparse_topk: int | None = None, h_q: int = 128):
    gen = torch.Generator().manual_seed(3)
    block = 64
    blocks = b * (s_k // block)
    latent = torch.randn(blocks, block, 1, 512, generator=gen).bfloat16()
    rope = torch.randn(blocks, block, 1, 64, generator=gen).bfloat16()
    if fp8:
        cache = pack_fp8_kv_cache(latent, rope)
    else:
        cache = torch.cat((latent, rope), -1)
    table = torch.arange(blocks, dtype=torch.int32).view(b, -1)
    seqlens = torch.full((b,), s_k, dtype=torch.int32)
    q = (torch.randn(b, 1, h_q, 576, generator=gen) * 0.1).bfloat16()
    scale = 576 ** -0.5
    indices = None
    if sparse_topk is not None:
        picks = torch.stack([torch.randperm(s_k, generator=gen)[:sparse_topk] for _ in range(b)])
        indices = (table.long().repeat_interleave(block, 1).gather(1, picks) * block + picks % block)
        indices = indices.to(torch.int32)[:, None, :]
    meta, splits = pk.get_mla_metadata(seqlens, h_q, 1, h_q if indices is not None else None, fp8,
                                       None if indices is None else sparse_topk)

    def native():
        return pk.flash_mla_with_kvcache(q, cache, table, seqlens, 512, meta, splits, scale, False, fp8, indices)

    def baseline():  # gather (and dequantize) the keys, SDPA with the heads as query rows of the one latent head
        outs = []
        for i in range(b):
            if indices is not None:
                slots = indices[i, 0].long()
                tokens = cache.view(-1, *cache.shape[2:])[slots]
            else:
                tokens = cache[table[i].long()].flatten(0, 1)
            if fp8:
                tokens = dequantize_fp8_kv_cache(tokens, torch.bfloat16)
            kv = tokens[:, 0][None, None]
            outs.append(F.scaled_dot_product_attention(q[i].transpose(0, 1)[None], kv, kv[..., :512], scale=scale))
        return outs
    name = "sparse topk " + str(sparse_topk) if sparse_topk else "dense"
    return native, baseline, 1.5, f"{name}, vs gather + SDPA"


def topk_case(b: int, n: int, k: int, level: str):
    x = torch.randn(b, n, generator=torch.Generator().manual_seed(4))
    if level == "provider":
        return (lambda: native_topk.topk_native(x, k)), (lambda: torch.topk(x, k)), 1.0, "provider vs torch.topk"
    return (lambda: pk.topk(x, k)), (lambda: torch.topk(x, k)), 1.0, "public op vs torch.topk"


def cast_case(kind: str):
    x = torch.randn(4096, 7168, generator=torch.Generator().manual_seed(5)).bfloat16()
    if kind == "per-token":
        return (lambda: pk.per_token_cast_to_fp8(x)), (lambda: quantize_blocks_reference(x, 1, 128, False)), 1.5, \
            "vs today's reference"
    if kind == "per-block":
        return (lambda: pk.per_block_cast_to_fp8(x)), (lambda: quantize_blocks_reference(x, 128, 128, False)), 1.5, \
            "vs today's reference"
    y = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(6)).bfloat16()
    return (lambda: pk.swiglu_forward_and_per_token_cast(y)), \
        (lambda: swiglu_forward_and_per_token_cast_reference(y, 128, False)), 1.5, "vs today's reference"


def expand_reduce_case(kind: str):
    gen = torch.Generator().manual_seed(7)
    t, h, k, e = 4096, 7168, 8, 64
    topk_idx = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)]).to(torch.int64)
    mapping = pk.get_fused_mapping(topk_idx, e, 0, 128)
    pos_to_expert, token_topk_to_pos = mapping.pos_to_expert, mapping.token_topk_to_pos
    if kind == "expand":
        x = torch.randn(t, h, generator=gen).bfloat16()
        return (lambda: pk.expand_to_fused(x, mapping)), \
            (lambda: expand_to_fused_reference(x, token_topk_to_pos, pos_to_expert)), 1.5, "vs today's reference"
    rows = pos_to_expert.shape[0]
    y = torch.randn(rows, h, generator=gen).bfloat16()
    w = torch.rand(t, k, generator=gen)
    return (lambda: pk.reduce_fused(y, w, mapping)), \
        (lambda: reduce_fused_reference(y, w, token_topk_to_pos).bfloat16()), 1.5, "vs today's reference"


def cases(quick: bool) -> dict[str, Callable[[], tuple]]:
    c = {
        "fp8_gemm_nt decode M=1 N=2048 K=7168": lambda: gemm_decode(1),
        "fp8_gemm_nt decode M=16 N=2048 K=7168": lambda: gemm_decode(16),
        "fp8_gemm_nt M=128 N=2048 K=7168": lambda: gemm_prefill(128, 2048, 7168),
        "fp8_gemm_nt M=128 N=2048 K=7168 ue8m0": lambda: gemm_prefill(128, 2048, 7168, True),
        "fp8_gemm_nt M=512 N=7168 K=2048": lambda: gemm_prefill(512, 7168, 2048),
        "fp8_gemm_nt M=4096 N=4096 K=7168": lambda: gemm_prefill(4096, 4096, 7168),
        "bf16_gemm_nt M=128 N=2048 K=7168": lambda: gemm_bf16(128, 2048, 7168),
        "bf16_gemm_nt M=1024 N=4096 K=7168": lambda: gemm_bf16(1024, 4096, 7168),
        "bf16_gemm_nt fp32 d M=128 N=2048 K=7168": lambda: gemm_bf16(128, 2048, 7168, torch.float32),
        "m_grouped masked fp8 G=8 rows=16 N=4096 K=7168": lambda: grouped("masked", 8, 16, 4096, 7168),
        "m_grouped contiguous bf16 G=8 rows=256 N=2048 K=7168": lambda: grouped("contiguous", 8, 256, 2048, 7168),
        "mla bf16 b=1 s=32768": lambda: mla(1, 32768, False),
        "mla fp8 b=1 s=32768": lambda: mla(1, 32768, True),
        "mla bf16 b=64 s=1024": lambda: mla(64, 1024, False),
        "mla fp8 b=8 s=4096": lambda: mla(8, 4096, True),
        "mla fp8 sparse b=8 s=8192 topk=2048": lambda: mla(8, 8192, True, 2048),
        "topk 1x1024 k=8 (provider)": lambda: topk_case(1, 1024, 8, "provider"),
        "topk 1x1024 k=8": lambda: topk_case(1, 1024, 8, "public"),
        "topk 64x32768 k=2048": lambda: topk_case(64, 32768, 2048, "public"),
        "topk 1x131072 k=2048": lambda: topk_case(1, 131072, 2048, "public"),
        "per_token_cast_to_fp8 4096x7168": lambda: cast_case("per-token"),
        "per_block_cast_to_fp8 4096x7168": lambda: cast_case("per-block"),
        "swiglu+cast 4096x(2x2048)": lambda: cast_case("swiglu"),
        "expand_to_fused T=4096 H=7168 k=8": lambda: expand_reduce_case("expand"),
        "reduce_fused T=4096 H=7168 k=8": lambda: expand_reduce_case("reduce"),
    }
    if quick:
        c = {k: v for k, v in c.items() if not any(s in k for s in ("4096 N=4096", "M=1024", "b=64", "32768 k"))}
    return c


def encoder_cases() -> dict[str, tuple]:
    """(native encoder, torch encoder, input) per case: the formats prepare_inputs writes."""
    from portable_kernels.layouts import fp8_scales as ts
    from portable_kernels.layouts import nz as tnz
    from portable_kernels.native import layout_encoders as ne
    gen = torch.Generator().manual_seed(8)

    def pow2(*shape):
        return (torch.randint(100, 140, shape, generator=gen, dtype=torch.int32) << 23).view(torch.float32)
    w_sf, a_sf = pow2(56, 16), pow2(4096, 56)  # W 7168x2048 (128x128 blocks), A 4096x7168 (1x128)
    w8 = torch.randint(0, 256, (7168, 2048), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    return {
        "W 7168x2048 SM100 from blocks": (lambda: ne.sm100_ue8m0_encode_from_blocks(w_sf, 7168),
                                          lambda: ts.sm100_ue8m0_encode_from_blocks(w_sf, 7168), w_sf),
        "W 7168x2048 Ascend MX from blocks": (lambda: ne.ascend_mx_encode_from_blocks(w_sf, 7168, 2048),
                                              lambda: ts.ascend_mx_encode_from_blocks(w_sf, 7168, 2048), w_sf),
        "A 4096x7168 SM90 SFA": (lambda: ne.sm90_sfa_encode(a_sf), lambda: ts.sm90_sfa_encode(a_sf), a_sf),
        "A 4096x7168 SM100": (lambda: ne.sm100_ue8m0_encode_from_blocks(a_sf, 4096, 1),
                              lambda: ts.sm100_ue8m0_encode_from_blocks(a_sf, 4096, 1), a_sf),
        "A 4096x7168 Ascend MX K-major": (lambda: ne.ascend_mx_kmajor_encode_from_blocks(a_sf, 4096, 7168, 1, 128),
                                          lambda: ts.ascend_mx_kmajor_encode_from_blocks(a_sf, 4096, 7168, 1, 128),
                                          a_sf),
        "NZ fp8 7168x2048": (lambda: ne.nd_to_nz(w8), lambda: tnz.nd_to_nz(w8), w8),
    }


def _moved_bytes(inp: torch.Tensor, out: torch.Tensor) -> int:
    return inp.untyped_storage().nbytes() + out.untyped_storage().nbytes()


def run_encoders(rounds: int) -> None:
    print(f"{'layout encoder':36s} {'native us':>22s} {'torch us':>22s} {'clone us':>20s} "
          f"{'native/clone':>13s} {'torch/clone':>12s}  target native >= 0.5x clone")
    for name, (native, torch_fn, inp) in encoder_cases().items():
        if inp is None:
            continue
        buf = torch.empty(max(1, _moved_bytes(inp, native()) // 2), dtype=torch.uint8)
        tn, tt, tc = [], [], []
        for _ in range(rounds):
            tn.append(_timed(native))
            tt.append(_timed(torch_fn))
            tc.append(_timed(buf.clone))
        rn = statistics.median(tc) / statistics.median(tn)
        rt = statistics.median(tc) / statistics.median(tt)
        print(f"{name:36s} {_fmt(tn, 1e6):>22s} {_fmt(tt, 1e6):>22s} {_fmt(tc, 1e6):>20s} {rn:12.2f}x {rt:11.2f}x  "
              f"{'met' if rn >= 0.5 else 'MISSED'}", flush=True)


def small_call_us(rounds: int) -> list[float]:
    """Absolute time of one prepared 1x256x256 fp8_gemm_nt call (target <= 20 us)."""
    a, b = _fp8_pair(1, 256, 256)
    p = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = torch.empty(1, 256, dtype=torch.bfloat16)
    return [1e6 * _timed(lambda: pk.fp8_gemm_nt(p["a"], p["b"], d)) for _ in range(rounds)]


def _peak_rss_mib(fn: Fn) -> float:
    """Peak resident memory growth of one call, from /proc (Linux): clear_refs resets the peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    before = _status("VmRSS")
    fn()
    return (_status("VmHWM") - before) / 1024


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_memory() -> tuple[float, float]:
    """Peak memory (MiB) of fp8_gemm_nt 4096x4096x7168: native vs dequantize (fp32) + matmul."""
    a, b = _fp8_pair(4096, 4096, 7168)
    p = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    d = torch.empty(4096, 4096, dtype=torch.bfloat16)
    native = _peak_rss_mib(lambda: pk.fp8_gemm_nt(p["a"], p["b"], d))
    base = _peak_rss_mib(lambda: d.copy_(dequantize_reference(a) @ dequantize_reference(b).T))
    return native, base


def _fmt(ts: list[float], scale: float = 1e3) -> str:
    return f"{statistics.median(ts) * scale:9.3f} ({min(ts) * scale:.3f}-{max(ts) * scale:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}")
    parser.add_argument("--only", nargs="*", help="substrings of case names to run")
    parser.add_argument("--quick", action="store_true", help="skip the largest cases")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--no-encoders", action="store_true", help="skip the layout encoders")
    args = parser.parse_args()
    print(f"{datetime.datetime.now().isoformat(timespec='minutes')}  torch {torch.__version__}  "
          f"{platform.processor() or platform.machine()}  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.1f}")
    selected = cases(args.quick)
    if args.only:
        selected = {k: v for k, v in selected.items() if any(s in k for s in args.only)}
    header = f"{'case':52s} {'thr':>3s} {'native ms (min-max)':>24s} {'baseline ms (min-max)':>26s} " \
             f"{'ratio (min-max)':>20s} {'target':>7s}  provider"
    print(header)
    print("-" * len(header))
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name, make in selected.items():
            native, baseline, target, note = make()
            with trace_providers() as ran:
                native()
            provider = ",".join(sorted({r[2] for r in ran})) or "-"
            r = pair(native, baseline, args.rounds)
            ratio = statistics.median(r["ratio"])
            met = "met" if ratio >= target else "MISSED"
            print(f"{name:52s} {threads:3d} {_fmt(r['native']):>24s} {_fmt(r['baseline']):>26s} "
                  f"{ratio:7.2f} ({min(r['ratio']):.2f}-{max(r['ratio']):.2f}) {target:6.2f}x {met:6s} {provider} "
                  f"[{note}]", flush=True)
        us = small_call_us(args.rounds)
        print(f"{'fp8_gemm_nt 1x256x256 prepared call (us)':52s} {threads:3d} "
              f"{statistics.median(us):9.1f} ({min(us):.1f}-{max(us):.1f}) target <= 20 us "
              f"{'met' if statistics.median(us) <= 20 else 'MISSED'}", flush=True)
    if not args.no_encoders:
        torch.set_num_threads(int(args.threads.split(",")[0]))
        run_encoders(args.rounds)
    if not args.no_memory:
        native, base = peak_memory()
        print(f"peak memory fp8_gemm_nt 4096x4096x7168: native {native:.0f} MiB, dequantize+matmul {base:.0f} MiB "
              f"({'met' if native <= base else 'MISSED'})")


if __name__ == "__main__":
    main()
