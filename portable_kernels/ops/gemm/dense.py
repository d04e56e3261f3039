"""GEMM op family (DeepGEMM names and argument order): D = C + A·Bᵀ.

`fp8_gemm_nt(a, b, d, c=None, recipe=None)` with block-scaled FP8 operands and
`bf16_gemm_nt(a, b, d, c=None)`. Outputs are written into `d` in place, as DeepGEMM does.
Contract: A [M, K], B [N, K] (both K-major), D [M, N] row-major bf16 or fp32, C [M, N] fp32 (or D's
dtype) or None. M = 0 and N = 0 are allowed (nothing to compute); K must be at least 1; K need not
be a multiple of the scale granularity (the last block is partial).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, QuantArg, Tolerance, public_op, quant_operand, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ..quant.fp8 import dequantized
from ...core.tensors import PreparedTensor, QuantTensor, describe

OUT_DTYPES = (torch.bfloat16, torch.float32)


def gemm_reference(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """Reference math on dequantized (or plain) operands: a [M, K], b [N, K] -> fp32 [M, N]."""
    out = a.float() @ b.float().T
    return out if c is None else out + c.float()


@attrs.frozen
class GemmInputs(Inputs):
    """One dense GEMM call, D = C + A·Bᵀ (fp8_gemm_nt, bf16_gemm_nt, fp8_fp4_gemm_nt).

    a: [M, K] — a PreparedTensor (fp8 e4m3) for the quantized GEMMs, a bf16 tensor for bf16_gemm_nt
    b: [N, K] — a PreparedTensor (e4m3, or e2m1 for fp8_fp4_gemm_nt), or a bf16 tensor
    d: bf16/fp32 [M, N], written in place; c: None or fp32 (or d's dtype) [M, N]
    """

    a: PreparedTensor | torch.Tensor
    b: PreparedTensor | torch.Tensor
    d: torch.Tensor
    c: torch.Tensor | None = None
    device_field = "d"

    def dims(self) -> dict[str, int]:
        m, n = self.d.shape
        return {"M": m, "N": n, "K": self.a.shape[-1]}

    def signature(self) -> tuple:
        """`Inputs.signature` written out for prepared a and b and tensor d (the same tuple at half
        the cost of the generic walk, which every other combination takes)."""
        a, b, d, c = self.a, self.b, self.d, self.c
        if type(a) is PreparedTensor and type(b) is PreparedTensor and type(d) is torch.Tensor:
            if c is None:
                return a.signature, b.signature, (d.dtype, d.device), None
            if type(c) is torch.Tensor:
                return a.signature, b.signature, (d.dtype, d.device), (c.dtype, c.device)
        return Inputs.signature(self)


def fp8_gemm_nt_kernel(call: GemmInputs) -> None:
    """Reference kernel of fp8_gemm_nt (and fp8_fp4_gemm_nt): PLAIN operands dequantized to fp32."""
    if call.d.numel() == 0:
        return
    call.d.copy_(gemm_reference(dequantized(call.a), dequantized(call.b), call.c))


def bf16_gemm_nt_kernel(call: GemmInputs) -> None:
    """Reference kernel of bf16_gemm_nt."""
    if call.d.numel() == 0:
        return
    call.d.copy_(gemm_reference(call.a, call.b, call.c))


FP8_GEMM_NT = register_contract(OpContract(
    "fp8_gemm_nt", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-3),
    (QuantArg("a", "lhs", (1, 128)), QuantArg("b", "rhs", (128, 128))), fp8_gemm_nt_kernel))
BF16_GEMM_NT = register_contract(OpContract(
    "bf16_gemm_nt", gemm_reference, Tolerance(dequantized=1e-6, unquantized=1e-5), (), bf16_gemm_nt_kernel))


def check_gemm_output(op: str, d: Any, c: Any, shape: tuple[int, ...], device: torch.device) -> None:
    """d: bf16/fp32, row-major contiguous, of `shape` ([M, N] or [G, max_m, N]), on the operands'
    device; c (if given): fp32 or d's dtype with the same shape and device. Shared by every GEMM."""
    names = "[M, N]" if len(shape) == 2 else "[G, max_m, N]"
    if not isinstance(d, torch.Tensor) or d.dtype not in OUT_DTYPES:
        raise ContractError(format_problem(op, "d", describe(d), f"a tensor of dtype {OUT_DTYPES}",
                                           f"allocate d = torch.empty({names[1:-1]}, dtype=torch.bfloat16)"))
    if tuple(d.shape) != tuple(shape):
        raise ContractError(format_problem(op, "d", f"of shape {tuple(d.shape)}", f"{names} = {list(shape)}",
                                           "allocate d with A's rows and B's N"))
    if not d.is_contiguous():
        raise ContractError(format_problem(op, "d", f"non-contiguous (strides {d.stride()})", "row-major contiguous",
                                           "pass a contiguous tensor and copy afterwards"))
    if d.device != device:
        raise ContractError(format_problem(op, "d", f"on {d.device}", f"on {device} like the operands",
                                           "allocate d on the operands' device"))
    if c is None:
        return
    if not isinstance(c, torch.Tensor) or c.dtype not in (torch.float32, d.dtype) or tuple(c.shape) != tuple(shape):
        raise ContractError(format_problem(op, "c", describe(c), f"None or a float32 (or d's dtype) {list(shape)} "
                                           "tensor", "pass the accumulator with D's shape"))
    if c.device != device:
        raise ContractError(format_problem(op, "c", f"on {c.device}", f"on {device}", "move c to the operands' device"))


def check_shared_k(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    """A [..., M, K] and B [..., N, K] share K, and K >= 1 (a GEMM over K = 0 is just C)."""
    k, kb = a_shape[-1], b_shape[-1]
    if k != kb:
        raise ContractError(format_problem(op, "b", f"of logical shape {tuple(b_shape)} (K = {kb})",
                                           f"K = {k} like a {tuple(a_shape)}", "pass A [M, K] and B [N, K]"))
    if k == 0:
        raise ContractError(format_problem(op, "a", "empty along K", "K >= 1", "a GEMM over K = 0 is just C"))


def check_recipe(op: str, recipe: Any, ga: tuple[int, int], gb: tuple[int, int]) -> None:
    """DeepGEMM's optional recipe (gran_m, gran_n, gran_k) must agree with the operands' granularity."""
    if recipe is None:
        return
    if not (isinstance(recipe, (tuple, list)) and len(recipe) == 3):
        raise ContractError(format_problem(op, "recipe", repr(recipe), "None or (gran_m, gran_n, gran_k)",
                                           "pass e.g. (1, 128, 128) or leave None to use the operands'"))
    if tuple(recipe) != (ga[0], gb[0], ga[1]):
        raise ContractError(format_problem(op, "recipe", repr(tuple(recipe)),
                                           f"the operands' granularity ({ga[0]}, {gb[0]}, {ga[1]})",
                                           "leave recipe=None or quantize with the matching block sizes"))


def check_fp8_operands(op: str, a: QuantTensor | PreparedTensor, b: QuantTensor | PreparedTensor,
                       recipe: Any) -> None:
    for arg, t in (("a", a), ("b", b)):
        if len(t.shape) != 2:
            raise ContractError(format_problem(op, arg, f"of logical shape {tuple(t.shape)}", "2-D [rows, K]",
                                               "use the m_grouped_* functions for batched/grouped operands"))
        if t.element != "e4m3":
            raise ContractError(format_problem(op, arg, f"{t.element} data", "fp8 e4m3 data",
                                               "use fp8_fp4_gemm_nt for FP4 operands"))
    check_shared_k(op, a.shape, b.shape)
    check_recipe(op, recipe, a.granularity, b.granularity)
    if a.granularity[1] != b.granularity[1]:
        raise ContractError(format_problem(op, "b", f"scaled per {b.granularity[1]} along K while a is scaled per "
                                           f"{a.granularity[1]}", "the same K granularity for a and b",
                                           "quantize both operands with the same gran_k"))


@public_op(FP8_GEMM_NT)
def fp8_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None,
                recipe: tuple[int, ...] | None = None) -> None:
    """D = C + A·Bᵀ with block-scaled FP8 operands, written into d.

    a: (fp8 [M, K], fp32 [M, ceil(K/128)]) — a tuple, QuantTensor or PreparedTensor
    b: (fp8 [N, K], fp32 [ceil(N/128), ceil(K/128)]) — idem (prepare weights once)
    d: bf16 or fp32 [M, N], row-major; c: None or fp32 [M, N]
    recipe: None (use the operands' granularity) or (gran_m, gran_n, gran_k) to assert it
    """
    if is_compiling():
        return compiled_call("fp8_gemm_nt", a, b, d, c, recipe)
    op = FP8_GEMM_NT.name
    qa = a if type(a) is PreparedTensor else quant_operand(FP8_GEMM_NT, "a", a)
    qb = b if type(b) is PreparedTensor else quant_operand(FP8_GEMM_NT, "b", b)
    sa, sb = qa.shape, qb.shape
    # the common call passes every check in one expression (each attribute read once); any other
    # runs the checks one by one, which raise the error naming the argument
    if not (len(sa) == 2 and len(sb) == 2 and sa[1] == sb[1] and sa[1] and recipe is None
            and qa.element == "e4m3" and qb.element == "e4m3" and qa.granularity[1] == qb.granularity[1]):
        check_fp8_operands(op, qa, qb, recipe)
    if not (c is None and type(d) is torch.Tensor and d.dtype in OUT_DTYPES and d.shape == (sa[0], sb[0])
            and d.is_contiguous() and (d.is_cpu and qa.data.is_cpu or d.device == qa.device)):
        check_gemm_output(op, d, c, (sa[0], sb[0]), qa.device)
    run(FP8_GEMM_NT, GemmInputs(qa, qb, d, c))


@public_op(BF16_GEMM_NT)
def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None) -> None:
    """D = C + A·Bᵀ in bf16 with fp32 accumulation, written into d.

    a: bf16 [M, K]; b: bf16 [N, K]; d: bf16 or fp32 [M, N]; c: None or fp32 [M, N]
    """
    if is_compiling():
        return compiled_call("bf16_gemm_nt", a, b, d, c)
    check_bf16_operands(BF16_GEMM_NT.name, a, b, d, c)
    run(BF16_GEMM_NT, GemmInputs(a, b, d, c))


def check_bf16_operands(op: str, a: Any, b: Any, d: Any, c: Any) -> None:
    """bf16 A [M, K] and B [N, K] (any strides) on one device, d and c as check_gemm_output says."""
    for arg, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 or t.dim() != 2:
            raise ContractError(format_problem(op, arg, describe(t), "a 2-D bfloat16 tensor",
                                               f"pass {arg} as bf16 [rows, K] (x.to(torch.bfloat16))"))
    if a.shape[1] != b.shape[1]:
        raise ContractError(format_problem(op, "b", f"of shape {tuple(b.shape)}", f"K = {a.shape[1]} like a",
                                           "pass A [M, K] and B [N, K]"))
    if a.shape[1] == 0:
        raise ContractError(format_problem(op, "a", "empty along K", "K >= 1", "a GEMM over K = 0 is just C"))
    if b.device != a.device:
        raise ContractError(format_problem(op, "b", f"on {b.device}", f"on {a.device}", "move b to a's device"))
    check_gemm_output(op, d, c, (a.shape[0], b.shape[0]), a.device)
