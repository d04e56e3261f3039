"""`portable_kernels.deep_gemm`: DeepGEMM's public names with DeepGEMM's signatures, over the semantic ops.

Porting is one import: `import portable_kernels.deep_gemm as deep_gemm`. The GEMMs, casts and layout
utilities keep DeepGEMM's argument order, keywords, defaults, return types and dtypes (packed FP4
is int8; casts return plain tuples; their bytes are DeepGEMM's: x * (1/sf), FP4 ties toward zero).
Every function calls portable_kernels' ops, so the same call runs on any backend. What differs or
is left out, and why: docs/porting.md.
"""

from . import attention, layout, testing, utils
from .attention import *  # noqa: F401,F403
from .attention import __all__ as _attention_names
from .einsum import einsum, fp8_einsum
from .gemm import *  # noqa: F401,F403
from .gemm import __all__ as _gemm_names
from .grouped import *  # noqa: F401,F403
from .grouped import __all__ as _grouped_names
from .runtime import (get_num_sms, get_pdl, get_tc_util, set_block_size_multiple_of, set_ignore_compile_dims,
                      set_num_sms, set_pdl, set_tc_util)
from .utils import *  # noqa: F401,F403
from .utils import __all__ as _utils_names

#: the DeepGEMM release whose public API this drop-in follows
__version__ = "2.6.1"

__all__ = [*_attention_names, *_gemm_names, "attention", "einsum", "fp8_einsum", *_grouped_names, *_utils_names, "get_num_sms", "get_pdl", "get_tc_util", "layout",
           "set_block_size_multiple_of", "set_ignore_compile_dims", "set_num_sms", "set_pdl", "set_tc_util",
           "testing", "utils"]
