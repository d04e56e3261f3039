"""`flash_mla.flash_mla_interface`: FlashMLA's module path for its public functions (code that
imports from it directly keeps working); the functions are `portable_kernels.flash_mla.interface`'s."""

from .interface import (FlashMLASchedMeta, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_mla_sparse_fwd, flash_mla_with_kvcache,
                        get_mla_metadata)

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_mla_sparse_fwd"]
