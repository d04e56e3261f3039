"""The old internal import paths (before core/, ops/, tools/) keep working for one release, warn,
and give the very module at the new path (so classes, contracts and registries are shared)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import portable_kernels as pk
from portable_kernels.core.moved import MOVED, new_name


def _fresh_import(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, timeout=300)


def test_every_old_path_resolves_to_an_existing_module():
    for old, new in MOVED.items():
        assert importlib.util.find_spec(new) is not None, (old, new)


def test_an_old_path_warns_and_is_the_new_module():
    out = _fresh_import("import portable_kernels.gemm")
    assert out.returncode != 0 and "moved to portable_kernels.ops.gemm.dense" in out.stderr
    with pytest.warns(DeprecationWarning, match="portable_kernels.ops.gemm.grouped"):
        old = importlib.import_module("portable_kernels.grouped_gemm")
    assert old is importlib.import_module("portable_kernels.ops.gemm.grouped")


def test_a_submodule_of_a_moved_package_is_not_loaded_twice():
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("portable_kernels.moe_routing.gate")
    assert old is importlib.import_module("portable_kernels.ops.moe_routing.gate")
    assert new_name("portable_kernels.ep.cost.model") == "portable_kernels.tools.ep_cost.model"


def test_public_names_stay_what_they_were():
    out = _fresh_import("import portable_kernels as pk, portable_kernels.topk, portable_kernels.errors, "
                        "portable_kernels.ep; assert callable(pk.topk) and callable(pk.block_cast); "
                        "assert pk.ep.Buffer is portable_kernels.ops.ep.Buffer")
    assert out.returncode == 0, out.stderr
    assert pk.errors.ContractError is pk.ContractError


def test_an_old_module_attribute_of_the_package_warns():
    with pytest.warns(DeprecationWarning, match="portable_kernels.ops.attention.decode"):
        assert pk.mla.MlaDecodeInputs is importlib.import_module("portable_kernels.ops.attention.decode").MlaDecodeInputs
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        pk.not_a_module  # noqa: B018
