"""Native MoE routing of the cpu backend (C++ in routing.cpp): top2_sum_gate after the scores,
expand_to_fused(_with_sf) and reduce_fused, each one pass over its output, and get_fused_mapping as
one counting sort.

The gate's scores and ranking values (the contract's `score_reference` and `ranking_reference`:
sigmoid, sqrt(softplus) or softmax, plus the bias) are computed with torch, so they are the
reference's bit for bit and the selection that follows is identical; everything after them (group
scores, group and expert selection, normalisation, mask) runs in C++. Fixed routing
(fix_routing_mask) is left to the reference (the provider declines it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.ops.moe_routing.gate import ranking_reference, score_reference
from portable_kernels.core.native.build import F32, I32, I64, PTR, NativeLibrary, num_threads, register_library

from .._names import BACKEND, NATIVE
from . import _checks as chk

LIB = register_library(NativeLibrary("cpu_routing", Path(__file__).parent.parent / "kernels" / "routing.cpp", {
    "pk_top2_sum_gate": [PTR, PTR, I64, I64, I64, I64, I64, F32, I32, PTR, PTR, PTR, I32],
    "pk_expand": [PTR, I64, I64, I64, PTR, I64, I64, I64, PTR, I32, I64, PTR, I64, I64, PTR, I64, I64, I32],
    "pk_reduce": [PTR, I32, I64, I64, PTR, PTR, PTR, I32, I64, I64, PTR, I32, PTR, I32],
    "pk_fused_mapping": [PTR, I32, I64, I64, I64, I64, I64, PTR, PTR, PTR, PTR, PTR, PTR, PTR],
}, returns={"pk_fused_mapping": I32}, owner=BACKEND))

INDEX_DTYPES = (torch.int32, torch.int64)


def _lib(op: str):
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native routing unavailable: {LIB.reason()}")
    return lib


def top2_sum_gate_native(logits: torch.Tensor, bias: torch.Tensor | None, num_topk: int, num_topk_groups: int,
                         num_groups: int, routed_scaling_factor: float = 1.0, scoring_func: str = "sigmoid",
                         normalize: bool = True,
                         mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits fp32 [T, E] -> (topk_idx int64 [T, k], topk_weights fp32 [T, k]), the DeepSeek-V3 gate."""
    op = "top2_sum_gate"
    lib = _lib(op)
    chk.tensor(op, "logits", logits, (torch.float32,), None, "pass fp32 [T, E]")
    if logits.dim() != 2:
        chk.fail(op, "logits", f"{logits.dim()}-D", "[T, E]", "pass a 2-D tensor")
    t, e = logits.shape
    if not 1 <= num_topk <= e:
        chk.fail(op, "num_topk", num_topk, f"1..{e}", "choose at most E experts")
    if num_groups and (e % num_groups or not 1 <= num_topk_groups <= num_groups):
        chk.fail(op, "num_groups", num_groups, "a divisor of E with 1 <= num_topk_groups <= num_groups",
                 "pass DeepSeek-V3's grouping (e.g. 8 groups, 4 kept)")
    if bias is not None:
        chk.tensor(op, "bias", bias, (torch.float32,), (e,), "pass fp32 [E]")
        bias = bias.contiguous()
    if mask is not None:
        chk.tensor(op, "mask", mask, (torch.bool,), (t,), "pass bool [T]")
        mask = mask.contiguous()
    scores = score_reference(logits, scoring_func).contiguous()
    ranked = ranking_reference(logits, scores, bias, scoring_func).contiguous()
    idx = torch.empty(t, num_topk, dtype=torch.int64)
    weights = torch.empty(t, num_topk, dtype=torch.float32)
    if t:
        lib.pk_top2_sum_gate(ranked.data_ptr(), scores.data_ptr(), t, e, num_topk, num_topk_groups, num_groups,
                             float(routed_scaling_factor), int(normalize),
                             None if mask is None else mask.data_ptr(), idx.data_ptr(), weights.data_ptr(),
                             num_threads())
    return idx, weights


def _row_bytes(op: str, arg: str, t: torch.Tensor) -> int:
    """Row stride in bytes of a 2-D tensor with unit stride along its rows."""
    if t.dim() != 2 or (t.shape[1] > 1 and t.stride(1) != 1):
        chk.fail(op, arg, f"with strides {t.stride()}", "a 2-D tensor with unit stride along dim 1",
                 f"pass {arg}.contiguous()")
    return (t.stride(0) if t.shape[0] > 1 else t.shape[1]) * t.element_size()


def expand_native(x: torch.Tensor, x_sf: torch.Tensor | None, token_topk_to_pos: torch.Tensor, out: torch.Tensor,
                  out_sf: torch.Tensor | None) -> None:
    """out[p] = x[token mapped to p] bit for bit (and out_sf likewise), zero rows elsewhere.
    x [T, H] any dtype; x_sf None or [T, S]; token_topk_to_pos int32/int64 [T, k]; out [P, H] of x's
    dtype and out_sf [P, S] of x_sf's, each with unit stride along dim 1 (any row stride)."""
    op = "expand_to_fused"
    lib = _lib(op)
    chk.tensor(op, "token_topk_to_pos", token_topk_to_pos, INDEX_DTYPES, None, "pass get_fused_mapping's output")
    ttp = token_topk_to_pos.contiguous()
    t, k = ttp.shape
    if x.dim() != 2 or x.shape[0] != t or out.dim() != 2 or out.shape[1] != x.shape[1] or out.dtype != x.dtype:
        chk.fail(op, "out", chk.describe(out), f"[P, {x.shape[-1]}] of {x.dtype} for x {tuple(x.shape)}",
                 "allocate out like the fused buffer")
    sf_args = (None, 0, 0, 0)
    out_sf_args = (None, 0, 0)
    if (x_sf is None) != (out_sf is None):
        chk.fail(op, "out_sf", chk.describe(out_sf), "given exactly when x_sf is", "pass both scales or neither")
    if x_sf is not None:
        if x_sf.shape[0] != t or out_sf.shape != (out.shape[0], x_sf.shape[1]) or out_sf.dtype != x_sf.dtype:
            chk.fail(op, "out_sf", chk.describe(out_sf), f"[P, {x_sf.shape[1]}] of {x_sf.dtype}", "allocate it so")
        if x_sf.element_size() != 4 or x_sf.dim() != 2:
            chk.fail(op, "x_sf", chk.describe(x_sf), "fp32 [T, S]", "pass per-token fp32 scales")
        # scales may have any strides (e.g. MN-major, TMA-aligned): pass them in bytes
        sf_args = (x_sf.data_ptr(), x_sf.shape[1], x_sf.stride(0) * 4, x_sf.stride(1) * 4)
        out_sf_args = (out_sf.data_ptr(), out_sf.stride(0) * 4, out_sf.stride(1) * 4)
    row_bytes = x.shape[1] * x.element_size()
    lib.pk_expand(x.data_ptr(), t, row_bytes, _row_bytes(op, "x", x), *sf_args, ttp.data_ptr(),
                  int(ttp.dtype == torch.int64), k, out.data_ptr(), out.shape[0], _row_bytes(op, "out", out),
                  *out_sf_args, num_threads())


def reduce_native(x: torch.Tensor, x_sf: torch.Tensor | None, topk_weights: torch.Tensor | None,
                  token_topk_to_pos: torch.Tensor, sf: torch.Tensor | None, fp8: bool, out: torch.Tensor) -> None:
    """out[t] = Σ_j x[pos[t, j]]·w[t, j](·x_sf[pos]) in fp32, then (fp8) ·sf and clamped to ±448.
    x bf16/fp32 [P, H]; out contiguous [T, H] in x's dtype, or fp8 e4m3 when fp8."""
    op = "reduce_fused"
    lib = _lib(op)
    chk.tensor(op, "x", x, (torch.bfloat16, torch.float32), None, "pass bf16/fp32 [P, H]")
    x = x.contiguous()
    chk.tensor(op, "token_topk_to_pos", token_topk_to_pos, INDEX_DTYPES, None, "pass get_fused_mapping's output")
    ttp = token_topk_to_pos.contiguous()
    p, h = x.shape
    t, k = ttp.shape
    want = torch.float8_e4m3fn if fp8 else x.dtype
    chk.tensor(op, "out", out, (want,), (t, h), f"allocate out as {want} [{t}, {h}]")
    chk.contiguous(op, "out", out)
    if x_sf is not None:
        chk.tensor(op, "x_sf", x_sf, (torch.float32,), (p,), "pass fp32 [P]")
        x_sf = x_sf.contiguous()
    if topk_weights is not None:
        chk.tensor(op, "topk_weights", topk_weights, (torch.float32,), (t, k), "pass fp32 [T, k]")
        topk_weights = topk_weights.contiguous()
    if sf is not None:
        chk.tensor(op, "sf", sf, (torch.float32,), (1,), "pass fp32 [1]")
    kind = 2 if fp8 else (1 if x.dtype == torch.bfloat16 else 0)
    if t and h:
        lib.pk_reduce(x.data_ptr(), int(x.dtype == torch.bfloat16), p, h, chk.ptr(x_sf), chk.ptr(topk_weights),
                      ttp.data_ptr(), int(ttp.dtype == torch.int64), t, k, chk.ptr(sf), kind, out.data_ptr(),
                      num_threads())


def fused_mapping_native(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int,
                         alignment: int) -> tuple[torch.Tensor, ...]:
    """get_fused_mapping's seven int32 tensors (see fused_mapping_reference) by a counting sort."""
    op = "get_fused_mapping"
    lib = _lib(op)
    chk.tensor(op, "topk_idx", topk_idx, INDEX_DTYPES, None, "pass int64 [T, k] expert ids")
    if topk_idx.dim() != 2:
        chk.fail(op, "topk_idx", f"{topk_idx.dim()}-D", "[T, k]", "pass a 2-D tensor")
    idx = topk_idx.contiguous()
    t, k = idx.shape
    p, e = num_expanded_tokens, num_experts
    rows = [torch.empty(p, dtype=torch.int32) for _ in range(3)]
    per_expert = [torch.empty(e, dtype=torch.int32) for _ in range(3)]
    token_topk_to_pos = torch.empty(t, k, dtype=torch.int32)
    status = lib.pk_fused_mapping(idx.data_ptr(), int(idx.dtype == torch.int64), t, k, e, p, alignment,
                                  *(r.data_ptr() for r in rows), token_topk_to_pos.data_ptr(),
                                  *(x.data_ptr() for x in per_expert))
    if status == -1:
        chk.fail(op, "topk_idx", "naming experts >= num_experts", f"values < {e} (negative = padding)",
                 "pass the total expert count, or mask foreign experts with -1")
    if status == -2:
        chk.fail(op, "num_expanded_tokens", p, "at least the aligned segments' rows", "pass 0 to size it exactly")
    return (*rows, token_topk_to_pos, *per_expert)


# -- providers ---------------------------------------------------------------------------------------------

def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native routing unavailable: {LIB.reason()}"]


def _unit_inner(call) -> bool:
    """Data rows have unit inner stride (scales may have any strides)."""
    return all(t.dim() != 2 or t.shape[1] <= 1 or t.stride(1) == 1 for t in (call.x, call.out))


def register(registry) -> None:
    from portable_kernels.ops.moe_routing.expand import EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF
    from portable_kernels.ops.moe_routing.gate import TOP2_SUM_GATE
    from portable_kernels.ops.moe_routing.mapping import GET_FUSED_MAPPING
    from portable_kernels.ops.moe_routing.reduce import REDUCE_FUSED
    registry.kernel(TOP2_SUM_GATE.name, BACKEND, NATIVE, priority=10, devices=("cpu",),
                    check=lambda c: _available(c) + ([] if c.fix_routing_mask is None else
                                                     ["fixed routing (fix_routing_mask) runs in the reference"]),
                    doc="scores by torch, then selection and weights in C++ (deepjit)")(
        lambda c: top2_sum_gate_native(c.logits, c.bias, c.num_topk, c.num_topk_groups, c.num_groups,
                                       c.routed_scaling_factor, c.scoring_func, c.normalize, c.mask))
    for contract in (EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF):
        registry.kernel(contract.name, BACKEND, NATIVE, priority=10, devices=("cpu",),
                        check=lambda c: _available(c) + ([] if _unit_inner(c) else
                                                         ["x or out has a non-unit stride along H"]),
                        shape_class=_unit_inner, doc="C++ (deepjit): one pass over the output rows")(
            lambda c: expand_native(c.x, c.x_sf, c.token_topk_to_pos, c.out, c.out_sf))
    registry.kernel(REDUCE_FUSED.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): fp32 sums, one pass over each token's rows")(
        lambda c: reduce_native(c.x, c.x_sf, c.topk_weights, c.token_topk_to_pos, c.sf, c.fp8, c.out))
    registry.kernel(GET_FUSED_MAPPING.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): one counting sort over (token, slot)")(
        lambda c: fused_mapping_native(c.topk_idx, c.num_experts, c.num_expanded_tokens, c.alignment))
