"""Template rendering for shape specialization: strict parameters, C++ spellings."""

from __future__ import annotations

import enum

import pytest
from conftest import ADD_SOURCE

import deepjit

GEMM = deepjit.Template("template void gemm<${BLOCK_M}, ${BLOCK_N}, ${DTYPE}, ${SWIZZLE}>(float, void*);\n")


class Major(enum.Enum):
    K = "cute::UMMA::Major::K"


def test_render_spells_each_value_as_cpp():
    text = GEMM.render(BLOCK_M=128, BLOCK_N=64, DTYPE="__nv_bfloat16", SWIZZLE=True)
    assert text == "template void gemm<128, 64, __nv_bfloat16, true>(float, void*);\n"


def test_parameters_are_listed():
    assert GEMM.parameters == {"BLOCK_M", "BLOCK_N", "DTYPE", "SWIZZLE"}


def test_mapping_and_keywords_combine():
    assert deepjit.render_template("${A}+${B}", {"A": 1}, B=2.5) == "1+2.5"


def test_missing_parameter_is_named():
    with pytest.raises(deepjit.InvalidArgumentError, match="BLOCK_N"):
        GEMM.render(BLOCK_M=1, DTYPE="float", SWIZZLE=False)


def test_unused_parameter_is_named():
    with pytest.raises(deepjit.InvalidArgumentError, match="BLOKC_M"):
        deepjit.render_template("${BLOCK_M}", BLOCK_M=1, BLOKC_M=2)


@pytest.mark.parametrize(
    ("value", "spelled"),
    [(False, "false"), (7, "7"), (-3, "-3"), (1.0, "1.0"), (1e-30, "1e-30"), ("float", "float"), (Major.K, Major.K.value)],
)
def test_cpp_literal(value, spelled):
    assert deepjit.cpp_literal(value) == spelled


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "a\nb", [1], None])
def test_values_without_a_cpp_spelling_are_rejected(value):
    with pytest.raises(deepjit.InvalidArgumentError, match="X="):
        deepjit.cpp_literal(value, name="X")


def test_dollar_signs_without_braces_are_left_alone():
    assert deepjit.render_template("$x ${A}", A=1) == "$x 1"


def test_each_parameter_set_is_its_own_cache_entry(cache_root):
    template = deepjit.Template(ADD_SOURCE.replace("OFFSET", "${OFFSET}"))
    jit = deepjit.JitContext()
    libs = {n: jit.compile("spec", template.render(OFFSET=n), toolchain="host", kind="ctypes") for n in (1, 2)}
    assert [libs[1].add(0, 0), libs[2].add(0, 0)] == [1, 2]
    assert len(list(cache_root.glob("spec.*"))) == 2
