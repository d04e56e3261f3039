"""nvidia provider of sparse MLA prefill (flash_mla_sparse_fwd): the Triton kernel of
../kernels/mla_sparse_prefill.py. It reads q, kv and indices in place, so operands whose last dim
is strided are declined with the reason (the layout-reference oracle serves them; copying inside
the provider would be a hidden conversion)."""

from __future__ import annotations


from portable_kernels.core.registry import Registry
from portable_kernels.ops.attention.prefill import FLASH_MLA_SPARSE_FWD, PREFILL_DTYPES, SparsePrefillInputs

from ._common import BACKEND, TRITON, TRITON_PRIORITY, kernel, triton_devices, triton_reasons

KERNEL = "mla_sparse_prefill"


def _strides_unit(call: SparsePrefillInputs) -> list[str]:
    out = []
    for name in ("q", "kv", "indices"):
        t = getattr(call, name)
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            out.append(f"{name}'s last dim is not contiguous (stride {t.stride(-1)}): the kernel loads it as "
                       f"vectors; pass {name}.contiguous()")
    return out


def _reasons(call: SparsePrefillInputs) -> list[str]:
    return triton_reasons(call) + _strides_unit(call)


def _shape_class(call: SparsePrefillInputs) -> tuple[bool, ...]:
    """What the checks look at: whether each of q, kv, indices has a unit last-dim stride."""
    return tuple(t.shape[-1] <= 1 or t.stride(-1) == 1 for t in (call.q, call.kv, call.indices))


def _sparse_prefill(call: SparsePrefillInputs) -> None:
    kernel(KERNEL).flash_mla_sparse_fwd(call.q, call.kv, call.indices, call.sm_scale, call.attn_sink,
                                        call.topk_length, call.out, call.max_logits, call.lse)


def register(registry: Registry) -> None:
    registry.kernel(FLASH_MLA_SPARSE_FWD.name, BACKEND, TRITON, priority=TRITON_PRIORITY, devices=triton_devices(),
                    dtypes={"q": PREFILL_DTYPES}, check=_reasons, shape_class=_shape_class,
                    doc="Triton: (token, 64/128-head tile, 128-channel V split) programs over gathered key "
                        "tiles, split-P; bf16/fp16, d 576/512, sink, topk_length; untested on a GPU")(_sparse_prefill)
