"""Grouped GEMM op family for MoE (DeepGEMM names and argument order): every group has its own B.

Contiguous: `m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)` — A [M, K] holds the rows of all
groups back to back, B [G, N, K], D [M, N]; row r of D is A[r]·B[m_indices[r]]ᵀ. With
`use_psum_layout=True` the fourth argument is DeepGEMM's psum `grouped_layout` [G] instead.
Masked: `m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m)` — A [G, max_m, K],
D [G, max_m, N]; only the first masked_m[g] rows of group g count. bf16 twins of both.

Padding rows: providers never write them. The contiguous ops then zero them (m_indices -1, psum
gaps and every row from psum[-1] on) with one device op when `ensure_zero_padding=True` (the
default, as DeepGEMM), or leave them as d held with False; rows >= masked_m[g] of the masked form
are always left as they were. The segment alignment is the backend's, or the process-wide value of
`set_mk_alignment_for_contiguous_layout` (see core/alignment.py). Data-dependent checks (the values
of m_indices, psum and masked_m) run when those tensors live on the CPU; on an accelerator they are
skipped, because reading them would synchronize the device, and a wrong layout there gives
unspecified rows.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_bool
from ...core.compiled import compiled_call, is_compiling
from ...core.alignment import contiguous_alignment, padding_rows
from ...core.native.layout_checks import m_indices_is_contiguous_layout
from ...core.contract import (
    OpContract,
    QuantArg,
    Tolerance,
    checks_values,
    public_op,
    quant_operand,
    register_contract,
)
from ...core.dispatch import run, selection_for
from ...core.errors import ContractError, format_problem
from .dense import check_gemm_output, check_recipe, check_shared_k
from ...layouts.errors import LayoutConversionError
from ...layouts.moe import contiguous_m_indices, counts_from_psum, m_indices_from_psum
from ...core.providers import Inputs
from ..quant.fp8 import dequantized
from ...core.tensors import PreparedTensor, QuantTensor, describe

#: dtype of m_indices, psum and masked_m (DeepGEMM takes int32 only)
INDEX_DTYPE = torch.int32
#: m_indices value of a padding row
PADDING_ROW = -1

_LAYOUT_FIX = ("build it with portable_kernels.layouts.contiguous_m_indices(counts, "
               "get_m_alignment_for_contiguous_layout())")
_PSUM_FIX = "build it with portable_kernels.layouts.psum_layout(counts, get_m_alignment_for_contiguous_layout())"


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def grouped_gemm_masked_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Reference math of the masked form: a [G, M, K], b [G, N, K] -> [G, M, N] = a[g]·b[g]ᵀ.

    Computed for every row (fp32, or fp64 for fp64 inputs); the op writes only rows < masked_m[g].
    """
    dt = _compute_dtype(a)
    return torch.bmm(a.to(dt), b.to(dt).transpose(1, 2))


def grouped_gemm_contiguous_reference(a: torch.Tensor, b: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """Reference math of the contiguous form: a [M, K], b [G, N, K], m_indices [M] -> [M, N].

    Row r is a[r]·b[m_indices[r]]ᵀ; padding rows (-1) come back as 0 and the op does not write them.
    Rows are packed per group into a [G, max_count, K] batch for one bmm (no loop over groups).
    """
    dt = _compute_dtype(a)
    num_groups, n = b.shape[0], b.shape[1]
    out = torch.zeros(a.shape[0], n, dtype=dt, device=a.device)
    rows = torch.nonzero(m_indices >= 0).flatten()
    if rows.numel() == 0 or n == 0:
        return out
    groups = m_indices[rows].long()
    counts = torch.bincount(groups, minlength=num_groups)
    order = torch.argsort(groups, stable=True)
    slot = torch.empty_like(rows)
    first_of_group = torch.cumsum(counts, 0) - counts
    slot[order] = torch.arange(rows.numel(), device=a.device) - first_of_group[groups[order]]
    packed = torch.zeros(num_groups, int(counts.max()), a.shape[1], dtype=dt, device=a.device)
    packed[groups, slot] = a[rows].to(dt)
    out[rows] = grouped_gemm_masked_reference(packed, b)[groups, slot]
    return out


def row_groups(grouped_layout: torch.Tensor, use_psum_layout: bool, alignment: int, total_m: int) -> torch.Tensor:
    """The group of every row (int32 [total_m], -1 on padding rows) for either contiguous form."""
    if not use_psum_layout:
        return grouped_layout
    return m_indices_from_psum(grouped_layout, alignment, total_m)


def _masked_rows(masked_m: torch.Tensor, max_m: int) -> torch.Tensor:
    return torch.arange(max_m, device=masked_m.device)[None, :] < masked_m[:, None]


def _write_contiguous(a, b, d, grouped_layout, use_psum_layout, alignment) -> None:
    if d.numel() == 0:
        return
    groups = row_groups(grouped_layout, use_psum_layout, alignment, d.shape[0])
    rows = groups >= 0
    d[rows] = grouped_gemm_contiguous_reference(a, b, groups)[rows].to(d.dtype)


def _write_masked(a, b, d, masked_m) -> None:
    if d.numel() == 0:
        return
    rows = _masked_rows(masked_m, d.shape[1])
    d[rows] = grouped_gemm_masked_reference(a, b)[rows].to(d.dtype)


@attrs.frozen
class ContiguousGroupedInputs(Inputs):
    """One contiguous grouped GEMM call (validated): a [M, K] (PreparedTensor e4m3, or bf16), b [G, N, K]
    (PreparedTensor — its data may be tiled — or bf16), d [M, N]; grouped_layout: int32 m_indices [M]
    or, with use_psum_layout, int32 psum [G]; alignment: the segment alignment of this backend;
    expected_m: the psum hint or None. Writes only the valid rows of d. `dims()` also names the
    alignment, so a provider can limit it (e.g. Limit("alignment", multiple_of=128))."""

    a: PreparedTensor | torch.Tensor
    b: PreparedTensor | torch.Tensor
    d: torch.Tensor
    grouped_layout: torch.Tensor
    use_psum_layout: bool
    alignment: int
    expected_m: int | None
    device_field = "d"

    def dims(self) -> dict[str, int]:
        g, n, k = self.b.shape
        return {"M": self.d.shape[0], "N": n, "K": k, "G": g, "alignment": self.alignment}


@attrs.frozen
class MaskedGroupedInputs(Inputs):
    """One masked grouped GEMM call (validated): a [G, max_m, K], b [G, N, K], d [G, max_m, N],
    masked_m int32 [G], expected_m a host-side hint. Writes only rows < masked_m[g] of d."""

    a: PreparedTensor | torch.Tensor
    b: PreparedTensor | torch.Tensor
    d: torch.Tensor
    masked_m: torch.Tensor
    expected_m: int
    device_field = "d"

    def dims(self) -> dict[str, int]:
        g, max_m, n = self.d.shape
        return {"G": g, "max_m": max_m, "N": n, "K": self.b.shape[-1], "expected_m": self.expected_m}


def _operand_values(t: PreparedTensor | torch.Tensor) -> torch.Tensor:
    return dequantized(t) if isinstance(t, PreparedTensor) else t


def m_grouped_gemm_nt_contiguous_kernel(call: ContiguousGroupedInputs) -> None:
    """Reference kernel (fp8 and bf16): dequantize, multiply, write only the valid rows of d."""
    _write_contiguous(_operand_values(call.a), _operand_values(call.b), call.d, call.grouped_layout,
                      call.use_psum_layout, call.alignment)


def m_grouped_gemm_nt_masked_kernel(call: MaskedGroupedInputs) -> None:
    """Reference kernel (fp8 and bf16): rows >= masked_m[g] of d are left untouched."""
    _write_masked(_operand_values(call.a), _operand_values(call.b), call.d, call.masked_m)


M_GROUPED_FP8_CONTIGUOUS = register_contract(OpContract(
    "m_grouped_fp8_gemm_nt_contiguous", grouped_gemm_contiguous_reference,
    Tolerance(dequantized=1e-6, unquantized=1e-3),
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (128, 128))), m_grouped_gemm_nt_contiguous_kernel))
M_GROUPED_FP8_MASKED = register_contract(OpContract(
    "m_grouped_fp8_gemm_nt_masked", grouped_gemm_masked_reference,
    Tolerance(dequantized=1e-6, unquantized=1e-3),
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (128, 128))), m_grouped_gemm_nt_masked_kernel))
M_GROUPED_BF16_CONTIGUOUS = register_contract(OpContract(
    "m_grouped_bf16_gemm_nt_contiguous", grouped_gemm_contiguous_reference,
    Tolerance(dequantized=1e-6, unquantized=1e-5), kernel=m_grouped_gemm_nt_contiguous_kernel))
M_GROUPED_BF16_MASKED = register_contract(OpContract(
    "m_grouped_bf16_gemm_nt_masked", grouped_gemm_masked_reference, Tolerance(dequantized=1e-6, unquantized=1e-5),
    kernel=m_grouped_gemm_nt_masked_kernel))


# -- validation (every check runs before anything is launched) ---------------------------------------


def check_host_int(op: str, arg: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        expected = "None or a positive int" if optional else "a positive int (a host-side hint)"
        raise ContractError(format_problem(op, arg, repr(value), expected,
                                           "pass the expected rows per group as a Python int, e.g. 128"))


def check_index_vector(op: str, arg: str, t: Any, length: int, what: str, device: torch.device, fix: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != INDEX_DTYPE or t.dim() != 1:
        raise ContractError(format_problem(op, arg, describe(t), f"a 1-D int32 tensor {what}", fix))
    if t.shape[0] != length:
        raise ContractError(format_problem(op, arg, f"of length {t.shape[0]}", f"length {length} ({what})", fix))
    if t.device != device:
        raise ContractError(format_problem(op, arg, f"on {t.device}", f"on {device} like the operands",
                                           f"move {arg} to the operands' device"))


def check_grouped_shapes(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], masked: bool) -> None:
    a_dims = 3 if masked else 2
    a_names = "[G, max_m, K]" if masked else "[M, K]"
    if len(a_shape) != a_dims:
        raise ContractError(format_problem(op, "a", f"of logical shape {a_shape}", f"{a_dims}-D {a_names}",
                                           "use the masked form for [G, max_m, K] and the contiguous form for [M, K]"))
    if len(b_shape) != 3:
        raise ContractError(format_problem(op, "b", f"of logical shape {b_shape}", "3-D [G, N, K] (one B per group)",
                                           "stack the experts' weights, e.g. torch.stack(ws)"))
    if b_shape[0] == 0:
        raise ContractError(format_problem(op, "b", "empty along G", "at least one group", "pass G >= 1 weights"))
    check_shared_k(op, a_shape, b_shape)
    if masked and a_shape[0] != b_shape[0]:
        raise ContractError(format_problem(op, "a", f"of shape {a_shape} ({a_shape[0]} groups)",
                                           f"G = {b_shape[0]} groups like b", "pass one [max_m, K] slab per group"))


def _check_fp8_operands(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor,
                        recipe: Any, masked: bool) -> None:
    for arg, t in (("a", a), ("b", b)):
        if t.element != "e4m3":
            raise ContractError(format_problem(op, arg, f"{t.element} data", "fp8 e4m3 data",
                                               "quantize with per_token_cast_to_fp8 / per_block_cast_to_fp8"))
    check_grouped_shapes(op, tuple(a.shape), tuple(b.shape), masked)
    if b.device != a.device:
        raise ContractError(format_problem(op, "b", f"on {b.device}", f"on {a.device} like a", "move b to a's device"))
    ga, gb = a.granularity, b.granularity
    if ga[0] != 1:
        raise ContractError(format_problem(op, "a", f"scaled per {ga} blocks", "per-token scales (1, gran_k)",
                                           "quantize activations with per_token_cast_to_fp8"))
    if ga[1] != gb[1]:
        raise ContractError(format_problem(op, "b", f"scaled per {gb[1]} along K",
                                           f"the same K granularity as a ({ga[1]})",
                                           "quantize both operands with the same gran_k"))
    check_recipe(op, recipe, ga, gb)


def _check_bf16_operands(op: str, a: Any, b: Any, masked: bool) -> None:
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16:
            raise ContractError(format_problem(op, arg, describe(t), "a bfloat16 tensor",
                                               f"pass {arg} as bf16 ({arg}.to(torch.bfloat16))"))
    check_grouped_shapes(op, tuple(a.shape), tuple(b.shape), masked)
    if b.device != a.device:
        raise ContractError(format_problem(op, "b", f"on {b.device}", f"on {a.device} like a", "move b to a's device"))


def _check_contiguous_layout(op: str, grouped_layout: Any, use_psum_layout: bool, expected_m: Any,
                             total_m: int, num_groups: int, device: torch.device) -> None:
    check_bool(op, "use_psum_layout", use_psum_layout)
    if use_psum_layout:
        check_index_vector(op, "m_indices", grouped_layout, num_groups, "of G cumulative end rows (psum layout)",
                            device, _PSUM_FIX)
        check_host_int(op, "expected_m_for_psum_layout", expected_m, optional=True)
        return
    check_index_vector(op, "m_indices", grouped_layout, total_m, "with the group of each row of A",
                        device, _LAYOUT_FIX)
    if expected_m is not None:
        raise ContractError(format_problem(op, "expected_m_for_psum_layout", repr(expected_m),
                                           "None unless use_psum_layout=True", "drop the hint or pass a psum layout"))


def _check_m_indices_values(op: str, m_indices: torch.Tensor, num_groups: int, alignment: int) -> None:
    """m_indices must be the contiguous layout of its own counts (ascending groups, each segment
    starting on a multiple of `alignment`, -1 up to the next multiple); extra -1 rows may trail."""
    if m_indices_is_contiguous_layout(m_indices, num_groups, alignment):
        return  # the one-pass native check agrees; on any doubt the torch check below decides
    m = m_indices.to(torch.int64)
    bad = (m < PADDING_ROW) | (m >= num_groups)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0])
        raise ContractError(format_problem(op, "m_indices", f"{int(m[row])} at row {row}",
                                           f"-1 (padding) or a group in [0, {num_groups})", _LAYOUT_FIX))
    counts = torch.bincount(m[m >= 0], minlength=num_groups)
    want = contiguous_m_indices(counts, alignment).to(torch.int64)
    if want.numel() > m.numel():
        raise ContractError(format_problem(
            op, "m_indices", f"{m.numel()} rows for group counts {_preview(counts)}",
            f"at least {want.numel()} rows: every group's rows padded to a multiple of {alignment}", _LAYOUT_FIX))
    full = torch.cat((want, want.new_full((m.numel() - want.numel(),), PADDING_ROW)))
    wrong = torch.nonzero(full != m).flatten()
    if wrong.numel() == 0 and m_indices_is_contiguous_layout(m_indices, num_groups, alignment) is False:
        raise AssertionError(f"{op}: the native and torch checks of m_indices disagree")  # a bug of ours
    if wrong.numel():
        row = int(wrong[0])
        raise ContractError(format_problem(
            op, "m_indices", f"{int(m[row])} at row {row}",
            f"{int(full[row])}: the contiguous layout with alignment {alignment} (groups ascending, each group's "
            f"rows one run starting at a multiple of {alignment}, then -1 up to the next multiple)", _LAYOUT_FIX))


def _preview(t: torch.Tensor, limit: int = 8) -> str:
    values = t[:limit].tolist()
    return str(values) if t.numel() <= limit else str(values)[:-1] + ", ...]"


def _check_psum_values(op: str, psum: torch.Tensor, total_m: int, alignment: int) -> None:
    try:
        counts_from_psum(psum, alignment)
    except LayoutConversionError as exc:
        raise ContractError(format_problem(op, "m_indices", f"the psum layout {_preview(psum)}",
                                           f"non-decreasing end rows, each >= the previous rounded up to {alignment}",
                                           _PSUM_FIX)) from exc
    last = int(psum[-1])
    if last > total_m:
        raise ContractError(format_problem(op, "m_indices", f"a psum layout ending at row {last}",
                                           f"an end row <= M = {total_m} (the rows of a)",
                                           "allocate A with at least psum[-1] rows"))


def check_masked_m_values(op: str, masked_m: torch.Tensor, max_m: int) -> None:
    bad = (masked_m < 0) | (masked_m > max_m)
    if bool(bad.any()):
        g = int(torch.nonzero(bad)[0])
        raise ContractError(format_problem(op, "masked_m", f"{int(masked_m[g])} for group {g}",
                                           f"a row count in [0, max_m = {max_m}]",
                                           "allocate A with max_m >= the largest group"))


def _alignment(contract: OpContract, inputs: Inputs) -> int:
    """The contiguous-layout alignment on the backend this call will run on (its selection is cached
    with the call's signature): the process-wide setting, else the backend's own."""
    return contiguous_alignment(selection_for(contract, inputs).backend)


def _check_layout_values(op: str, grouped_layout: torch.Tensor, use_psum_layout: bool, num_groups: int,
                         total_m: int, alignment: int) -> None:
    if not checks_values(grouped_layout):
        return  # reading device memory would synchronize; see contract.checks_values
    if use_psum_layout:
        _check_psum_values(op, grouped_layout, total_m, alignment)
    else:
        _check_m_indices_values(op, grouped_layout, num_groups, alignment)



def unread_scales_as_one(a: Any, read: torch.Tensor) -> Any:
    """`a` with the per-row scales of the rows no group reads (bool `read` [..., rows] False) set to
    1.0: a power of two, so converting into an exponent-only Format checks only the scales the op
    reads. DeepGEMM's layouts leave those rows zero (masked) or uninitialised (psum gaps), and its
    kernels never read them. Data, and operands already known to hold powers of two, are untouched."""
    if not isinstance(a, QuantTensor) or a.ue8m0 or a.granularity[0] != 1 or a.scale.shape[:-1] != read.shape:
        return a
    return QuantTensor.unchecked(a.data, a.scale.masked_fill(~read[..., None], 1.0), a.granularity, a.ue8m0,
                                 a.element)


def run_masked(contract: OpContract, a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor,
               expected_m: int | None) -> None:
    """Check d, masked_m and expected_m of a masked grouped GEMM whose operands a [G, max_m, K] and
    b [G, N, K] were checked, then run it (the masked ops of every operand kind share this)."""
    op = contract.name
    (g, max_m, _), n = a.shape, b.shape[1]
    check_gemm_output(op, d, None, (g, max_m, n), a.device)
    check_index_vector(op, "masked_m", masked_m, g, "with the valid rows of each group", a.device,
                       "pass torch.tensor(counts, dtype=torch.int32)")
    check_host_int(op, "expected_m", expected_m)
    if checks_values(masked_m):
        check_masked_m_values(op, masked_m, max_m)
    read = torch.arange(max_m, device=masked_m.device)[None, :] < masked_m.to(torch.int64)[:, None]
    run(contract, MaskedGroupedInputs(unread_scales_as_one(a, read), b, d, masked_m, expected_m))

def run_contiguous(contract: OpContract, a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor,
                   use_psum_layout: bool, expected_m: int | None, ensure_zero_padding: bool) -> None:
    """The shared tail of every contiguous grouped GEMM (operands and d already checked): check the
    layout, run the provider, then zero the padding rows of d when asked (one device op, no sync)."""
    op = contract.name
    m, g = d.shape[0], b.shape[0]
    check_bool(op, "ensure_zero_padding", ensure_zero_padding)
    _check_contiguous_layout(op, grouped_layout, use_psum_layout, expected_m, m, g, d.device)
    inputs = ContiguousGroupedInputs(a, b, d, grouped_layout, use_psum_layout, 0, expected_m)
    alignment = _alignment(contract, inputs)
    _check_layout_values(op, grouped_layout, use_psum_layout, g, m, alignment)
    if use_psum_layout:  # the gaps between groups (and the tail) are never read
        a = unread_scales_as_one(a, ~padding_rows(grouped_layout, True, alignment, m))
    run(contract, attrs.evolve(inputs, a=a, alignment=alignment))
    if ensure_zero_padding and d.numel():
        zero_rows(d, padding_rows(grouped_layout, use_psum_layout, alignment, m))


def zero_rows(d: torch.Tensor, rows: torch.Tensor) -> None:
    """d[rows] = 0 for a bool mask `rows` [M]. On an accelerator one masked fill (no host sync); on
    CPU, where reading the mask is free, one memset per run of padding rows: a broadcast masked fill
    of a 512 x 1024 bf16 decode buffer costs ~320 µs there, the runs ~40 µs."""
    if d.device.type != "cpu":
        d.masked_fill_(rows[:, None], 0)
        return
    flags = rows.to(torch.int8)
    edges = torch.nonzero(torch.diff(flags, prepend=flags.new_zeros(1), append=flags.new_zeros(1))).flatten().tolist()
    for start, end in zip(edges[0::2], edges[1::2]):
        d[start:end].zero_()


# -- public ops ---------------------------------------------------------------------------------------


@public_op(M_GROUPED_FP8_CONTIGUOUS)
def m_grouped_fp8_gemm_nt_contiguous(a: Any, b: Any, d: torch.Tensor, m_indices: torch.Tensor,
                                     recipe: tuple[int, ...] | None = None,
                                     *, use_psum_layout: bool = False,
                                     expected_m_for_psum_layout: int | None = None,
                                     ensure_zero_padding: bool = True) -> None:
    """MoE grouped GEMM, contiguous layout: D[r] = A[r]·B[g]ᵀ for each row r of group g, written into d.

    a: (fp8 [M, K], fp32 [M, ceil(K/128)]) — every group's rows back to back
    b: (fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)]) — one weight per group (prepare it once)
    d: bf16 or fp32 [M, N], row-major; padding rows are zeroed (ensure_zero_padding=True, the
       default, as DeepGEMM) or left as they were (False)
    m_indices: int32 [M], the group of each row, -1 on padding rows; it must be the contiguous layout
        (groups ascending, each group's segment starting on a multiple of
        get_m_alignment_for_contiguous_layout(), padded with -1 to the next multiple; more -1 rows
        may follow). With use_psum_layout=True: int32 [G] cumulative end rows (DeepGEMM's psum
        grouped_layout), group g occupying rows [align(psum[g-1]), psum[g]); other rows are padding.
    recipe: None or (1, 128, 128) to assert the operands' granularity
    expected_m_for_psum_layout: optional host-side hint (rows per group) for the psum form
    ensure_zero_padding: zero every row of d that belongs to no group (after the kernel, on device)
    """
    if is_compiling():
        return compiled_call("m_grouped_fp8_gemm_nt_contiguous", a, b, d, m_indices, recipe,
                             use_psum_layout=use_psum_layout, expected_m_for_psum_layout=expected_m_for_psum_layout,
                             ensure_zero_padding=ensure_zero_padding)
    op = M_GROUPED_FP8_CONTIGUOUS.name
    qa = quant_operand(M_GROUPED_FP8_CONTIGUOUS, "a", a)
    qb = quant_operand(M_GROUPED_FP8_CONTIGUOUS, "b", b)
    _check_fp8_operands(op, qa, qb, recipe, masked=False)
    (m, _), (_, n, _) = qa.shape, qb.shape
    check_gemm_output(op, d, None, (m, n), qa.device)
    run_contiguous(M_GROUPED_FP8_CONTIGUOUS, qa, qb, d, m_indices, use_psum_layout, expected_m_for_psum_layout,
                   ensure_zero_padding)


@public_op(M_GROUPED_FP8_MASKED)
def m_grouped_fp8_gemm_nt_masked(a: Any, b: Any, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                 recipe: tuple[int, ...] | None = None) -> None:
    """MoE grouped GEMM, masked layout: D[g, r] = A[g, r]·B[g]ᵀ for r < masked_m[g], written into d.

    a: (fp8 [G, max_m, K], fp32 [G, max_m, ceil(K/128)])
    b: (fp8 [G, N, K], fp32 [G, ceil(N/128), ceil(K/128)])
    d: bf16 or fp32 [G, max_m, N], row-major; rows >= masked_m[g] are left untouched
    masked_m: int32 [G], valid rows per group, each in [0, max_m]
    expected_m: host-side hint, a positive int (rows per group the caller expects); no effect on results
    recipe: None or (1, 128, 128) to assert the operands' granularity
    """
    if is_compiling():
        return compiled_call("m_grouped_fp8_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe)
    op = M_GROUPED_FP8_MASKED.name
    qa = quant_operand(M_GROUPED_FP8_MASKED, "a", a)
    qb = quant_operand(M_GROUPED_FP8_MASKED, "b", b)
    _check_fp8_operands(op, qa, qb, recipe, masked=True)
    run_masked(M_GROUPED_FP8_MASKED, qa, qb, d, masked_m, expected_m)


@public_op(M_GROUPED_BF16_CONTIGUOUS)
def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, m_indices: torch.Tensor,
                                      *, use_psum_layout: bool = False,
                                      expected_m_for_psum_layout: int | None = None,
                                      ensure_zero_padding: bool = True) -> None:
    """bf16 MoE grouped GEMM, contiguous layout (fp32 accumulation), written into d.

    a: bf16 [M, K]; b: bf16 [G, N, K]; d: bf16 or fp32 [M, N] (padding rows zeroed unless
    ensure_zero_padding=False); m_indices / use_psum_layout / expected_m_for_psum_layout as in
    m_grouped_fp8_gemm_nt_contiguous
    """
    if is_compiling():
        return compiled_call("m_grouped_bf16_gemm_nt_contiguous", a, b, d, m_indices, use_psum_layout=use_psum_layout,
                             expected_m_for_psum_layout=expected_m_for_psum_layout,
                             ensure_zero_padding=ensure_zero_padding)
    op = M_GROUPED_BF16_CONTIGUOUS.name
    _check_bf16_operands(op, a, b, masked=False)
    (m, _), (_, n, _) = a.shape, b.shape
    check_gemm_output(op, d, None, (m, n), a.device)
    run_contiguous(M_GROUPED_BF16_CONTIGUOUS, a, b, d, m_indices, use_psum_layout, expected_m_for_psum_layout,
                   ensure_zero_padding)


@public_op(M_GROUPED_BF16_MASKED)
def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int) -> None:
    """bf16 MoE grouped GEMM, masked layout (fp32 accumulation), written into d.

    a: bf16 [G, max_m, K]; b: bf16 [G, N, K]; d: bf16 or fp32 [G, max_m, N] (rows >= masked_m[g]
    untouched); masked_m: int32 [G] in [0, max_m]; expected_m: positive int host-side hint
    """
    if is_compiling():
        return compiled_call("m_grouped_bf16_gemm_nt_masked", a, b, d, masked_m, expected_m)
    op = M_GROUPED_BF16_MASKED.name
    _check_bf16_operands(op, a, b, masked=True)
    run_masked(M_GROUPED_BF16_MASKED, a, b, d, masked_m, expected_m)
