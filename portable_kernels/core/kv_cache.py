"""A paged FP8 KV cache in one backend's byte order: `PreparedKVCache`, and the one place it converts.

The logical form of the 656-byte FP8 cache is FlashMLA's row (`layouts.FLASHMLA_FP8_KV`); a backend
names the order its decode kernels read with `Backend.kv_cache_format(options)` (Ascend 950:
`ASCEND_FP8_KV`). `prepare_inputs("flash_mla_with_kvcache", k_cache=...)` converts a cache once
(`to_cache_format`, not counted); a decode handed a cache in another order converts it inside the
call, counted by `implicit_conversions()` and refused under PK_STRICT_LAYOUTS=1. Providers never convert.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ..layouts.kv_cache import FLASHMLA_FP8_KV, KVCacheFormat, kv_cache_format_named
from ..layouts.kv_cache_model1 import FLASHMLA_MODEL1_FP8_KV, MODEL1_BYTES_PER_TOKEN
from .conversions import note_implicit_conversion
from .errors import ContractError, LayoutError
from .registry import Backend

__all__ = ["PreparedKVCache", "cache_format_for", "cache_bytes", "to_cache_format", "convert_cache_in_call"]


@attrs.frozen(eq=False, repr=False)
class PreparedKVCache:
    """A paged FP8 KV cache uint8 [num_blocks, block_size, 1, 656] whose rows are in `format`'s order,
    for `backend` (prepared under its options `params`). Writes into `data` (write_kv_cache) are
    seen by every decode that is handed this value: it owns no copy."""

    data: torch.Tensor
    format: KVCacheFormat
    backend: str
    params: tuple[tuple[str, Any], ...] = ()

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.format, KVCacheFormat):
            raise ContractError(f"PreparedKVCache: format is {self.format!r}; expected a KVCacheFormat "
                                f"(layouts.FLASHMLA_FP8_KV, layouts.ASCEND_FP8_KV)")
        problem = self.format.check(self.data)
        if problem is not None:
            raise LayoutError(f"PreparedKVCache({self.backend}:{self.format.name}): {problem}. Fix: build it with "
                              f"prepare_inputs('flash_mla_with_kvcache', k_cache=...) or allocate_kv_cache(...).")

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __reduce__(self):
        return _rebuild, (self.data, self.format.name, self.backend, self.params)

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.params)
        return (f"PreparedKVCache({self.backend}:{self.format.name}{f'({extra})' if extra else ''}, "
                f"{tuple(self.data.shape)}, device={self.device})")


def _rebuild(data: torch.Tensor, name: str, backend: str, params: tuple) -> PreparedKVCache:
    return PreparedKVCache(data, kv_cache_format_named(name), backend, params)


def cache_format_for(backend: Backend, options: Any, have: KVCacheFormat | None = None) -> KVCacheFormat:
    """The order `backend`'s decode kernels read the FP8 cache in (FlashMLA's unless it says otherwise).

    A backend's `kv_cache_format` names its order of the V3.2 (d = 576) cache. A cache of another
    head dim (`have`: FlashMLA's MODEL1 pages, d = 512) has no other order on any backend: it stays as is."""
    method = getattr(backend, "kv_cache_format", None)
    want = FLASHMLA_FP8_KV if method is None else method(dict(options))
    if have is not None and have.head_dim != want.head_dim:
        return have
    return want


def cache_bytes(value: Any) -> tuple[Any, KVCacheFormat | None]:
    """(bytes, their Format) of a cache argument: a PreparedKVCache's own; a raw uint8 (or float8_e4m3fn)
    cache is FlashMLA's: 584 bytes per token its MODEL1 pages, else its 656-byte V3.2 rows; anything
    else (a bf16 cache) has no Format (None)."""
    if isinstance(value, PreparedKVCache):
        return value.data, value.format
    if isinstance(value, torch.Tensor) and value.dtype in (torch.uint8, torch.float8_e4m3fn) and value.dim() == 4:
        if value.shape[-1] == MODEL1_BYTES_PER_TOKEN:
            return value.view(torch.uint8), FLASHMLA_MODEL1_FP8_KV
        return value.view(torch.uint8), FLASHMLA_FP8_KV
    return value, None


def to_cache_format(data: torch.Tensor, have: KVCacheFormat, want: KVCacheFormat) -> torch.Tensor:
    """The same rows in `want`'s order (no copy when the orders are the same)."""
    if have is want:
        return data
    return want.encode(have.decode(data))


def convert_cache_in_call(op: str, arg: str, data: torch.Tensor, have: KVCacheFormat, want: KVCacheFormat,
                          backend: str) -> torch.Tensor:
    """A cache handed to a call in `have`'s order, brought to `want`'s: counted (raises in strict mode).
    The whole cache is converted — prepare it once instead."""
    note_implicit_conversion(op, arg, backend, want.name)
    return to_cache_format(data, have, want)
