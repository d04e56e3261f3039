"""TileKernels' `tile_kernels.utils`: the integer helpers its generators, test helpers and reference
oracles import (`ceil_div`, `align`, `is_power_of_two`), on Python ints."""

from __future__ import annotations

__all__ = ["align", "ceil_div", "is_power_of_two"]


def ceil_div(x: int, y: int) -> int:
    """x / y rounded up, for y > 0 (ceil_div(7, 4) == 2)."""
    return -(-x // y)


def align(x: int, y: int) -> int:
    """The smallest multiple of y that is >= x (align(7, 4) == 8)."""
    return ceil_div(x, y) * y


def is_power_of_two(x: int) -> bool:
    """True for 1, 2, 4, ...; False for 0 and negatives."""
    return x > 0 and x & (x - 1) == 0
