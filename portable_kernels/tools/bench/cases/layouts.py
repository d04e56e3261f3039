"""Layout encoder cases: the per-chip byte encoders prepare_inputs runs, against a clone of the same bytes.

Each case reads its input and writes its output; the peer clones a uint8 buffer of half that many
bytes, so it moves as many bytes (read + write): ratio = clone time / encoder time, i.e. the
encoder's bandwidth as a fraction of a plain copy's (issue 12: >= 0.5 on 7168x2048). Every encoder
is timed twice where a native one exists: the torch encoder (`portable_kernels.layouts`, the
definition) and the native one prepare_inputs prefers (`portable_kernels.core.native.layout_encoders`,
CPU tensors only; elsewhere it hands the input to the torch encoder and the case says so). These
cases call no backend: the family runs once per device, not once per backend.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from portable_kernels import layouts as torch_enc
from portable_kernels.core.native import layout_encoders as native_enc

from ..case import FULL_ONLY, TINY, Case, Inputs, generator

FAMILY = "layouts"
TITLE = "layout encoders vs a torch clone of the same bytes"
#: the family does not depend on the backend in force: run it once per device
PER_BACKEND = False
SOURCE = "issue 12"
ON = ("cpu",)  # issue 12 set these targets for the cpu backend
BLOCK = 128


def _pow2_scales(*shape: int, seed: int) -> torch.Tensor:
    """Power-of-two fp32 scales (every exponent Format accepts them)."""
    return (torch.randint(100, 140, shape, generator=generator(seed), dtype=torch.int32) << 23).view(torch.float32)


def _nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _builder(make_input: Callable[[], torch.Tensor], encode: Callable[[torch.Tensor], Any], native: bool):
    def build(device: torch.device) -> Inputs:
        x = make_input().to(device)
        out = encode(x)
        moved = _nbytes(x) + _nbytes(out)
        i = Inputs(x=x, encode=encode, buf=torch.empty(max(1, moved // 2), dtype=torch.uint8, device=device),
                   bytes_moved=moved)
        if not native:
            i.provider = "torch encoder"
        elif device.type == "cpu" and native_enc.LIB.get() is not None:
            i.provider = "native encoder"
        else:
            i.provider = "torch encoder (native covers CPU tensors only)" if device.type != "cpu" else \
                f"torch encoder (native unavailable: {native_enc.LIB.reason()})"
        return i
    return build


def _case(what: str, shape: str, make_input, torch_fn, native_fn=None,
          sizes=frozenset({"quick", "full"})) -> list[Case]:
    """The torch encoder's case and, where a native encoder exists, the native one's."""
    out = []
    for kind, fn in (("torch", torch_fn), ("native", native_fn)):
        if fn is None:
            continue
        out.append(Case(FAMILY, f"{what} ({kind})", shape, _builder(make_input, fn, kind == "native"),
                        lambda i: i.encode(i.x), lambda i: i.buf.clone(), f"{kind} encoder",
                        "torch clone of the same bytes", target=0.5, target_source=SOURCE, target_on=ON, sizes=sizes))
    return out


def _weight(n: int, k: int, g: int | None = None, sizes=frozenset({"quick", "full"})) -> list[Case]:
    shape = (n // BLOCK, k // BLOCK) if g is None else (g, n // BLOCK, k // BLOCK)
    label = f"W {'' if g is None else f'{g}x'}{n}x{k}"
    sf = lambda: _pow2_scales(*shape, seed=60)
    return [
        *_case("SM90 SFB (as is)", label, sf, torch_enc.sm90_sfb_encode, sizes=sizes),
        *_case("SM100 from blocks", label, sf, lambda s: torch_enc.sm100_ue8m0_encode_from_blocks(s, n),
               lambda s: native_enc.sm100_ue8m0_encode_from_blocks(s, n), sizes=sizes),
        *_case("Ascend MX from blocks", label, sf, lambda s: torch_enc.ascend_mx_encode_from_blocks(s, n, k),
               lambda s: native_enc.ascend_mx_encode_from_blocks(s, n, k), sizes=sizes),
    ]


def _activation(m: int, k: int, sizes=frozenset({"quick", "full"})) -> list[Case]:
    label = f"A {m}x{k}"
    sf = lambda: _pow2_scales(m, k // BLOCK, seed=61)
    sf32 = lambda: torch_enc.regranularize_k(sf(), k, BLOCK, 32)
    return [
        *_case("SM90 SFA", label, sf, torch_enc.sm90_sfa_encode, native_enc.sm90_sfa_encode, sizes=sizes),
        *_case("SM100 int32 pack", label, sf, lambda s: torch_enc.sm100_ue8m0_encode_from_blocks(s, m, 1),
               lambda s: native_enc.sm100_ue8m0_encode_from_blocks(s, m, 1), sizes=sizes),
        *_case("Ascend MX K-major pairs", label, sf,
               lambda s: torch_enc.ascend_mx_kmajor_encode_from_blocks(s, m, k, 1, BLOCK),
               lambda s: native_enc.ascend_mx_kmajor_encode_from_blocks(s, m, k, 1, BLOCK), sizes=sizes),
        *_case("Ascend MX (1x32 given)", label, sf32, torch_enc.ascend_mx_encode, sizes=sizes),
    ]


def _data(n: int, k: int, sizes=frozenset({"quick", "full"})) -> list[Case]:
    label = f"{n}x{k}"
    w8 = lambda: torch.randint(0, 256, (n, k), generator=generator(62),
                               dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = lambda: torch.randint(0, 16, (n, k), generator=generator(63), dtype=torch.uint8)
    wf = lambda: torch.randn(n, k, generator=generator(64)).bfloat16()
    return [
        *_case("NZ fp8 tiles", label, w8, torch_enc.nd_to_nz, native_enc.nd_to_nz, sizes=sizes),
        *_case("FP4 pack codes", label, codes, torch_enc.pack_e2m1, sizes=sizes),
        *_case("FP4 e2m1_encode bf16", label, wf, torch_enc.e2m1_encode, sizes=sizes),
    ]


CASES = [
    *_weight(7168, 2048),
    *_weight(2048, 7168),
    *_weight(2048, 7168, g=32, sizes=FULL_ONLY),
    *_activation(4096, 7168),
    *_data(7168, 2048),
    *_weight(256, 512, sizes=TINY),
    *_activation(64, 512, sizes=TINY),
    *_data(64, 256, sizes=TINY),
]
