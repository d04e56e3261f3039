"""`deep_gemm.utils`: DeepGEMM's casts and math helpers (`math`), its layout utilities (`layout`) and
its two distributed helpers (`dist`), under upstream's module paths and re-exported here as upstream
does."""

from . import dist, layout, math
from .dist import init_dist, uneven_all_gather
from .layout import *  # noqa: F401,F403
from .layout import __all__ as _layout_names
from .math import *  # noqa: F401,F403
from .math import __all__ as _math_names

__all__ = [*_math_names, *_layout_names, "dist", "init_dist", "layout", "math", "uneven_all_gather"]
