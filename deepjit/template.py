"""Shape specialization by source generation: render a small instantiation file per parameter set.

Rule: rendering is strict. Every `${NAME}` must get a value and every value must be used, and
values are spelled as C++ literals, so two parameter sets can never render the same text by accident.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["Template", "render_template", "cpp_literal"]

# `${NAME}` only: a bare `$` is left alone because C++ and CUDA sources rarely use it.
_PLACEHOLDER_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def cpp_literal(value: Any, *, name: str = "value") -> str:
    """Spell a parameter as C++: bools as true/false, ints and finite floats as literals, enums by
    their value, strings verbatim (type names, expressions)."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentError(f"{name}={value!r} is not finite; a C++ literal must be a finite number")
        text = repr(value)
        return text if any(c in text for c in ".e") else text + ".0"
    if isinstance(value, str):
        if "\n" in value:
            raise InvalidArgumentError(f"{name}={value!r} contains a newline; pass a single-line C++ token")
        return value
    raise InvalidArgumentError(f"{name}={value!r} has type {type(value).__name__}; pass a bool, int, float, str or Enum")


class Template:
    """A C++/CUDA source with `${NAME}` placeholders, e.g.

        GEMM = Template('''
        #include "gemm.hpp"
        template void gemm<${BLOCK_M}, ${BLOCK_N}, ${DTYPE}>(const void*, const void*, void*, int);
        ''')
        source = GEMM.render(BLOCK_M=128, BLOCK_N=64, DTYPE="float")
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text must be a str, got {type(text).__name__}")
        self.text = text
        self.parameters: frozenset[str] = frozenset(_PLACEHOLDER_RE.findall(text))

    def render(self, params: Mapping[str, Any] | None = None, /, **kwargs: Any) -> str:
        values = {**(params or {}), **kwargs}
        missing = sorted(self.parameters - values.keys())
        if missing:
            raise InvalidArgumentError(f"template parameters {missing} have no value; pass them to render()")
        unused = sorted(values.keys() - self.parameters)
        if unused:
            raise InvalidArgumentError(
                f"parameters {unused} do not appear in the template; remove them or add ${{NAME}} placeholders"
            )
        spelled = {key: cpp_literal(value, name=key) for key, value in values.items()}
        return _PLACEHOLDER_RE.sub(lambda m: spelled[m.group(1)], self.text)


def render_template(text: str, params: Mapping[str, Any] | None = None, /, **kwargs: Any) -> str:
    """One-shot `Template(text).render(params, **kwargs)`."""
    return Template(text).render(params, **kwargs)
