"""`portable_kernels.deep_select`: DeepSelect's public names with DeepSelect's signatures.

Porting is one import: `import portable_kernels.deep_select as deep_select`. `topk` runs
portable_kernels.topk (which takes DeepSelect's full signature) after DeepSelect's own host checks:

- on every backend: rows of `output_idx` must not overlap (stride(0) >= topk when b > 1), with
  DeepSelect's message ("output_index rows must not overlap") — torch's copy would raise its own;
- on the nvidia backend (DeepSelect's CUDA build; real or emulated): input.stride(0) a multiple of
  16 bytes and output_idx.stride(0) of 32 bytes (`get_stride_requirement`), input and output_idx
  data pointers 32-byte aligned, and the input's storage holding the final row padded to a
  multiple of 128 bytes (its TMA descriptor reads that far). The cpu and ascend backends take rows
  of any stride and alignment (DeepSelect's Ascend build checks none of the last three).

A broken rule raises DeepSelectInputError: a ContractError (ValueError, TypeError) that is also a
RuntimeError, the type DeepSelect's TORCH_CHECK raises, so upstream tests and handlers match it.
What differs otherwise, and why: docs/porting.md.
"""

from __future__ import annotations

import functools

import torch

from ..core.errors import ContractError
from ..core.registry import forced_backend
from ..ops import topk as _topk_op
from ..ops.topk import DEFAULT_IDX_FILL, DEFAULT_VALUE_FILL, NAN_ROW_MARKER

__all__ = ["topk", "get_stride_requirement", "NAN_ROW_MARKER", "DeepSelectInputError"]

#: DeepSelect's CUDA stride requirements in bytes: (input row stride, output row stride)
STRIDE_REQUIREMENT = (16, 32)
#: DeepSelect's CUDA pointer alignment and the TMA row padding of the input (bytes)
POINTER_ALIGNMENT = 32
TMA_ROW_PADDING = 128


class DeepSelectInputError(ContractError, RuntimeError):
    """An input DeepSelect's host checks refuse (its message, as DeepSelect words it, and the fix)."""


@functools.lru_cache(maxsize=1)
def get_stride_requirement() -> tuple[int, int]:
    """(input, output) row-stride multiples in bytes DeepSelect's CUDA kernels want: (16, 32),
    enforced under the nvidia backend (see the module docstring)."""
    return STRIDE_REQUIREMENT


def _cuda_rules_apply(input: torch.Tensor) -> bool:
    forced = forced_backend()
    if forced is not None:
        return forced[0] == "nvidia"
    return input.device.type == "cuda"


def _refuse(message: str, fix: str) -> None:
    raise DeepSelectInputError(f"deep_select.topk: {message}. Fix: {fix}")


def _check_cuda_rules(input: torch.Tensor, output_idx: torch.Tensor | None) -> None:
    in_stride, out_stride = STRIDE_REQUIREMENT
    b, n = input.shape
    size = input.element_size()
    if input.stride(0) * size % in_stride:
        _refuse(f"input.stride(0) (currently {input.stride(0)} numbers) must be a multiple of {in_stride} Bytes "
                f"({in_stride // size} numbers)", "pad each row to that multiple (allocate wider, slice to n)")
    if input.data_ptr() % POINTER_ALIGNMENT:
        _refuse(f"input.data_ptr() must be {POINTER_ALIGNMENT}-byte aligned", "pass a view that starts on an "
                "aligned row (not a column slice such as x[:, 1:])")
    if b and n:
        padded_row = -(-n * size // TMA_ROW_PADDING) * TMA_ROW_PADDING
        last_row = (input.storage_offset() + (b - 1) * input.stride(0)) * size
        storage = input.untyped_storage().nbytes()
        if last_row > storage or padded_row > storage - last_row:
            _refuse(f"input backing storage must include the final row padded to a multiple of {TMA_ROW_PADDING} "
                    "bytes", f"allocate the rows {TMA_ROW_PADDING}-byte padded (torch.empty(b, padded)[:, :n])")
    if output_idx is not None and isinstance(output_idx, torch.Tensor) and output_idx.dim() == 2:
        osize = output_idx.element_size()
        if output_idx.stride(0) * osize % out_stride:
            _refuse(f"output_index.stride(0) (currently {output_idx.stride(0)} numbers) must be a multiple of "
                    f"{out_stride} Bytes ({out_stride // osize} numbers)", "pad the output rows to that multiple")
        if output_idx.data_ptr() % POINTER_ALIGNMENT:
            _refuse(f"output_index.data_ptr() must be {POINTER_ALIGNMENT}-byte aligned",
                    "pass an output view that starts on an aligned row")


def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin: None = None, end: torch.Tensor | None = None,
         indices_type: torch.dtype = torch.int64, sorted_index: bool = False, hint: None = None,
         output_idx: torch.Tensor | None = None, output_idx_offset: torch.Tensor | None = None,
         idx_oob_fill_value: int = DEFAULT_IDX_FILL, value_oob_fill_value: float = DEFAULT_VALUE_FILL,
         return_value: bool = True, abort_when_nan_found: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """DeepSelect's `deep_select.topk`: portable_kernels.topk after DeepSelect's host checks (see the
    module docstring; the arguments are portable_kernels.topk's)."""
    if isinstance(output_idx, torch.Tensor) and output_idx.dim() == 2 and output_idx.shape[0] > 1 \
            and output_idx.stride(0) < output_idx.shape[1]:
        _refuse(f"output_index rows must not overlap (stride(0) = {output_idx.stride(0)} < topk = "
                f"{output_idx.shape[1]})", "pass output_idx with its own row per input row")
    if isinstance(input, torch.Tensor) and input.dim() == 2 and _cuda_rules_apply(input):
        _check_cuda_rules(input, output_idx)
    return _topk_op.topk(input, topk, sorted, begin, end, indices_type, sorted_index, hint, output_idx,
                         output_idx_offset, idx_oob_fill_value, value_oob_fill_value, return_value,
                         abort_when_nan_found)
