"""The demo's model code: one DeepSeek-V3-shaped MoE layer and one MLA decode step, written once
against the public API and run unchanged on every backend.

The MoE layer: router logits -> `top2_sum_gate` (grouped top-k, DeepSeek-V3's gate) ->
`get_fused_mapping` -> `expand_to_fused` -> FP8 cast straight into the grouped GEMM's format
(`prepare_for`) -> `m_grouped_fp8_gemm_nt_contiguous` (gate and up projections) ->
`swiglu_forward_and_per_token_cast` (into the next GEMM's format) -> `m_grouped_fp8_gemm_nt_contiguous`
(down projection) -> `reduce_fused` (weighted sum back to tokens). The expert weights are quantized
once and prepared once per backend (`prepare_inputs`): the hot path converts nothing.
The MLA step: `get_mla_metadata` + `flash_mla_with_kvcache` over a paged bf16 cache.
"""

from __future__ import annotations

import attrs
import torch

from ...ops.gemm.grouped import m_grouped_fp8_gemm_nt_contiguous
from ...ops.attention.decode import flash_mla_with_kvcache, get_mla_metadata
from ...ops.moe_routing import expand_to_fused, get_fused_mapping, reduce_fused, top2_sum_gate
from ...core.prepare import prepare_inputs
from ...ops.quant.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8
from ...ops.swiglu import swiglu_forward_and_per_token_cast
from ...core.tensors import PreparedTensor, QuantTensor

GROUPED = m_grouped_fp8_gemm_nt_contiguous


@attrs.frozen
class MoeShape:
    """A DeepSeek-V3 MoE layer scaled down (V3: hidden 7168, moe_intermediate 2048, 256 experts in
    8 groups, 4 groups kept, top-8, routed scaling 2.5)."""

    tokens: int = 64
    hidden: int = 1024
    intermediate: int = 256
    experts: int = 16
    groups: int = 4
    topk_groups: int = 2
    topk: int = 4
    routed_scaling_factor: float = 2.5


@attrs.frozen
class MlaShape:
    """One MLA decode step (FlashMLA's shapes: 576-channel keys, 512 of them the values)."""

    batch: int = 2
    heads: int = 16
    seqlen: int = 512
    block_size: int = 64


@attrs.frozen
class MoeWeights:
    """The layer's weights as quantized once: router fp32 [E, H], its bias [E], w13 [E, 2I, H] and
    w2 [E, H, I] as 128x128-block FP8 with power-of-two scales (every backend's Format holds them)."""

    router: torch.Tensor
    bias: torch.Tensor
    w13: QuantTensor
    w2: QuantTensor


def make_weights(shape: MoeShape, seed: int = 0) -> MoeWeights:
    g = torch.Generator().manual_seed(seed)
    h, i, e = shape.hidden, shape.intermediate, shape.experts
    router = torch.randn(e, h, generator=g) * h ** -0.5
    bias = torch.randn(e, generator=g) * 0.01
    w13 = torch.randn(e, 2 * i, h, generator=g) * h ** -0.5
    w2 = torch.randn(e, h, i, generator=g) * i ** -0.5
    return MoeWeights(router, bias, per_block_cast_to_fp8(w13.bfloat16(), use_ue8m0=True),
                      per_block_cast_to_fp8(w2.bfloat16(), use_ue8m0=True))


@attrs.frozen
class PreparedMoe:
    """The weights in one backend's bytes (what `prepare_inputs` returned, once)."""

    router: torch.Tensor
    bias: torch.Tensor
    w13: PreparedTensor
    w2: PreparedTensor


def prepare_weights(weights: MoeWeights, device: torch.device) -> PreparedMoe:
    """Convert the expert weights once, into the backend selected by the caller's use_backend."""
    w13 = prepare_inputs(GROUPED, device=device if device.type != "cpu" else None, b=weights.w13)["b"]
    w2 = prepare_inputs(GROUPED, device=device if device.type != "cpu" else None, b=weights.w2)["b"]
    return PreparedMoe(weights.router.to(device), weights.bias.to(device), w13, w2)


def moe_forward(x: torch.Tensor, w: PreparedMoe, shape: MoeShape) -> torch.Tensor:
    """x bf16 [T, H] -> bf16 [T, H]: the routed experts' weighted sum (the same code on every backend)."""
    logits = x.float() @ w.router.T
    topk_idx, topk_weights = top2_sum_gate(logits, w.bias, shape.topk, shape.topk_groups, shape.groups,
                                           routed_scaling_factor=shape.routed_scaling_factor)
    mapping = get_fused_mapping(topk_idx, shape.experts)       # aligned to this backend's grouped GEMM
    rows = expand_to_fused(x, mapping)                           # [P, H], padding rows zero
    a = per_token_cast_to_fp8(rows, use_ue8m0=True, prepare_for=GROUPED)
    h13 = torch.empty(rows.shape[0], 2 * shape.intermediate, dtype=torch.bfloat16, device=x.device)
    GROUPED(a, w.w13, h13, mapping.pos_to_expert)
    act = swiglu_forward_and_per_token_cast(h13, round_sf=True, pos_to_expert=mapping.pos_to_expert,
                                            prepare_for=GROUPED)
    y = torch.zeros(rows.shape[0], shape.hidden, dtype=torch.bfloat16, device=x.device)
    GROUPED(act, w.w2, y, mapping.pos_to_expert)
    return reduce_fused(y, topk_weights, mapping)


@attrs.frozen
class MlaInputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    cache_seqlens: torch.Tensor


def make_mla_inputs(shape: MlaShape, seed: int = 1) -> MlaInputs:
    g = torch.Generator().manual_seed(seed)
    blocks = -(-shape.seqlen // shape.block_size)
    q = torch.randn(shape.batch, 1, shape.heads, 576, generator=g).bfloat16()
    cache = torch.randn(shape.batch * blocks, shape.block_size, 1, 576, generator=g).bfloat16()
    table = torch.randperm(shape.batch * blocks, generator=g).to(torch.int32).view(shape.batch, blocks)
    lengths = torch.randint(shape.seqlen // 2, shape.seqlen + 1, (shape.batch,), generator=g).to(torch.int32)
    return MlaInputs(q, cache, table, lengths)


def mla_step(inputs: MlaInputs, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: (out bf16 [b, 1, h, 512], lse fp32 [b, h, 1])."""
    q, cache = inputs.q.to(device), inputs.k_cache.to(device)
    table, lengths = inputs.block_table.to(device), inputs.cache_seqlens.to(device)
    meta, splits = get_mla_metadata(lengths, q.shape[2], 1)
    return flash_mla_with_kvcache(q, cache, table, lengths, 512, meta, splits)
