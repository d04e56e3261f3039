"""The layouts package imports torch and the standard library only, and exports what it promises."""

import ast
import doctest
import importlib
import pathlib
import sys

import torch

import portable_kernels.layouts as layouts

PACKAGE_DIR = pathlib.Path(layouts.__file__).parent


def _imported_top_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_layouts_imports_only_torch_stdlib_and_itself_relatively():
    allowed = {"torch"} | set(sys.stdlib_module_names)
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        foreign = _imported_top_names(path) - allowed
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_public_api_names_exist():
    required = {
        "LayoutConversionError", "is_power_of_two", "ceil_to_ue8m0", "ue8m0_exponents", "ue8m0_to_fp32",
        "sm90_sfa_encode", "sm90_sfa_decode", "sm90_sfb_encode", "sm90_sfb_decode",
        "broadcast_block_scales_to_rows", "sm100_ue8m0_encode", "sm100_ue8m0_decode", "regranularize_k",
        "ascend_mx_encode", "ascend_mx_decode", "ascend_mx_byte_view", "e2m1_encode", "e2m1_decode",
        "pack_e2m1", "unpack_e2m1", "nd_to_nz", "nz_to_nd", "contiguous_m_indices", "counts_from_m_indices",
        "segment_starts", "psum_layout", "counts_from_psum", "m_indices_from_psum", "masked_m_from_counts",
        "check_masked_m", "pack_fp8_kv_cache", "unpack_fp8_kv_cache", "dequantize_fp8_kv_cache",
        "TMA_ALIGN_BYTES", "FP8_E4M3_MAX", "KV_FP8_BYTES_PER_TOKEN",
    }  # fmt: skip
    assert required <= set(layouts.__all__)
    assert all(hasattr(layouts, name) for name in layouts.__all__)


def test_layout_conversion_error_is_a_value_error():
    assert issubclass(layouts.LayoutConversionError, ValueError)


def test_constants_match_formats():
    assert layouts.TMA_ALIGN_BYTES == 16 and layouts.FP8_E4M3_MAX == 448.0
    assert torch.finfo(torch.float8_e4m3fn).max == layouts.FP8_E4M3_MAX


def test_torch_npu_format_ids():
    assert (layouts.ACL_FORMAT_ND, layouts.ACL_FORMAT_FRACTAL_NZ) == (2, 29)


def test_docstring_examples_run():
    attempted = 0
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        name = "portable_kernels.layouts" if path.stem == "__init__" else f"portable_kernels.layouts.{path.stem}"
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0, f"{path.name}: {result.failed} doctest failures"
        attempted += result.attempted
    assert attempted > 0
