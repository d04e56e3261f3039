"""torch_ops.declare: a custom op's schema read from its public function's type hints, and the
errors that name the fix when a hint or a name cannot be read."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from portable_kernels.core.compiled import ROUTES
from portable_kernels.torch_ops.declare import SPECS, custom_op, schema_type


@pytest.mark.parametrize(("hint", "schema"), [
    ("torch.Tensor", "Tensor"), ("torch.Tensor | None", "Tensor?"), ("int | None", "int?"), ("float", "float"),
    ("torch.dtype", "ScalarType"), ("tuple[int, ...] | None", "int[]?"), ("tuple[int, int, int]", "int[]"),
    ("list[int]", "int[]"), ("list[torch.Tensor]", "Tensor[]"), ("Any", None)])
def test_type_hints_name_their_schema_types(hint: str, schema: str | None) -> None:
    assert schema_type(hint) == schema


def _fake_public(name: str, fn: Any) -> Any:
    fn.__pk_op__ = name
    return fn


def test_a_hint_without_a_schema_type_is_refused_with_the_fix() -> None:
    def fp8_gemm_nt(a: Any, b: Any, d: torch.Tensor, c: torch.Tensor | None = None, recipe: Any = None) -> None:
        """not registered: refused before anything is defined"""

    with pytest.raises(TypeError, match="'recipe'.*types="):
        custom_op(_fake_public("fp8_gemm_nt", fp8_gemm_nt), writes=("d",))
    assert SPECS["fp8_gemm_nt"].public is not fp8_gemm_nt


def test_generated_route_is_plain_python_with_the_public_signature() -> None:
    source = ROUTES["fp8_gemm_nt"].__pk_source__
    assert "op('fp8_gemm_nt')(*operand_args(a, _spec.contract, 'a'), *operand_args(b, _spec.contract, 'b'), d, c, " \
           "_as_list(recipe))" in source
