"""Contract machinery: how an op family declares its arguments, reference math and tolerance.

Flow (no step reaches back): public op -> quant_operand (logical view) -> the op's validation ->
the family's inputs value -> `dispatch.run` (backend and provider, chosen once per call
signature; unprepared operands converted, counted) -> provider(inputs).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Literal, Mapping

import attrs
import torch

from .errors import ContractError, format_problem
from .formats import Format
from .packed_scales import is_packed_scale, packed_scale_operand
from .tensors import FP8_DTYPE, PreparedTensor, QuantTensor, cdiv, describe

Role = Literal["lhs", "rhs"]

#: candidate block sizes tried, after the argument's default, when inferring a raw tuple's granularity
_GRANULARITY_CANDIDATES = (128, 1, 32, 64, 256)


@attrs.frozen
class QuantArg:
    """A quantized argument of an op: its name, role and default block granularity.

    role "lhs": activations, scales per (1, gran_k); role "rhs": weights, scales per block.
    """

    name: str
    role: Role
    granularity: tuple[int, int]


@attrs.frozen
class Tolerance:
    """calc_diff bounds: against the reference computed from dequantized operands, and against
    the unquantized inputs (the quantization error itself)."""

    dequantized: float
    unquantized: float | None = None


@attrs.frozen
class OpContract:
    """One op's contract.

    reference:  the math in plain torch, on logical values
    tolerance:  calc_diff bounds for conformance
    quant_args: the quantized arguments of the public function
    kernel:     the reference kernel — the contract math as a provider: a function of the op's
                inputs value whose quantized operands are in the PLAIN format; every backend's
                layout-reference oracle decodes its own bytes to PLAIN and calls it
    kernel_formats: Formats the reference kernel is limited to per inputs field beyond its
                operands (the quantizers emit PLAIN scales only: {"out_format": (PLAIN,)})
    cache_args: arguments that are paged FP8 KV caches (core.kv_cache): prepare_inputs brings them
                into the backend's KV-cache Format
    """

    name: str
    reference: Callable[..., Any]
    tolerance: Tolerance
    quant_args: tuple[QuantArg, ...] = ()
    kernel: Callable[..., Any] | None = None
    kernel_formats: Mapping[str, tuple[Format, ...]] = attrs.field(factory=dict)
    cache_args: tuple[str, ...] = ()

    def quant_arg(self, name: str) -> QuantArg:
        for qa in self.quant_args:
            if qa.name == name:
                return qa
        known = ", ".join(q.name for q in self.quant_args) or "none"
        raise ContractError(f"{self.name}: '{name}' is not a quantized argument (quantized arguments: {known}).")


#: set to 1 to run data-dependent checks on accelerator tensors too (each costs a host sync)
VALUE_CHECKS_ENV = "PK_CHECK_VALUES"


def checks_values(*tensors: torch.Tensor | None) -> bool:
    """Whether checks that read tensor values on the host (index ranges, NaN, layouts) run here.

    Always for CPU tensors. On an accelerator only with PK_CHECK_VALUES=1: reading device memory
    costs a synchronization per call, so there the backend's kernels must stay memory-safe on
    any value (they clamp or skip, never read or write out of bounds).
    """
    if all(t is None or t.device.type == "cpu" for t in tensors):
        return True
    return os.environ.get(VALUE_CHECKS_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


_CONTRACTS: dict[str, OpContract] = {}
_PUBLIC: dict[str, Callable[..., Any]] = {}


def register_contract(contract: OpContract) -> OpContract:
    if contract.name in _CONTRACTS:
        raise ValueError(f"contract {contract.name!r} is already registered")
    _CONTRACTS[contract.name] = contract
    return contract


def contracts() -> dict[str, OpContract]:
    """Every op contract, by name."""
    return dict(_CONTRACTS)


def get_contract(op: str | Callable[..., Any]) -> OpContract:
    """The contract of an op given by name or by its public function."""
    name = getattr(op, "__pk_op__", op)
    if not isinstance(name, str) or name not in _CONTRACTS:
        known = ", ".join(sorted(_CONTRACTS))
        raise ContractError(f"unknown op {op!r}; known ops: {known}. Fix: pass one of those names or the op's "
                            f"public function.")
    return _CONTRACTS[name]


def public_op(contract: OpContract) -> Callable[[Callable], Callable]:
    """Mark a public function as the entry point of `contract` (so prepare_inputs accepts it)."""
    def mark(fn: Callable) -> Callable:
        fn.__pk_op__ = contract.name
        _PUBLIC[contract.name] = fn
        return fn
    return mark


def public_function(contract: OpContract) -> Callable[..., Any] | None:
    """The public function of an op, if it has one."""
    return _PUBLIC.get(contract.name)


def _infer_gran(n: int, blocks: int, default: int) -> int | None:
    for g in (default, *_GRANULARITY_CANDIDATES):
        if cdiv(n, g) == blocks:
            return g
    return None


def quant_operand(contract: OpContract, arg: str, value: Any) -> QuantTensor | PreparedTensor:
    """The logical view of a quantized argument: PreparedTensor and QuantTensor pass through; a raw
    DeepGEMM-style `(data, scale)` tuple becomes a QuantTensor (granularity inferred from shapes;
    DeepGEMM's packed int32 UE8M0 scales are decoded exactly, see packed_scales)."""
    if isinstance(value, (QuantTensor, PreparedTensor)):
        return value
    qa = contract.quant_arg(arg)
    if isinstance(value, torch.Tensor):
        raise ContractError(format_problem(
            contract.name, arg, describe(value), "a quantized operand: a (data, scale) tuple, a QuantTensor or a "
            "PreparedTensor", "quantize it first, e.g. per_token_cast_to_fp8(x) for activations or "
            "per_block_cast_to_fp8(w) for weights"))
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, torch.Tensor) for v in value)):
        raise ContractError(format_problem(contract.name, arg, describe(value), "a (data, scale) pair of tensors",
                                           "pass (fp8 data, fp32 scales) or a QuantTensor"))
    data, scale = value
    if data.dtype != FP8_DTYPE:
        raise ContractError(format_problem(contract.name, arg, f"data of dtype {data.dtype}", FP8_DTYPE,
                                           "quantize with per_token_cast_to_fp8 / per_block_cast_to_fp8"))
    if is_packed_scale(scale):  # DeepGEMM's packed UE8M0 int32 scales: decoded exactly (packed_scales)
        return packed_scale_operand(contract.name, arg, data, scale, "e4m3", (qa.granularity[1], 128, 32))
    if scale.dtype != torch.float32 or scale.dim() != data.dim() or data.dim() < 2:
        raise ContractError(format_problem(
            contract.name, arg, f"scale {describe(scale)} for data {describe(data)}",
            "fp32 scales with one block per row-block and K-block ([..., ceil(MN/gran_mn), ceil(K/gran_k)])",
            "pass the logical fp32 scales (not a backend's packed int32/int16 form); to use packed bytes, "
            "build them with prepare_inputs"))
    gm = _infer_gran(data.shape[-2], scale.shape[-2], qa.granularity[0])
    gk = _infer_gran(data.shape[-1], scale.shape[-1], qa.granularity[1])
    if gm is None or gk is None or tuple(scale.shape[:-2]) != tuple(data.shape[:-2]):
        raise ContractError(format_problem(
            contract.name, arg, f"scale of shape {tuple(scale.shape)} for data of shape {tuple(data.shape)}",
            f"[..., ceil(MN/gran_mn), ceil(K/gran_k)] (default granularity {qa.granularity})",
            "pass scales from the same quantizer call as the data"))
    if scale.device != data.device:
        raise ContractError(format_problem(contract.name, arg, f"scale on {scale.device} for data on {data.device}",
                                           "data and scale on one device", "move both to one device"))
    # ue8m0 stays False ("not known"): a Format that needs powers of two checks the values itself
    return QuantTensor.unchecked(data, scale, (gm, gk), False, "e4m3")
