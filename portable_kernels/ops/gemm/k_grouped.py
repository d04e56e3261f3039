"""K-grouped GEMMs (DeepGEMM names and argument order): the weight-gradient GEMMs of MoE training,
one [M, N] output per group, each summing over that group's own slice of K.

    k_grouped_fp8_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), *,
                                     use_psum_layout=False)
        a (fp8 [sum_K, M], fp32 [sum_kb, M]), b (fp8 [sum_K, N], fp32 [sum_kb, N]) -> for every group g
        d[g] = c[g] + A_gᵀ·B_g with A_g = the rows of group g (dequantized), d fp32 [G, M, N]
    k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128))
        a: flat fp8 [sum_K·M] holding each group's A_g as [M, K_g] row-major one after another, with
        scales fp32 [M, sum_kb] (a transposed view of [sum_kb, M]); b likewise with N; d[g] = c[g] + A_g·B_gᵀ
    k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks_cpu, grouped_layout, c=None, *, use_psum_layout=False)

Groups: without the psum layout, group g is the K_g = ks_cpu[g] consecutive rows after the previous
group (grouped_layout holds the same K_g, int32 [G]; each a multiple of the contiguous alignment,
as DeepGEMM requires). With `use_psum_layout`, grouped_layout holds cumulative end rows and group g
is [align(end[g-1], alignment), end[g]) — ks_cpu may then be None or [] (the op reads the layout).
The alignment is `get_mk_alignment_for_contiguous_layout()` (settable, shared with the m-grouped GEMMs).
Scales: per (gran_k rows, 1 column) inside each group, ceil(K_g / gran_k) rows per group, compact
(per_channel_cast_to_fp8 of every group's slice, concatenated). An empty group gives d[g] = c[g].

The operands are plain tensors, not Formats: per-group K blocks are not a uniform granularity, so
there is no prepared form yet (DeepGEMM packs them per group on SM100; that byte format is not here).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_bool, check_tensor, is_int
from ...core.alignment import contiguous_alignment
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, checks_values, public_op, register_contract
from ...core.dispatch import run, selection_for
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ...core.tensors import FP8_DTYPE, cdiv, describe

INDEX_DTYPE = torch.int32
#: K granularities of the per-channel scales (DeepGEMM: 32 or 128)
GRAN_KS = (32, 128)
LAYOUTS = ("tn", "nt")


@attrs.frozen
class KGroupedInputs(Inputs):
    """One K-grouped GEMM call (validated): a, b fp8 (tn: [sum_K, M] / [sum_K, N]; nt: flat) or bf16
    [sum_K, M] / [sum_K, N]; sfa, sfb fp32 scales (None for bf16); d fp32 [G, M, N]; c None or fp32
    [G, M, N]; grouped_layout int32 [G] (K sizes, or psum end rows); ks: the K sizes as Python ints
    when the caller gave them (else None); use_psum_layout; alignment: the group-start alignment of
    the psum form; gran_k; layout "tn" or "nt". A provider writes d."""

    a: torch.Tensor
    sfa: torch.Tensor | None
    b: torch.Tensor
    sfb: torch.Tensor | None
    d: torch.Tensor
    c: torch.Tensor | None
    grouped_layout: torch.Tensor
    ks: tuple | None
    use_psum_layout: bool
    alignment: int
    gran_k: int
    layout: str
    device_field = "d"

    def dims(self) -> dict[str, int]:
        g, m, n = self.d.shape
        return {"G": g, "M": m, "N": n, "alignment": self.alignment, "gran_k": self.gran_k}

    def signature(self) -> tuple:
        """As every inputs value's, without `ks`: the K sizes are sizes, not a selection key."""
        return Inputs.signature(self.replace(ks=None))


def group_spans(grouped_layout: torch.Tensor, ks: tuple | None, use_psum_layout: bool,
                alignment: int) -> list[tuple[int, int]]:
    """(first row, K_g) of every group, read from ks when given, else from grouped_layout (host read)."""
    if not use_psum_layout:
        sizes = list(ks) if ks is not None else [int(v) for v in grouped_layout.tolist()]
        starts, total = [], 0
        for size in sizes:
            starts.append(total)
            total += size
        return list(zip(starts, sizes))
    spans, previous = [], 0
    for end in (int(v) for v in grouped_layout.tolist()):
        start = cdiv(previous, alignment) * alignment
        spans.append((start, end - start))
        previous = end
    return spans


def _expand_rows(scale: torch.Tensor, gran_k: int, rows: int) -> torch.Tensor:
    return scale.repeat_interleave(gran_k, dim=0)[:rows]


def k_grouped_reference(call: KGroupedInputs) -> torch.Tensor:
    """The contract math: fp32 [G, M, N], group by group (dequantized operands)."""
    g, m, n = call.d.shape
    out = torch.zeros(g, m, n, dtype=torch.float32, device=call.d.device) if call.c is None else call.c.float().clone()
    sf_row = 0
    for group, (start, size) in enumerate(group_spans(call.grouped_layout, call.ks, call.use_psum_layout,
                                                      call.alignment)):
        blocks = cdiv(size, call.gran_k)
        if size == 0:
            continue
        if call.layout == "tn":
            a, b = call.a[start:start + size].float(), call.b[start:start + size].float()      # [K_g, M], [K_g, N]
            if call.sfa is not None:
                a = a * _expand_rows(call.sfa[sf_row:sf_row + blocks], call.gran_k, size)
                b = b * _expand_rows(call.sfb[sf_row:sf_row + blocks], call.gran_k, size)
            out[group] += a.T @ b
        else:
            a = call.a[m * start:m * (start + size)].view(m, size).float()                     # [M, K_g]
            b = call.b[n * start:n * (start + size)].view(n, size).float()                     # [N, K_g]
            a = a * _expand_rows(call.sfa[:, sf_row:sf_row + blocks].T, call.gran_k, size).T
            b = b * _expand_rows(call.sfb[:, sf_row:sf_row + blocks].T, call.gran_k, size).T
            out[group] += a @ b.T
        sf_row += blocks
    return out


def k_grouped_gemm_kernel(call: KGroupedInputs) -> None:
    """Reference kernel of the K-grouped GEMMs: writes d."""
    if call.d.numel():
        call.d.copy_(k_grouped_reference(call))


K_GROUPED_FP8_TN = register_contract(OpContract(
    "k_grouped_fp8_gemm_tn_contiguous", k_grouped_reference, Tolerance(dequantized=1e-6, unquantized=1e-3),
    kernel=k_grouped_gemm_kernel))
K_GROUPED_FP8_NT = register_contract(OpContract(
    "k_grouped_fp8_gemm_nt_contiguous", k_grouped_reference, Tolerance(dequantized=1e-6, unquantized=1e-3),
    kernel=k_grouped_gemm_kernel))
K_GROUPED_BF16_TN = register_contract(OpContract(
    "k_grouped_bf16_gemm_tn_contiguous", k_grouped_reference, Tolerance(dequantized=1e-6, unquantized=1e-5),
    kernel=k_grouped_gemm_kernel))


# -- validation ----------------------------------------------------------------------------------------

def _ks(op: str, ks_cpu: Any, groups: int, use_psum_layout: bool) -> tuple | None:
    if ks_cpu is None or (use_psum_layout and isinstance(ks_cpu, (list, tuple)) and len(ks_cpu) == 0):
        if not use_psum_layout:
            raise ContractError(format_problem(op, "ks_cpu", repr(ks_cpu), "the K of every group as Python ints",
                                               "pass ks_cpu (it may be None or [] only with use_psum_layout=True)"))
        return None
    if not isinstance(ks_cpu, (list, tuple)) or len(ks_cpu) != groups or not all(is_int(k) and k >= 0 for k in ks_cpu):
        raise ContractError(format_problem(op, "ks_cpu", repr(ks_cpu), f"a list of {groups} ints >= 0",
                                           "pass one K per group (d.shape[0] groups)"))
    return tuple(int(k) for k in ks_cpu)


def _check_layout_values(op: str, grouped_layout: torch.Tensor, ks: tuple | None, use_psum_layout: bool,
                         alignment: int, total_rows: int) -> list[tuple[int, int]] | None:
    """The spans, checked against each other and against the rows of a (None when unreadable here)."""
    if not checks_values(grouped_layout) and (use_psum_layout or ks is None):
        return None  # the spans live on the device; reading them would synchronize
    if checks_values(grouped_layout):
        values = [int(v) for v in grouped_layout.tolist()]
        if not use_psum_layout and ks is not None and tuple(values) != ks:
            raise ContractError(format_problem(op, "grouped_layout", str(values), f"the K sizes of ks_cpu {list(ks)}",
                                               "pass torch.tensor(ks_cpu, dtype=torch.int32)"))
        if use_psum_layout and any(end < cdiv(prev, alignment) * alignment for prev, end in zip([0] + values, values)):
            raise ContractError(format_problem(op, "grouped_layout", f"the psum layout {values}",
                                               f"end rows, each >= the previous rounded up to {alignment}",
                                               "build it as end[g] = align(end[g-1], alignment) + K_g"))
    spans = group_spans(grouped_layout, ks, use_psum_layout, alignment)
    if not use_psum_layout and any(size % alignment for _, size in spans):
        raise ContractError(format_problem(op, "ks_cpu", str([size for _, size in spans]),
                                           f"multiples of the contiguous alignment {alignment}",
                                           "pad every group's K to the alignment (zero rows), as DeepGEMM requires"))
    end = max((start + size for start, size in spans), default=0)
    if (use_psum_layout and end > total_rows) or (not use_psum_layout and end != total_rows):
        raise ContractError(format_problem(op, "a", f"with {total_rows} rows of K",
                                           f"{'at least ' if use_psum_layout else ''}{end} rows (the groups' K)",
                                           "pass operands holding every group's rows"))
    return spans


def _check_recipe(op: str, recipe: Any, layout: str) -> int:
    if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3 and tuple(recipe[:2]) == (1, 1)
            and recipe[2] in GRAN_KS) or (layout == "nt" and tuple(recipe) != (1, 1, 128)):
        allowed = "(1, 1, 128)" if layout == "nt" else "(1, 1, 32) or (1, 1, 128)"
        raise ContractError(format_problem(op, "recipe", repr(recipe), allowed,
                                           "quantize per channel (per_channel_cast_to_fp8) with that gran_k"))
    return int(recipe[2])


def _split(op: str, arg: str, value: Any, fp8: bool) -> tuple[Any, Any]:
    if not fp8:
        return value, None
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ContractError(format_problem(op, arg, describe(value), "a (fp8 data, fp32 scale) pair",
                                           "quantize every group with per_channel_cast_to_fp8"))
    return value[0], value[1]


def _check_data(op: str, arg: str, data: Any, mn: int, layout: str, fp8: bool, device: torch.device) -> int:
    """Checks one operand's data; returns its sum_K."""
    dtype = FP8_DTYPE if fp8 else torch.bfloat16
    name = "fp8" if fp8 else "bf16"
    if layout == "tn":
        check_tensor(op, arg, data, (dtype,), (None, mn), device, f"pass {arg} as {name} [sum_K, {mn}]")
        return data.shape[0]
    check_tensor(op, arg, data, (dtype,), (None,), device, f"pass {arg} as the flat {name} [sum_K * {mn}] data")
    if mn and data.numel() % mn:
        raise ContractError(format_problem(op, arg, f"of {data.numel()} elements", f"a multiple of {mn}",
                                           "store every group's [MN, K_g] block whole"))
    return data.numel() // mn if mn else 0


def _check_scale(op: str, arg: str, scale: Any, mn: int, rows: int | None, layout: str, device: torch.device) -> None:
    if layout == "tn":
        check_tensor(op, f"{arg} scale", scale, (torch.float32,), (rows, mn), device,
                     f"pass fp32 [sum of ceil(K_g/gran_k), {mn}] per-channel scales")
    else:
        check_tensor(op, f"{arg} scale", scale, (torch.float32,), (mn, rows), device,
                     f"pass fp32 [{mn}, sum of ceil(K_g/gran_k)] scales (the transposed per-channel scales)")


def _run(contract: OpContract, layout: str, fp8: bool, a: Any, b: Any, d: torch.Tensor, ks_cpu: Any,
         grouped_layout: Any, c: Any, recipe: Any, use_psum_layout: bool) -> None:
    op = contract.name
    check_tensor(op, "d", d, (torch.float32,), (None, None, None), fix="allocate d = torch.empty(G, M, N) in fp32")
    if not d.is_contiguous():
        raise ContractError(format_problem(op, "d", f"non-contiguous (strides {d.stride()})", "contiguous",
                                           "pass a contiguous [G, M, N] buffer"))
    groups, m, n = d.shape
    device = d.device
    if c is not None:
        check_tensor(op, "c", c, (torch.float32,), (groups, m, n), device, "pass c as fp32 [G, M, N] (or None)")
    check_bool(op, "use_psum_layout", use_psum_layout)
    if layout == "nt" and use_psum_layout:
        raise ContractError(format_problem(op, "use_psum_layout", "True", "False (the nt form has no psum layout, "
                                           "as in DeepGEMM)", "use k_grouped_fp8_gemm_tn_contiguous for psum layouts"))
    check_tensor(op, "grouped_layout", grouped_layout, (INDEX_DTYPE,), (groups,), device,
                 "pass torch.tensor(ks_cpu, dtype=torch.int32) (or the psum end rows)")
    ks = _ks(op, ks_cpu, groups, use_psum_layout)
    gran_k = _check_recipe(op, recipe, layout) if fp8 else 1
    (a_data, sfa), (b_data, sfb) = _split(op, "a", a, fp8), _split(op, "b", b, fp8)
    rows = _check_data(op, "a", a_data, m, layout, fp8, device)
    if _check_data(op, "b", b_data, n, layout, fp8, device) != rows:
        raise ContractError(format_problem(op, "b", f"{describe(b_data)}", f"sum_K = {rows} rows of K like a",
                                           "pass A and B over the same K rows"))
    probe = KGroupedInputs(a_data, sfa, b_data, sfb, d, c, grouped_layout, ks, use_psum_layout, 0, gran_k, layout)
    alignment = contiguous_alignment(selection_for(contract, probe).backend)
    spans = _check_layout_values(op, grouped_layout, ks, use_psum_layout, alignment, rows)
    if fp8:
        scale_rows = None if spans is None else sum(cdiv(size, gran_k) for _, size in spans)
        _check_scale(op, "a", sfa, m, scale_rows, layout, device)
        _check_scale(op, "b", sfb, n, scale_rows, layout, device)
    run(contract, attrs.evolve(probe, alignment=alignment))


# -- public ops ----------------------------------------------------------------------------------------

@public_op(K_GROUPED_FP8_TN)
def k_grouped_fp8_gemm_tn_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int] | None,
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple[int, int, int] = (1, 1, 128), *,
                                     use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_gᵀ·B_g per group over its K rows (see the module docstring for the layouts).

    a: (fp8 [sum_K, M], fp32 [sum_g ceil(K_g/gran_k), M]); b: likewise with N; d: fp32 [G, M, N]
    ks_cpu: K of each group (Python ints); grouped_layout: int32 [G], the same K (or psum end rows)
    c: None or fp32 [G, M, N] (may be d itself); recipe: (1, 1, gran_k), gran_k 32 or 128
    """
    if is_compiling():
        return compiled_call("k_grouped_fp8_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c, recipe,
                             use_psum_layout=use_psum_layout)
    _run(K_GROUPED_FP8_TN, "tn", True, a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout)


@public_op(K_GROUPED_FP8_NT)
def k_grouped_fp8_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, ks_cpu: list[int],
                                     grouped_layout: torch.Tensor, c: torch.Tensor | None = None,
                                     recipe: tuple[int, int, int] = (1, 1, 128), *,
                                     use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_g·B_gᵀ per group, A_g [M, K_g] and B_g [N, K_g] stored K-major one after another.

    a: (flat fp8 [sum_K * M], fp32 [M, sum_g ceil(K_g/128)]); b likewise with N; d fp32 [G, M, N];
    ks_cpu / grouped_layout: K of each group; use_psum_layout must stay False (no psum form, as in
    DeepGEMM); recipe: (1, 1, 128)
    """
    if is_compiling():
        return compiled_call("k_grouped_fp8_gemm_nt_contiguous", a, b, d, ks_cpu, grouped_layout, c, recipe,
                             use_psum_layout=use_psum_layout)
    _run(K_GROUPED_FP8_NT, "nt", True, a, b, d, ks_cpu, grouped_layout, c, recipe, use_psum_layout)


@public_op(K_GROUPED_BF16_TN)
def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks_cpu: list[int] | None,
                                      grouped_layout: torch.Tensor, c: torch.Tensor | None = None, *,
                                      use_psum_layout: bool = False) -> None:
    """d[g] = c[g] + A_gᵀ·B_g in bf16 with fp32 accumulation: a bf16 [sum_K, M], b bf16 [sum_K, N],
    d fp32 [G, M, N]; ks_cpu / grouped_layout / use_psum_layout as in k_grouped_fp8_gemm_tn_contiguous."""
    if is_compiling():
        return compiled_call("k_grouped_bf16_gemm_tn_contiguous", a, b, d, ks_cpu, grouped_layout, c,
                             use_psum_layout=use_psum_layout)
    _run(K_GROUPED_BF16_TN, "tn", False, a, b, d, ks_cpu, grouped_layout, c, None, use_psum_layout)
