"""Registry: selection order, overrides, provider priority and NoKernelError reasons, reports."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.providers import Limit
from portable_kernels.core.registry import Registry, common_device, select_backend
from portable_kernels.testing.generators import randn
from portable_kernels.ops.topk import TopkInputs

CPU = torch.device("cpu")


def test_device_rule_picks_cpu_for_cpu_tensors():
    sel = select_backend("fp8_gemm_nt", CPU, {})
    assert sel.backend.name == "cpu" and not sel.explicit


def test_prepared_tag_beats_device(exp_backend):
    sel = select_backend("fp8_gemm_nt", CPU, {"b": (exp_backend, ())})
    assert sel.backend.name == exp_backend and sel.explicit


def test_use_backend_beats_device_and_passes_options():
    with pk.use_backend("nvidia", arch="sm100"):
        sel = select_backend("fp8_gemm_nt", CPU, {})
    assert sel.backend.name == "nvidia" and sel.options["arch"] == "sm100"
    assert select_backend("fp8_gemm_nt", CPU, {}).backend.name == "cpu"


def test_use_backend_refuses_an_option_the_backend_does_not_declare():
    with pytest.raises(pk.ContractError, match="no option 'archh'.*arch in"):
        with pk.use_backend("nvidia", archh="sm100"):
            pass
    with pytest.raises(pk.ContractError, match="not one of"):
        with pk.use_backend("nvidia", arch="sm_100"):
            pass


def test_use_backend_conflicting_with_prepared_tag_is_a_layout_error_naming_both(exp_backend):
    with pk.use_backend("cpu"), pytest.raises(pk.LayoutError, match=f"'{exp_backend}'.*'cpu'"):
        select_backend("fp8_gemm_nt", CPU, {"b": (exp_backend, ())})


def test_arguments_prepared_for_two_backends_are_refused(exp_backend):
    with pytest.raises(pk.LayoutError, match="different backends"):
        select_backend("fp8_gemm_nt", CPU, {"a": ("cpu", ()), "b": (exp_backend, ())})


def test_unknown_backend_name_is_backend_unavailable():
    with pytest.raises(pk.BackendUnavailableError, match="not registered"):
        with pk.use_backend("no_such_backend"):
            pass


def test_emulation_backend_refuses_cpu_tensors_unless_chosen_explicitly(exp_backend):
    backend = pk.registry().backend(exp_backend)
    assert backend.emulation and "cpu" not in backend.device_types
    # chosen by device, cpu goes to the cpu backend; chosen explicitly, emulation is allowed
    with pk.use_backend(exp_backend):
        assert select_backend("topk", CPU, {}).backend.name == exp_backend


def test_tensors_on_different_devices_are_a_contract_error():
    with pytest.raises(pk.ContractError, match="different devices"):
        common_device("op", [torch.zeros(1), torch.zeros(1, device="meta")])


class _Toy(pk.Backend):
    name = "toy"
    device_types = ("cpu",)


def _toy_registry() -> Registry:
    reg = Registry()
    reg._loaded = True  # no entry points: a private registry for selection tests
    reg.add_backend(_Toy())
    return reg


def _topk_inputs(n: int) -> TopkInputs:
    return TopkInputs(randn(1, n, seed=3), 1, None, False, False, torch.int64, 0, 0.0, True)


def test_providers_are_tried_by_priority_and_first_supporting_wins():
    reg = _toy_registry()
    reg.kernel("topk", "toy", "slow", priority=0)(lambda call: "slow")
    reg.kernel("topk", "toy", "fast", priority=10, limits=[Limit("n", max=4)])(lambda call: "fast")
    assert reg.select_provider("topk", "toy", _topk_inputs(2)).name == "fast"
    assert reg.select_provider("topk", "toy", _topk_inputs(9)).name == "slow"


def test_no_kernel_error_lists_every_provider_and_every_reason():
    reg = _toy_registry()
    reg.kernel("topk", "toy", "a", check=lambda call: ["a wants even n"], limits=[Limit("n", multiple_of=2)])(
        lambda call: None)
    reg.kernel("topk", "toy", "b", devices=("cuda",))(lambda call: None)
    with pytest.raises(pk.NoKernelError) as info:
        reg.select_provider("topk", "toy", _topk_inputs(3))
    assert info.value.reasons == {"a": ["n = 3 is not a multiple of 2", "a wants even n"],
                                  "b": ["runs on cuda tensors, not cpu"]}
    assert "a wants even n" in str(info.value) and "runs on cuda tensors" in str(info.value)


def test_no_kernel_error_quotes_the_backends_not_mapped_reason():
    class _Unmapped(_Toy):
        name = "unmapped"
        not_mapped = {"topk": "no vendor op ranks ties this way"}

    reg = _toy_registry()
    reg.add_backend(_Unmapped())
    reg.kernel("topk", "unmapped", "a", limits=[Limit("n", max=2)])(lambda call: None)
    with pytest.raises(pk.NoKernelError) as info:
        reg.select_provider("topk", "unmapped", _topk_inputs(3))
    assert info.value.reasons["not mapped"] == ["no vendor op ranks ties this way"]
    assert "no vendor op ranks ties this way" in str(info.value)


def test_register_modules_isolates_a_broken_module(tmp_path, monkeypatch):
    pkg = tmp_path / "toy_providers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a_broken.py").write_text("raise ImportError('no such vendor library')\n")
    (pkg / "b_topk.py").write_text(
        "def register(registry):\n    registry.kernel('topk', 'toy', 'b')(lambda call: 'b')\n")
    (pkg / "_private.py").write_text("raise AssertionError('modules starting with _ are not registered')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import toy_providers
    reg = _toy_registry()
    reg.register_modules(toy_providers, "toy")
    assert [p.name for p in reg.providers("topk", "toy")] == ["b"]
    assert "no such vendor library" in reg.broken_plugins()["toy.a_broken"]


def test_an_exception_inside_a_check_is_a_reason_not_a_crash():
    reg = _toy_registry()

    def broken(call):
        raise KeyError("oops")

    reg.kernel("topk", "toy", "broken", priority=5, check=broken)(lambda call: "broken")
    reg.kernel("topk", "toy", "fine")(lambda call: "fine")
    assert reg.select_provider("topk", "toy", _topk_inputs(4)).name == "fine"
    reasons = reg.providers("topk", "toy")[0].not_supported_reasons(_topk_inputs(4))
    assert reasons == ["its support check raised KeyError: 'oops'"]


def test_registering_a_provider_for_an_unknown_op_is_refused():
    reg = _toy_registry()
    with pytest.raises(ValueError, match="no op named 'tpok'"):
        reg.kernel("tpok", "toy", "native")(lambda call: None)


def test_a_broken_plugin_is_reported_not_raised():
    reg = _toy_registry()

    def broken_loader():
        raise ImportError("missing dependency foo")

    reg.load_plugin("broken", broken_loader)
    assert "missing dependency foo" in reg.broken_plugins()["broken"]


def test_duplicate_backend_or_provider_is_refused():
    reg = _toy_registry()
    with pytest.raises(ValueError):
        reg.add_backend(_Toy())
    reg.kernel("topk", "toy", "p")(lambda call: None)
    with pytest.raises(ValueError, match="already registered"):
        reg.kernel("topk", "toy", "p")(lambda call: None)


def test_available_backends_reports_devices_providers_and_availability():
    info = pk.available_backends()["cpu"]
    assert info.available and info.reason is None and info.device_types == ("cpu",)
    assert "reference" in info.providers["fp8_gemm_nt"]


def test_every_contract_has_a_cpu_provider():
    cpu_ops = set(pk.available_backends()["cpu"].providers)
    missing = [op for op in pk.contracts() if op not in cpu_ops]
    assert not missing, f"ops without a cpu provider: {missing}"


def test_call_on_backend_without_provider_raises_no_kernel_error(exp_backend):
    x = randn(2, 64, seed=1)
    with pk.use_backend(exp_backend), pytest.raises(pk.NoKernelError, match="bf16_gemm_nt"):
        pk.bf16_gemm_nt(x.bfloat16(), x.bfloat16(), torch.empty(2, 2))


def test_value_checks_run_on_cpu_and_on_accelerators_only_when_asked(monkeypatch):
    from portable_kernels.core.contract import checks_values
    cpu, meta = torch.zeros(1), torch.zeros(1, device="meta")
    assert checks_values(cpu) and checks_values(None)
    monkeypatch.delenv("PK_CHECK_VALUES", raising=False)
    assert not checks_values(cpu, meta)
    monkeypatch.setenv("PK_CHECK_VALUES", "1")
    assert checks_values(meta)


def test_a_plugin_ep_engine_is_chosen_by_priority_and_a_failing_probe_is_a_reason():
    from portable_kernels.core.registry import EpEngine

    def broken(group):
        raise RuntimeError("probe failed")

    reg = _toy_registry()
    reg.add_ep_engine(EpEngine("low", "toy", lambda buffer: "low", lambda group: None, priority=1))
    reg.add_ep_engine(EpEngine("high", "toy", lambda buffer: "high", lambda group: "needs an RDMA group", priority=5))
    reg.add_ep_engine(EpEngine("odd", "toy", lambda buffer: "odd", broken, priority=3))
    engine, reasons = reg.select_ep_engine(object())
    assert engine.name == "low"
    assert reasons == {"toy.high": "needs an RDMA group",
                       "toy.odd": "its availability check raised RuntimeError: probe failed"}
    with pytest.raises(ValueError, match="already registered"):
        reg.add_ep_engine(EpEngine("low", "toy", lambda buffer: None, lambda group: None))
