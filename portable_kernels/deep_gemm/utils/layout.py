"""`deep_gemm.utils.layout`: DeepGEMM's layout utilities under their upstream module path (the
functions themselves are `portable_kernels.deep_gemm.layout`'s)."""

from ..layout import *  # noqa: F401,F403
from ..layout import __all__  # noqa: F401  (re-exported: the same public names)
