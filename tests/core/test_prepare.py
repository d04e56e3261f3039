"""prepare_inputs: convert once, strict mode, lossy refusal, wrong-backend and wrong-layout errors."""

from __future__ import annotations

import warnings

import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing.generators import poison, randn


def _quantized(ue8m0: bool, seed: int = 0):
    a = pk.per_token_cast_to_fp8(randn(8, 256, seed=seed), use_ue8m0=ue8m0)
    b = pk.per_block_cast_to_fp8(randn(32, 256, seed=seed + 1), use_ue8m0=ue8m0)
    return a, b


def test_prepared_inputs_are_tagged_and_convert_nothing_at_call_time():
    a, b = _quantized(False)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
    assert {k: v.tag.backend for k, v in prepared.items()} == {"a": "cpu", "b": "cpu"}
    d = poison(8, 32, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
    assert pk.implicit_conversions() == 0


def test_prepare_by_name_or_function_gives_the_same_bytes():
    a, b = _quantized(False)
    by_name = pk.prepare_inputs("fp8_gemm_nt", b=b)["b"]
    by_fn = pk.prepare_inputs(pk.fp8_gemm_nt, b=b)["b"]
    assert by_name.tag == by_fn.tag and torch.equal(by_name.scale, by_fn.scale)


def test_non_quantized_arguments_pass_through():
    a, b = _quantized(False)
    d = torch.empty(8, 32)
    out = pk.prepare_inputs(pk.fp8_gemm_nt, b=b, d=d)
    assert out["d"] is d


def test_unknown_argument_name_is_refused():
    a, _ = _quantized(False)
    with pytest.raises(pk.ContractError, match="no argument 'z'"):
        pk.prepare_inputs(pk.fp8_gemm_nt, z=a)


def test_implicit_conversion_is_counted_and_warned_once():
    a, b = _quantized(False)
    d = torch.empty(8, 32)
    with pytest.warns(pk.ImplicitConversionWarning) as record:
        pk.fp8_gemm_nt(a, b, d)
        pk.fp8_gemm_nt(a, b, d)
    assert pk.implicit_conversions() == 4
    assert len([w for w in record if issubclass(w.category, pk.ImplicitConversionWarning)]) == 1


def test_strict_mode_context_manager_turns_implicit_conversion_into_layout_error():
    a, b = _quantized(False)
    with pk.strict_layouts(), pytest.raises(pk.LayoutError, match="prepare_inputs"):
        pk.fp8_gemm_nt(a, b, torch.empty(8, 32))
    assert pk.implicit_conversions() == 0


def test_strict_mode_from_environment(monkeypatch):
    a, b = _quantized(False)
    monkeypatch.setenv("PK_STRICT_LAYOUTS", "1")
    with pytest.raises(pk.LayoutError, match="strict"):
        pk.fp8_gemm_nt(a, b, torch.empty(8, 32))
    with pk.strict_layouts(False), pytest.warns(pk.ImplicitConversionWarning):
        pk.fp8_gemm_nt(a, b, torch.empty(8, 32))


def test_non_power_of_two_scales_are_refused_by_an_exponent_only_layout(exp_backend):
    _, b = _quantized(False)
    with pytest.raises(pk.LayoutError, match="use_ue8m0=True"):
        pk.prepare_inputs(pk.fp8_gemm_nt, backend=exp_backend, b=b)


def test_power_of_two_scales_round_trip_through_an_exponent_only_layout(exp_backend):
    a, b = _quantized(True)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, backend=exp_backend, a=a, b=b)
    assert prepared["b"].scale.dtype == torch.uint8
    assert torch.equal(pk.dequantize(prepared["b"]), pk.dequantize(b))
    d = poison(8, 32, dtype=torch.float32)
    pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
    assert pk.calc_diff(d, ref) <= 1e-6 and pk.implicit_conversions() == 0


def test_prepared_for_one_backend_called_on_another_names_both(exp_backend):
    a, b = _quantized(True)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, backend=exp_backend, b=b)["b"]
    with pk.use_backend("cpu"), pytest.raises(pk.LayoutError) as info:
        pk.fp8_gemm_nt(a, prepared, torch.empty(8, 32))
    assert exp_backend in str(info.value) and "'cpu'" in str(info.value)


def test_wrong_layout_tag_is_refused():
    a, b = _quantized(False)
    good = pk.prepare_inputs(pk.fp8_gemm_nt, b=b)["b"]
    forged = pk.PreparedTensor(good.data, good.scale, pk.layouts.SM90, "cpu", good.shape, good.granularity,
                               good.storage_granularity)
    with pytest.raises(pk.LayoutError, match="cpu:sm90-fp32-mn-major-tma.*needs cpu:fp32-row-major"):
        pk.fp8_gemm_nt(a, forged, torch.empty(8, 32))


def test_prepare_moves_to_requested_device():
    _, b = _quantized(False)
    prepared = pk.prepare_inputs(pk.fp8_gemm_nt, device="cpu", b=b)["b"]
    assert prepared.device.type == "cpu"


def test_prepared_tensor_and_quant_tensor_print_readable_summaries():
    a, b = _quantized(False)
    text = repr(pk.prepare_inputs(pk.fp8_gemm_nt, b=b)["b"])
    assert "cpu:fp32-row-major" in text and "(32, 256)" in text
    assert "granularity=(1, 128)" in repr(a)


def test_prepared_weights_round_trip_through_torch_save_by_format_name(tmp_path):
    _, b = _quantized(True)
    for backend, options in (("cpu", {}), ("nvidia", {"arch": "sm100"}), ("ascend", {})):
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, backend=backend, options=options, b=b)["b"]
        path = tmp_path / f"{backend}.pt"
        torch.save(prepared, path)
        loaded = torch.load(path, weights_only=False)
        assert loaded.format is prepared.format and loaded.tag == prepared.tag
        assert torch.equal(pk.dequantize(loaded), pk.dequantize(prepared))
