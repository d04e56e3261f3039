"""GEMM cases: fp8_gemm_nt and bf16_gemm_nt on DeepSeek-V3 shapes against torch.matmul.

Peers are what a user without the library writes: dequantize the FP8 operands (per call for a
decode step that keeps only the FP8 weight, or the weight once and kept in bf16 for larger M)
and call torch.matmul. Targets are issue 12's (cpu backend).

The "dequantized once" cases (issue 23, item 5) are the honest peer of a served model: the user
dequantizes every weight once at load and keeps the copy — in fp32 (4 bytes per weight element, 4x
the FP8 bytes) or in bf16 (2 bytes, 2x) — and multiplies the unquantized activation by it. Each
copy is its own case with the same target, so both being met is the target met against the faster.
"""

from __future__ import annotations

import torch

import portable_kernels as pk
from portable_kernels.ops.quant.fp8 import dequantize_reference

from ..case import FULL_ONLY, TINY, UE8M0_NOTE, Case, Inputs, needs_pow2_scales, seeded

FAMILY = "gemm"
TITLE = "GEMMs vs dequantize + torch.matmul"
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend


def _dequant_bf16(q) -> torch.Tensor:
    return dequantize_reference(q).bfloat16()


def _fp8_inputs(m: int, n: int, k: int, device: torch.device, ue8m0: bool = False) -> Inputs:
    x = seeded(m, k, seed=0, device=device)
    w = seeded(n, k, seed=1, device=device, scale=k ** -0.5)
    forced = not ue8m0 and needs_pow2_scales("fp8_gemm_nt")
    a = pk.per_token_cast_to_fp8(x, use_ue8m0=ue8m0 or forced)
    b = pk.per_block_cast_to_fp8(w, use_ue8m0=ue8m0 or forced)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    i = Inputs(a=a, b=b, pa=prepared["a"], pb=prepared["b"], d=torch.empty(m, n, dtype=torch.bfloat16, device=device))
    if forced:
        i.note = UE8M0_NOTE
    return i


def _fp8_op(i: Inputs) -> object:
    return pk.fp8_gemm_nt(i.pa, i.pb, i.d)


def _decode_peer(i: Inputs) -> object:  # only the FP8 weight is kept: dequantize both every call
    return torch.matmul(_dequant_bf16(i.a), _dequant_bf16(i.b).T)


def _build_prefill(m: int, n: int, k: int, ue8m0: bool):
    def build(device: torch.device) -> Inputs:
        i = _fp8_inputs(m, n, k, device, ue8m0)
        i.w_bf16 = _dequant_bf16(i.b)  # the weight dequantized once, a bf16 copy kept by the user
        return i
    return build


def _prefill_peer(i: Inputs) -> object:
    return torch.matmul(_dequant_bf16(i.a), i.w_bf16.T)


def _decode(m: int, n: int, k: int, sizes=frozenset({"quick", "full"}), limit_us: float | None = None,
            target: float | None = 3.0, name: str = "fp8_gemm_nt decode", memory: bool = False) -> Case:
    return Case(FAMILY, name, f"M={m} N={n} K={k}", lambda device: _fp8_inputs(m, n, k, device), _fp8_op,
                _decode_peer, "fp8_gemm_nt (prepared)", "dequantize A and B per call + torch.matmul",
                target=target, limit_us=limit_us, target_source=SOURCE, target_on=ON, sizes=sizes, memory=memory)


def _prefill(m: int, n: int, k: int, ue8m0: bool = False, sizes=frozenset({"quick", "full"}),
             memory: bool = False) -> Case:
    return Case(FAMILY, "fp8_gemm_nt" + (" ue8m0" if ue8m0 else ""), f"M={m} N={n} K={k}",
                _build_prefill(m, n, k, ue8m0), _fp8_op, _prefill_peer, "fp8_gemm_nt (prepared)",
                "dequantize A per call + torch.matmul with the bf16 weight dequantized once", target=1.0,
                target_source=SOURCE, target_on=ON, sizes=sizes, memory=memory)


#: the weight copy a dequantize-once user keeps, by dtype: (bytes per weight element, label)
ONCE_COPIES = {torch.float32: (4, "fp32"), torch.bfloat16: (2, "bf16")}
SOURCE_23 = "issue 23"


def _build_once(m: int, n: int, k: int, dtype: torch.dtype):
    def build(device: torch.device) -> Inputs:
        i = _fp8_inputs(m, n, k, device)
        i.w_once = dequantize_reference(i.b).to(dtype)   # dequantized once, at load; kept
        i.x = seeded(m, k, seed=0, device=device).to(dtype)  # the activation before quantization
        return i
    return build


def _once(m: int, n: int, k: int, dtype: torch.dtype, target: float, sizes=frozenset({"quick", "full"})) -> Case:
    """fp8_gemm_nt on prepared operands vs x @ w.T on a weight dequantized once and kept in `dtype`."""
    per_elem, label = ONCE_COPIES[dtype]
    copy_mib = n * k * per_elem / 2 ** 20
    return Case(FAMILY, f"fp8_gemm_nt vs {label} dequantized once", f"M={m} N={n} K={k}",
                _build_once(m, n, k, dtype), _fp8_op, lambda i: torch.matmul(i.x, i.w_once.T),
                "fp8_gemm_nt (prepared)",
                f"torch.matmul in {label} on the weight dequantized once (keeps a {copy_mib:.0f} MiB {label} copy, "
                f"{per_elem}x the FP8 bytes)", target=target, target_source=SOURCE_23, target_on=ON, sizes=sizes)


def _build_bf16(m: int, n: int, k: int, out: torch.dtype):
    def build(device: torch.device) -> Inputs:
        return Inputs(a=seeded(m, k, seed=2, device=device), b=seeded(n, k, seed=3, device=device),
                      d=torch.empty(m, n, dtype=out, device=device))
    return build


def _bf16(m: int, n: int, k: int, out: torch.dtype = torch.bfloat16, sizes=frozenset({"quick", "full"})) -> Case:
    if out == torch.bfloat16:
        return Case(FAMILY, "bf16_gemm_nt", f"M={m} N={n} K={k}", _build_bf16(m, n, k, out),
                    lambda i: pk.bf16_gemm_nt(i.a, i.b, i.d), lambda i: torch.matmul(i.a, i.b.T),
                    "bf16_gemm_nt", "torch.matmul in bf16", target=0.95, target_source=SOURCE, target_on=ON,
                    sizes=sizes)
    # fp32 d: the user upcasts, since a bf16 matmul cannot return fp32 on CPU
    return Case(FAMILY, "bf16_gemm_nt fp32 d", f"M={m} N={n} K={k}", _build_bf16(m, n, k, out),
                lambda i: pk.bf16_gemm_nt(i.a, i.b, i.d), lambda i: torch.matmul(i.a.float(), i.b.float().T),
                "bf16_gemm_nt (fp32 d)", "torch.matmul in fp32", target=0.95, target_source=SOURCE, target_on=ON,
                sizes=sizes)


def _hc_prenorm(m: int, n: int, k: int, splits: int | None, sizes=frozenset({"quick", "full"})) -> Case:
    """tf32_hc_prenorm_gemm against what a user writes: a widened to fp32 once, its product with b
    and its squared norm (splits summed, the form DeepGEMM's callers reduce to)."""
    def build(device: torch.device) -> Inputs:
        lead = () if splits is None else (splits,)
        return Inputs(a=seeded(m, k, seed=3, device=device, dtype=torch.bfloat16), b=seeded(n, k, seed=4, device=device, dtype=torch.float32),
                      d=torch.empty(*lead, m, n, device=device), s=torch.empty(*lead, m, device=device))

    def peer(i: Inputs) -> object:
        a = i.a.float()
        return a @ i.b.T, a.square().sum(-1)

    return Case(FAMILY, "tf32_hc_prenorm_gemm", f"M={m} N={n} K={k} splits={splits}", build,
                lambda i: pk.tf32_hc_prenorm_gemm(i.a, i.b, i.d, i.s, num_splits=splits), peer,
                "tf32_hc_prenorm_gemm", "a.float() @ b.T and a.float().square().sum(-1)", sizes=sizes)


CASES = [
    _decode(1, 2048, 7168),
    _decode(16, 2048, 7168),
    # a tiny prepared call: its absolute time is the target (Python overhead + kernel)
    _decode(1, 256, 256, limit_us=20.0, target=None, name="fp8_gemm_nt small call"),
    _prefill(128, 2048, 7168),
    _prefill(128, 2048, 7168, ue8m0=True),
    _prefill(512, 7168, 2048),
    _prefill(4096, 4096, 7168, sizes=FULL_ONLY, memory=True),
    # issue 12's memory target: peak growth <= the dequantize-everything way (no bf16 weight kept)
    _decode(4096, 4096, 7168, sizes=FULL_ONLY, target=None, name="fp8_gemm_nt vs per-call dequantize", memory=True),
    # issue 23's targets against the faster dequantize-once copy: memory-bound at M <= 16 (a quarter /
    # half of the bytes), compute-bound at M = 256
    *(_once(m, 2048, 7168, dtype, 2.5 if m <= 16 else 0.9) for m in (1, 16, 256) for dtype in ONCE_COPIES),
    _bf16(128, 2048, 7168),
    _bf16(1024, 4096, 7168, sizes=FULL_ONLY),
    _bf16(128, 2048, 7168, torch.float32),
    _hc_prenorm(4096, 24, 7168, None),
    _hc_prenorm(4096, 24, 7168, 16),
    # tiny: the machinery only
    _decode(2, 256, 256, sizes=TINY),
    _prefill(8, 128, 256, ue8m0=True, sizes=TINY, memory=True),
    _bf16(8, 128, 256, sizes=TINY),
    _once(2, 256, 256, torch.float32, 2.5, sizes=TINY),
    _hc_prenorm(8, 24, 256, 4, sizes=TINY),
]
