"""The MoE of a decode step in the masked layout (issue 21: "contiguous for prefill, masked for
decode"): each expert's rows padded to the step's T tokens instead of the contiguous alignment,
through `m_grouped_fp8_gemm_nt_masked`. The same FP8 rows and the same per-row GEMMs as the
contiguous path, so the two agree bit for bit (measured on every backend below, 2026-12-04)."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.models import load
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.models.deepseek import layers

BACKENDS = ["cpu", "nvidia:arch=sm90", "nvidia:arch=sm100", "ascend:soc=950", "ascend:soc=910b"]


def _moe(model):
    return next(layer.mlp for layer in model.layers if hasattr(layer.mlp, "w13"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_decode_moe_equals_the_contiguous_path(checkpoints, backend):
    model = load(checkpoints["q_lora"], backend=backend)
    moe = _moe(model)
    for tokens in (1, 3, 8):
        x = torch.randn(tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(tokens)).bfloat16()
        pk.reset_implicit_conversions()
        with pk.use_backend(model.backend, **model.options), trace_providers() as trace:
            masked = moe(x, True)
        ops = {op for op, _, _ in trace}
        assert "m_grouped_fp8_gemm_nt_masked" in ops and "m_grouped_fp8_gemm_nt_contiguous" not in ops, ops
        with pk.use_backend(model.backend, **model.options), trace_providers() as trace:
            contiguous = moe(x, False)
        assert "m_grouped_fp8_gemm_nt_contiguous" in {op for op, _, _ in trace}
        assert torch.equal(masked, contiguous), (tokens, pk.calc_diff(masked, contiguous))
        assert pk.implicit_conversions() == 0


def test_decode_steps_run_masked_and_prefill_contiguous(checkpoints):
    model = load(checkpoints["q_lora"])
    ids = torch.randint(0, 512, (3, 5), generator=torch.Generator().manual_seed(2))
    with trace_providers() as trace:
        state = model.prefill(ids, 4)
    assert {"m_grouped_fp8_gemm_nt_contiguous"} <= {op for op, _, _ in trace}
    assert "m_grouped_fp8_gemm_nt_masked" not in {op for op, _, _ in trace}
    with trace_providers() as trace:
        model.decode_step(state)
    ops = [op for op, _, _ in trace]
    assert ops.count("m_grouped_fp8_gemm_nt_masked") == 2 * sum(hasattr(la.mlp, "w13") for la in model.layers)
    assert "m_grouped_fp8_gemm_nt_contiguous" not in ops


def test_a_decode_batch_past_the_bound_takes_the_contiguous_layout(checkpoints, monkeypatch):
    model = load(checkpoints["q_lora"])
    monkeypatch.setattr(layers, "MASKED_MAX_TOKENS", 2)
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(9)).bfloat16()
    with trace_providers() as trace:
        _moe(model)(x, True)
    assert "m_grouped_fp8_gemm_nt_contiguous" in {op for op, _, _ in trace}
