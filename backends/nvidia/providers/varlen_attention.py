"""nvidia provider of dense varlen attention (flash_attn_varlen_func): the Triton kernel of
../kernels/varlen_attention.py. It reads q, k and v in place (any token and head strides), so
operands whose last dim is strided, and head dims wider than the kernel's tiles (d padded > 256,
d_v > 256), are declined with the reason: the layout-reference oracle serves them (copying inside
the provider would be a hidden conversion)."""

from __future__ import annotations

from portable_kernels.core.registry import Registry
from portable_kernels.ops.attention.prefill import FLASH_ATTN_VARLEN, PREFILL_DTYPES, VarlenInputs

from ..kernels._varlen_limits import unsupported_reasons
from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

KERNEL = "varlen_attention"


def _reasons(call: VarlenInputs) -> list[str]:
    return triton_reasons(call) + unsupported_reasons(call.q, call.k, call.v)


def _shape_class(call: VarlenInputs) -> tuple:
    """What the checks look at: the head dims and whether each of q, k, v has a unit last-dim stride."""
    return (call.q.shape[-1], call.v.shape[-1],
            *(t.shape[-1] <= 1 or t.stride(-1) == 1 for t in (call.q, call.k, call.v)))


def _varlen(call: VarlenInputs) -> None:
    kernel(KERNEL).flash_attn_varlen_func(call.q, call.k, call.v, call.cu_seqlens_qo, call.cu_seqlens_kv,
                                          call.max_seqlen_qo, call.softmax_scale, call.causal, call.out, call.lse)


def register(registry: Registry) -> None:
    registry.kernel(FLASH_ATTN_VARLEN.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    dtypes={"q": PREFILL_DTYPES}, check=_reasons, shape_class=_shape_class,
                    doc="Triton: flash-attention-2 style (128-row query block, head, sequence) programs over "
                        "64-key tiles, online softmax, GQA, bottom-right causal; bf16/fp16, d <= 256 padded, "
                        "d_v <= 256; untested on a GPU")(_varlen)
