"""torch.compile(fullgraph=True) of model code calling the public ops: a small DeepSeek-style MoE
block and an MLA decode step compile without a graph break, each op is one node of the graph, and
the compiled outputs equal eager mode's bit for bit (the ops run the same providers; the glue
between them is integer and copy work, so inductor reorders no float math here)."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch

import portable_kernels as pk
from portable_kernels.testing.generators import randn
from portable_kernels.testing.mla_cases import build_paged_cache, random_kv

TOKENS, HIDDEN, INTER, EXPERTS, TOPK, GROUPS, TOPK_GROUPS = 16, 256, 128, 8, 2, 4, 2


def _prepare_weights(seed: int) -> dict[str, Any]:
    """Router and expert weights, quantized and prepared once (journey 1)."""
    router = randn(EXPERTS, HIDDEN, seed=seed, dtype=torch.bfloat16, scale=HIDDEN ** -0.5)
    up = randn(EXPERTS, 2 * INTER, HIDDEN, seed=seed + 1, dtype=torch.bfloat16, scale=HIDDEN ** -0.5)
    down = randn(EXPERTS, HIDDEN, INTER, seed=seed + 2, dtype=torch.bfloat16, scale=INTER ** -0.5)
    return {
        "router": pk.prepare_inputs(pk.fp8_gemm_nt, b=pk.per_block_cast_to_fp8(router))["b"],
        "bias": randn(EXPERTS, seed=seed + 3, scale=0.1),
        "up": pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, b=pk.per_block_cast_to_fp8(up))["b"],
        "down": pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, b=pk.per_block_cast_to_fp8(down))["b"],
    }


def moe_block(x: torch.Tensor, w: dict[str, Any]) -> torch.Tensor:
    """Router GEMM -> grouped top-k gate -> expand -> grouped FP8 GEMM, SwiGLU, grouped FP8 GEMM -> reduce."""
    grouped = pk.m_grouped_fp8_gemm_nt_contiguous
    logits = torch.empty(x.shape[0], EXPERTS, dtype=torch.float32, device=x.device)
    pk.fp8_gemm_nt(pk.per_token_cast_to_fp8(x, prepare_for=pk.fp8_gemm_nt), w["router"], logits)
    topk_idx, topk_weights = pk.top2_sum_gate(logits, w["bias"], TOPK, TOPK_GROUPS, GROUPS, routed_scaling_factor=2.5)
    mapping = pk.get_fused_mapping(topk_idx, EXPERTS)
    expanded = pk.expand_to_fused(x, mapping)
    gate_up = torch.zeros(expanded.shape[0], 2 * INTER, dtype=torch.bfloat16, device=x.device)
    grouped(pk.per_token_cast_to_fp8(expanded, prepare_for=grouped), w["up"], gate_up, mapping.pos_to_expert)
    act = pk.swiglu_forward_and_per_token_cast(gate_up, pos_to_expert=mapping.pos_to_expert, prepare_for=grouped)
    down = torch.zeros(expanded.shape[0], HIDDEN, dtype=torch.bfloat16, device=x.device)
    grouped(act, w["down"], down, mapping.pos_to_expert)
    return pk.reduce_fused(down, topk_weights, mapping)


MOE_OPS = ["per_token_cast_to_fp8", "fp8_gemm_nt", "top2_sum_gate", "get_fused_mapping", "expand_to_fused",
           "per_token_cast_to_fp8", "m_grouped_fp8_gemm_nt_contiguous", "swiglu_forward_and_per_token_cast",
           "m_grouped_fp8_gemm_nt_contiguous", "reduce_fused"]

S_Q, H_Q, LENGTHS, BLOCK = 1, 16, (70, 0, 130), 64


def mla_decode(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
               cache_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: scheduling metadata, then attention over the paged cache."""
    meta, num_splits = pk.get_mla_metadata(cache_seqlens, S_Q * H_Q, 1)
    return pk.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, num_splits, causal=True)


def _decode_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    paged = build_paged_cache(random_kv(LENGTHS, 1, 576, seed=seed), BLOCK, seed=seed)
    q = randn(len(LENGTHS), S_Q, H_Q, 576, seed=seed + 1, dtype=torch.bfloat16)
    return q, paged.k_cache, paged.block_table, paged.cache_seqlens


class GraphRecorder:
    """A torch.compile backend that keeps the captured graphs and runs them as they are."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        self.graphs.append(gm)
        return gm.forward

    def pk_ops(self) -> list[str]:
        return [str(node.target).split(".")[1] for gm in self.graphs for node in gm.graph.nodes
                if node.op == "call_function" and str(node.target).startswith("portable_kernels.")]


def _bit_equal(got: Any, want: Any) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


@pytest.fixture
def fresh_dynamo() -> None:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_moe_block_is_one_graph_with_one_node_per_op(fresh_dynamo: None) -> None:
    w = _prepare_weights(7)
    x = randn(TOKENS, HIDDEN, seed=8, dtype=torch.bfloat16)
    eager = moe_block(x, w)
    recorder = GraphRecorder()
    compiled = torch.compile(moe_block, backend=recorder, fullgraph=True)
    _bit_equal(compiled(x, w), eager)
    assert len(recorder.graphs) == 1
    assert recorder.pk_ops() == MOE_OPS


def test_moe_block_compiles_once_for_any_batch(fresh_dynamo: None) -> None:
    w = _prepare_weights(7)
    recorder = GraphRecorder()
    compiled = torch.compile(moe_block, backend=recorder, fullgraph=True, dynamic=True)
    for tokens, seed in ((16, 8), (5, 9), (33, 10)):
        x = randn(tokens, HIDDEN, seed=seed, dtype=torch.bfloat16)
        _bit_equal(compiled(x, w), moe_block(x, w))
    assert len(recorder.graphs) == 1  # symbolic token count, data-dependent expanded rows


def test_mla_decode_is_one_graph_with_one_node_per_op(fresh_dynamo: None) -> None:
    inputs = _decode_inputs(11)
    eager = mla_decode(*inputs)
    recorder = GraphRecorder()
    compiled = torch.compile(mla_decode, backend=recorder, fullgraph=True)
    _bit_equal(compiled(*inputs), eager)
    assert len(recorder.graphs) == 1
    assert recorder.pk_ops() == ["get_mla_metadata", "flash_mla_with_kvcache"]


def test_inductor_compiles_moe_block_and_mla_decode(fresh_dynamo: None, record_property: Any) -> None:
    w = _prepare_weights(7)
    x = randn(TOKENS, HIDDEN, seed=8, dtype=torch.bfloat16)
    start = time.perf_counter()
    moe = torch.compile(moe_block, fullgraph=True)
    got = moe(x, w)
    record_property("moe_compile_s", time.perf_counter() - start)
    _bit_equal(got, moe_block(x, w))
    x2 = randn(TOKENS, HIDDEN, seed=9, dtype=torch.bfloat16)  # other routing: same graph, new row count
    _bit_equal(moe(x2, w), moe_block(x2, w))

    inputs = _decode_inputs(11)
    start = time.perf_counter()
    decode = torch.compile(mla_decode, fullgraph=True)
    got = decode(*inputs)
    record_property("mla_compile_s", time.perf_counter() - start)
    _bit_equal(got, mla_decode(*inputs))


def test_compiled_graph_refuses_another_backend_than_traced(fresh_dynamo: None) -> None:
    x = randn(4, 256, seed=1, dtype=torch.bfloat16)
    cast = torch.compile(lambda t: pk.per_token_cast_to_fp8(t, use_ue8m0=True, prepare_for="fp8_gemm_nt").scale,
                         backend="eager", fullgraph=True)
    cast(x)
    with pk.use_backend("nvidia", arch="sm100"), pytest.raises(pk.LayoutError, match="traced for cpu"):
        cast(x)


def test_metadata_provider_without_traceable_shapes_says_how_to_fix(fresh_dynamo: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from portable_kernels.core.dispatch import provider_for
    from portable_kernels.ops.attention.decode import GET_MLA_METADATA, MlaMetadataInputs
    from portable_kernels.torch_ops import boundary

    seqlens = torch.tensor([70, 0, 130], dtype=torch.int32)
    provider = provider_for(GET_MLA_METADATA, MlaMetadataInputs(seqlens, 16, 1, None, False, None))

    def reads_values(inputs: Any) -> Any:  # what a provider planning from the lengths on the host does
        return (torch.zeros(int(inputs.cache_seqlens.sum()), 4),), None

    monkeypatch.setitem(boundary._PROVIDER_FAKES, (provider.op, provider.backend, provider.name), reads_values)
    metadata = torch.compile(lambda s: pk.get_mla_metadata(s, 16, 1)[1], backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="register_provider_fake"):
        metadata(seqlens)


def test_argument_errors_surface_under_compile(fresh_dynamo: None) -> None:
    a, b = randn(2, 128, seed=1, dtype=torch.bfloat16), randn(64, 128, seed=2, dtype=torch.bfloat16)
    gemm = torch.compile(lambda a, b, d: pk.bf16_gemm_nt(a, b, d), backend="eager", fullgraph=True)
    with pytest.raises(pk.ContractError, match="argument 'd'"):
        gemm(a, b, torch.empty(2, 63, dtype=torch.bfloat16))
