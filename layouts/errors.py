"""The one error type of the byte-format layer.

Rule: a conversion that would change the numbers (lossy) or cannot be expressed in the target format
raises `LayoutConversionError`; the message says what is wrong and how to fix it. The semantic layer
catches it and re-raises with the op and argument name.
"""

from __future__ import annotations

__all__ = ["LayoutConversionError"]


class LayoutConversionError(ValueError):
    """A lossy or impossible layout conversion (wrong shape, dtype, or values the format cannot carry)."""
