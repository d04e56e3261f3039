"""`deep_gemm.testing`: the helpers DeepGEMM's tests import, under upstream's module paths — numeric
checks (`numeric`), timing (`bench`) and test filters (`utils`), re-exported here as upstream does."""

from . import bench, numeric, utils
from .bench import *  # noqa: F401,F403
from .bench import __all__ as _bench_names
from .numeric import *  # noqa: F401,F403
from .numeric import __all__ as _numeric_names
from .utils import *  # noqa: F401,F403
from .utils import __all__ as _utils_names

__all__ = [*_bench_names, *_numeric_names, *_utils_names, "bench", "numeric", "utils"]
