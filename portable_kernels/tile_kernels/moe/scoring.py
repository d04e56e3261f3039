"""TileKernels' `tile_kernels.moe.scoring`: the gate's scoring functions as an IntEnum.

Members and values as TileKernels (SIGMOID 0, SQRTSOFTPLUS 1, SOFTMAX 2, IDENTITY 3); `str(member)`
is the lower-case name the gate takes, and `from_str` reads it back in any case. `scoring_name` turns
either form into the name the portable gate op takes.
"""

from __future__ import annotations

from enum import IntEnum

from ...core.errors import ContractError, format_problem

__all__ = ["ScoringFunc", "scoring_name"]


class ScoringFunc(IntEnum):
    """How the gate turns logits into expert scores (TileKernels' numbering)."""

    SIGMOID = 0
    SQRTSOFTPLUS = 1
    SOFTMAX = 2
    IDENTITY = 3

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def from_str(cls, label: str) -> ScoringFunc:
        """The member named label, case-insensitive ("softmax" -> SOFTMAX); a ContractError (a
        ValueError, as TileKernels raises) for any other label."""
        member = cls.__members__.get(label.upper()) if isinstance(label, str) else None
        if member is None:
            names = ", ".join(str(m) for m in cls)
            raise ContractError(format_problem("ScoringFunc.from_str", "label", repr(label),
                                               f"one of {names}",
                                               f"pass a {cls.__name__} name ({label!r} is not a valid {cls.__name__})"))
        return member


def scoring_name(scoring_func: object) -> object:
    """The lower-case name for a ScoringFunc member or a name TileKernels' from_str accepts; any other
    value unchanged, so the op it is passed to refuses it with its own ContractError."""
    if isinstance(scoring_func, ScoringFunc):
        return str(scoring_func)
    if isinstance(scoring_func, str) and scoring_func.upper() in ScoringFunc.__members__:
        return str(ScoringFunc.from_str(scoring_func))
    return scoring_func
