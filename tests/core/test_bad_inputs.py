"""Every public function refuses bad input with a typed error naming the argument: the catalogue
in `bad_input_catalogue.py`, one parametrized test per op family."""

from __future__ import annotations

import warnings

import pytest

import portable_kernels as pk

from bad_input_catalogue import CATALOGUE, Bad

#: entries fixed on a branch that has not landed yet (strict: they must start passing when it does)
PENDING: dict[str, str] = {}


def _params(family: str) -> list:
    return [pytest.param(e, id=e.name, marks=pytest.mark.xfail(strict=True, reason=PENDING[e.name])
                         if e.name in PENDING else ()) for e in CATALOGUE if e.family == family]


def _check(entry: Bad) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pk.ImplicitConversionWarning)
        with pytest.raises(entry.error) as info:
            entry.call()
    assert isinstance(info.value, pk.PortableKernelsError)
    if entry.arg is not None:
        assert f"'{entry.arg}'" in str(info.value), str(info.value)
    assert "Fix" in str(info.value) or entry.error is not pk.ContractError or entry.arg is None, str(info.value)


@pytest.mark.parametrize("entry", _params("quantization"))
def test_quantization_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("gemm"))
def test_gemm_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("grouped_gemm"))
def test_grouped_gemm_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("mla"))
def test_mla_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("topk"))
def test_topk_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("moe_routing"))
def test_moe_routing_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("ep"))
def test_ep_refuses(entry):
    _check(entry)


@pytest.mark.parametrize("entry", _params("selection"))
def test_selection_and_helpers_refuse(entry):
    _check(entry)


def test_every_family_of_the_catalogue_has_a_test():
    tested = {"quantization", "gemm", "grouped_gemm", "mla", "topk", "moe_routing", "ep", "selection"}
    assert {e.family for e in CATALOGUE} == tested


def test_errors_are_also_builtin_types():
    assert issubclass(pk.ContractError, ValueError) and issubclass(pk.ContractError, TypeError)
    assert issubclass(pk.LayoutError, ValueError)
    assert issubclass(pk.NoKernelError, RuntimeError) and issubclass(pk.BackendUnavailableError, RuntimeError)
    for cls in (pk.ContractError, pk.LayoutError, pk.NoKernelError, pk.BackendUnavailableError):
        assert issubclass(cls, pk.PortableKernelsError)
