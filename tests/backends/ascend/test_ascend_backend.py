"""The ascend backend through the public API: conformance with use_backend("ascend", soc=...) runs the
torch_npu providers (on the documented-semantics stand-in) for every op they map, the oracle with a
reason for the others; formats per chip; doctor without torch_npu says why the providers cannot run.

A pass proves the providers call torch_npu as documented; it does not prove what an NPU computes.
"""

import subprocess
import sys

import pytest
import torch

import portable_kernels as pk
from ascend_stub import make_stand_in
from portable_kernels.backends.ascend.vendor import runtime
from portable_kernels.backends.ascend.providers import torch_npu as torch_npu_providers
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.registry import available_backends
from portable_kernels.testing import run_conformance
from portable_kernels.testing.generators import poison, randn

ORACLE = "layout-reference"
#: which provider must run each mapped op, per (soc, scales)
MAPPED = {
    ("950", "ue8m0"): {"fp8_gemm_nt": "torch_npu-mx", "bf16_gemm_nt": "torch_npu", "topk": "torch_npu",
                       "m_grouped_fp8_gemm_nt_contiguous": "torch_npu-mx",
                       "m_grouped_fp8_gemm_nt_masked": "torch_npu-mx",
                       "m_grouped_bf16_gemm_nt_contiguous": "torch_npu-950",
                       "m_grouped_bf16_gemm_nt_masked": "torch_npu-950",
                       "per_token_cast_to_fp8": "torch_npu-mx",
                       "flash_mla_with_kvcache": ("torch_npu-kvquant-sfa", "torch_npu-sfa-950")},
    ("950", "fp32"): {"fp8_gemm_nt": "torch_npu-gb", "bf16_gemm_nt": "torch_npu", "topk": "torch_npu",
                      "m_grouped_bf16_gemm_nt_contiguous": "torch_npu-950",
                      "m_grouped_bf16_gemm_nt_masked": "torch_npu-950",
                      "per_token_cast_to_fp8": "torch_npu-mx",  # its use_ue8m0 cases, with fp32 output scales
                      "flash_mla_with_kvcache": ("torch_npu-kvquant-sfa", "torch_npu-sfa-950")},
    ("910b", "ue8m0"): {"fp8_gemm_nt": "torch_npu-dequantized", "bf16_gemm_nt": "torch_npu", "topk": "torch_npu",
                        "m_grouped_fp8_gemm_nt_contiguous": "torch_npu-dequantized",
                        "m_grouped_fp8_gemm_nt_masked": "torch_npu-dequantized",
                        "m_grouped_bf16_gemm_nt_contiguous": "torch_npu", "m_grouped_bf16_gemm_nt_masked": "torch_npu",
                        "top2_sum_gate": "torch_npu", "flash_mla_with_kvcache": ("torch_npu-fia", "torch_npu-sfa")},
}
MAPPED[("910c", "fp32")] = dict(MAPPED[("910b", "ue8m0")])
for _ops in MAPPED.values():  # torch ops on the NPU (CANN's lightning indexer returns indices only)
    _ops.update({"fp8_mqa_logits": "torch_npu", "fp8_paged_mqa_logits": "torch_npu"})


@pytest.fixture(scope="module", params=sorted(MAPPED), ids=lambda p: f"{p[0]}-{p[1]}")
def report(request):
    soc, scales = request.param
    with runtime.use_stand_in(make_stand_in(soc)):
        return request.param, run_conformance(backend="ascend", quick=True, soc=soc, scales=scales)


def test_conformance_passes_on_the_stand_in(report):
    _, rep = report
    assert rep.ok, rep.format_table()


def test_every_mapped_op_runs_its_torch_npu_provider(report):
    key, rep = report
    for op, wanted in MAPPED[key].items():
        wanted = (wanted,) if isinstance(wanted, str) else wanted
        ran = rep.ops[op].providers
        for name in wanted:
            assert ran.get(name, 0) > 0, f"{op}: {name} did not run ({ran})"


def test_ops_without_a_mapping_run_the_oracle_and_say_why(report):
    key, rep = report
    for op, op_report in rep.ops.items():
        if op in MAPPED[key] or not op_report.providers:
            continue
        assert set(op_report.providers) == {ORACLE}, (op, op_report.providers)
        if op in torch_npu_providers.NOT_MAPPED:
            assert torch_npu_providers.NOT_MAPPED[op]


def test_every_op_with_an_oracle_is_mapped_or_has_a_reason():
    ascend = available_backends()["ascend"]
    for op, providers in ascend.details.items():
        names = {p.name for p in providers}
        if op in torch_npu_providers.NOT_MAPPED:
            assert names == {ORACLE} and ascend.not_mapped[op] == torch_npu_providers.NOT_MAPPED[op], op
        else:
            assert any(n.startswith("torch_npu") for n in names), op


def test_without_torch_npu_the_oracle_runs_and_the_reason_names_torch_npu():
    a = pk.per_token_cast_to_fp8(randn(4, 256, seed=1), use_ue8m0=True)
    b = pk.per_block_cast_to_fp8(randn(64, 256, seed=2), use_ue8m0=True)
    d = poison(4, 64, dtype=torch.bfloat16)
    with pk.use_backend("ascend", soc="950"), trace_providers() as ran:
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, a=a, b=b)
        pk.fp8_gemm_nt(prepared["a"], prepared["b"], d)
    assert ran == [("fp8_gemm_nt", "ascend", ORACLE)]
    provider = next(p for p in available_backends()["ascend"].details["fp8_gemm_nt"] if p.name == "torch_npu-mx")
    with pk.use_backend("ascend", soc="950"):
        from portable_kernels.ops.gemm.dense import GemmInputs
        reasons = provider.not_supported_reasons(GemmInputs(prepared["a"], prepared["b"], d, None))
    assert any("torch_npu is not installed" in r for r in reasons)


def test_a_prepared_operand_remembers_its_chip():
    b = pk.per_block_cast_to_fp8(randn(64, 256, seed=3), use_ue8m0=True)
    with pk.use_backend("ascend", soc="910c"):
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, b=b)["b"]
    assert dict(prepared.params)["soc"] == "910c" and prepared.format.name == "ascend-dequantized-bf16+npu-nz"
    assert prepared.data.dtype == torch.bfloat16 and torch.equal(prepared.data.float(), pk.dequantize(b))


def test_a2_a3_fp32_scales_need_the_fp32_weight_format():
    b = pk.per_block_cast_to_fp8(randn(64, 256, seed=4))  # arbitrary fp32 scales
    with pk.use_backend("ascend", soc="910b"), pytest.raises(pk.LayoutError, match="use_ue8m0"):
        pk.prepare_inputs(pk.fp8_gemm_nt, b=b)
    with pk.use_backend("ascend", soc="910b", scales="fp32"):
        prepared = pk.prepare_inputs(pk.fp8_gemm_nt, b=b)["b"]
    assert prepared.data.dtype == torch.float32 and torch.equal(prepared.data, pk.dequantize(b))


def test_unknown_soc_is_refused():
    with pytest.raises(pk.ContractError, match="soc"):
        with pk.use_backend("ascend", soc="910a"):
            pass


def test_doctor_without_torch_npu_explains_why():
    out = subprocess.run([sys.executable, "-m", "portable_kernels", "doctor"], capture_output=True, text=True,
                         check=True, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": ""}).stdout
    ascend = out[out.index("ascend:"):]
    assert "unavailable: torch_npu is not installed" in ascend.splitlines()[0]
    assert "torch_npu-mx" in ascend and "npu_quant_matmul MX" in ascend
    assert "not mapped: no documented CANN op quantizes 128x128 blocks" in ascend
