"""The byte-format value of a quantized operand, as the semantic layer sees it.

`Format` (one frozen object per byte format: name, elements, scale storage, granularity rule,
powers-of-two flag, encode, decode, describe) is defined in `portable_kernels.layouts.format`;
each Format object is defined once next to the layout functions it composes (`PLAIN`, and the
chips' `SM90`, `SM100`, `ASCEND_MX`, `ASCEND_MX_NZ`). This module re-exports the value and holds
the two ways back to the logical form: `decode_operand` (a PLAIN PreparedTensor, what reference
kernels read) and `as_quant` (a QuantTensor). Converting into a Format is `prepare`'s job.
"""

from __future__ import annotations

from ..layouts.format import ELEMENTS, PLAIN, Decoded, Encoded, Format, format_named, known_formats
from .tensors import PreparedTensor, QuantTensor

__all__ = ["ELEMENTS", "PLAIN", "Decoded", "Encoded", "Format", "as_quant", "decode_operand", "format_named",
           "known_formats"]


def decode_operand(operand: PreparedTensor) -> PreparedTensor:
    """The same numbers in the PLAIN format (ND data, fp32 row-major scales), same backend tag."""
    if operand.format is PLAIN:
        return operand
    data, scale, granularity = operand.format.decode(operand)
    return PreparedTensor.unchecked(data, scale, PLAIN, operand.backend, tuple(operand.shape),
                                    tuple(operand.granularity), tuple(granularity), operand.ue8m0, operand.element,
                                    operand.params)


def as_quant(operand: PreparedTensor) -> QuantTensor:
    """A QuantTensor with the operand's numbers (at the granularity its storage carries)."""
    plain = decode_operand(operand)
    return QuantTensor(plain.data, plain.scale, plain.storage_granularity, plain.ue8m0, plain.element)
