"""`portable_kernels.flash_mla`: FlashMLA's public names with FlashMLA's signatures, over the semantic ops.

Porting is one import: `import portable_kernels.flash_mla as flash_mla`. `get_mla_metadata()`
returns an empty FlashMLASchedMeta that the first `flash_mla_with_kvcache` call fills (and later
calls are checked against), as FlashMLA does. `quantize_k_cache` / `dequantize_k_cache` write and
read FlashMLA's V3.2 FP8 cache bytes exactly (its scale rule, NaN passed through). What differs or
is left out, and why: docs/porting.md.
"""

from .interface import (FlashMLASchedMeta, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                        get_mla_metadata)
from .quant import FP8KVCacheLayout, dequantize_k_cache, quantize_k_cache
from . import flash_mla_interface  # noqa: F401  (FlashMLA's module path, importable as an attribute)

#: the FlashMLA release whose public API this drop-in follows (deepseek-ai/FlashMLA at 9241ae3)
__version__ = "1.0.0"

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_mla_sparse_fwd",
           "FP8KVCacheLayout", "quantize_k_cache", "dequantize_k_cache"]
