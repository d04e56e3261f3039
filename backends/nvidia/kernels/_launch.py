"""Launching a Triton kernel either autotuned or with one explicit config (tests pin configs).

Autotuning only makes sense on a GPU: in the interpreter a kernel is given one config (timing
there means nothing, and trying every config multiplies CI time), and tests run the others
explicitly through `config=`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import triton

from . import runtime
from ._common import INTERPRET

GridFn = Callable[[dict[str, Any]], tuple[int, ...]]


def autotuned(kernel: Any, configs: Sequence[triton.Config], key: Sequence[str],
              interpret_config: triton.Config | None = None, **options: Any) -> Any:
    """`triton.autotune` over `configs` compiled; just `interpret_config` (default the last, the
    smallest tiles: the interpreter's dots cost more than linearly in the tile) interpreted."""
    chosen = [interpret_config or configs[-1]] if INTERPRET else list(configs)
    return triton.autotune(configs=chosen, key=list(key), **options)(kernel)


def pick_config(configs: Sequence[triton.Config], m: int) -> triton.Config:
    """A size heuristic instead of tuning: the smallest BLOCK_M that covers M (up to 64), else the
    first (largest) config."""
    by_rows = sorted(configs, key=lambda c: c.kwargs["BLOCK_M"])
    for cfg in by_rows:
        if m <= cfg.kwargs["BLOCK_M"] <= 64:
            return cfg
    return configs[0]


def launch(kernel: Any, tuned: Any, grid: GridFn, args: Sequence[Any], constants: dict[str, Any],
           config: triton.Config | None = None, default: triton.Config | None = None) -> None:
    """Run `tuned` (autotuned) or, with `config`, the raw `kernel` with that config's meta-parameters.
    With autotuning off (runtime.autotune_enabled) the `default` config runs."""
    if config is None and not INTERPRET and not runtime.autotune_enabled() and default is not None:
        config = default
    if config is None:
        tuned[grid](*args, **constants)
        return
    meta = config.all_kwargs()
    kernel[grid({**constants, **config.kwargs})](*args, **constants, **meta)


def m_bucket(m: int) -> int:
    """Autotuning key for M: serving calls vary M every step; tune per power of two up to 4096."""
    return min(triton.next_power_of_2(max(m, 1)), 4096)
