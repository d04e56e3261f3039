"""DeepSeek-V3's layers on portable_kernels: FP8 block linears, the dense/shared MLP, the routed MoE
and MLA with weight absorption.

One rule: every matrix multiply with a checkpoint weight is a portable_kernels op on a weight
prepared once at load; plain torch does only RMSNorm, RoPE, the router's small fp32 logits
product and the per-head absorption products with kv_b_proj (see docs/models.md).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import torch

import portable_kernels as pk

from .config import DeepseekV3Config

FP8_GEMM = pk.fp8_gemm_nt
GROUPED = pk.m_grouped_fp8_gemm_nt_contiguous
#: the decode steps' grouped GEMM: rows in the masked layout [experts, slots, H]
MASKED = pk.m_grouped_fp8_gemm_nt_masked
#: the largest decode batch that takes the masked layout (beyond it the contiguous one pads less);
#: under expert parallelism also the low-latency pair's num_max_dispatch_tokens_per_rank bound
#: (DeepEP's tests and serving engines use 128)
MASKED_MAX_TOKENS = 128
# Activations get power-of-two (UE8M0) scales: every backend's Format holds them (sm100 and the
# Ascend 950 need them), so the model code is the same on all of them.
ACTIVATION_UE8M0 = True


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16/fp32 [T, D] -> bf16 [T, D], computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).bfloat16()


def rope_inv_freq(cfg: DeepseekV3Config) -> torch.Tensor:
    """fp32 [rope_dim / 2]: theta^(-2i/dim), or YaRN's blend of it and its interpolation by `factor`
    (Hugging Face's _compute_yarn_parameters: a linear ramp between the correction dimensions of
    beta_fast and beta_slow rotations over the original context)."""
    dim = cfg.qk_rope_head_dim
    base = cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    yarn = cfg.rope_yarn
    if yarn is None:
        return inv_freq

    def correction_dim(rotations: float) -> float:
        return dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency (fast dimensions), 0: interpolated by factor
    return inv_freq / yarn.factor * (1 - keep) + inv_freq * keep


def rope_tables(cfg: DeepseekV3Config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin fp32 [T, rope_dim / 2] at these absolute positions (YaRN's attention factor applied)."""
    angles = positions.float()[:, None] * rope_inv_freq(cfg).to(positions.device)[None, :]
    cos, sin = angles.cos(), angles.sin()
    if cfg.rope_yarn is not None:
        factor = cfg.rope_yarn.cos_sin_factor()
        cos, sin = cos * factor, sin * factor
    return cos, sin


def softmax_scale(cfg: DeepseekV3Config) -> float:
    """qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 (DeepSeek-V3: 1.3689^2)."""
    return cfg.qk_head_dim ** -0.5 * (1.0 if cfg.rope_yarn is None else cfg.rope_yarn.softmax_factor())


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x [T, (heads,) 64] -> fp32, rotated. Interleaved pairs (x0, x1), (x2, x3) as DeepSeek's
    checkpoints store them, written out as [rotated evens | rotated odds] (as Hugging Face does):
    q and k get the same permutation, so their dot products are those of the paired form."""
    x = x.float()
    if x.dim() == 3:
        cos, sin = cos[:, None, :], sin[:, None, :]
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@attrs.frozen
class Fp8Linear:
    """y = x · Wᵀ with W a 128x128-block FP8 weight prepared once for the backend."""

    weight: pk.PreparedTensor
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """bf16 [T, K] -> bf16 [T, N]."""
        a = pk.per_token_cast_to_fp8(x.bfloat16().contiguous(), use_ue8m0=ACTIVATION_UE8M0, prepare_for=FP8_GEMM)
        return self.on_quantized(a, x.shape[0], x.device)

    def on_quantized(self, a: pk.PreparedTensor, rows: int, device: torch.device) -> torch.Tensor:
        """The GEMM alone, on an activation already quantized into the weight's Format -> bf16 [rows, N]."""
        d = torch.empty(rows, self.out_features, dtype=torch.bfloat16, device=device)
        FP8_GEMM(a, self.weight, d)
        return d


@attrs.frozen
class Mlp:
    """SwiGLU MLP (dense layers and shared experts): gate and up as one FP8 GEMM, the SwiGLU and
    its FP8 cast in one op straight into the down projection's Format."""

    gate_up: Fp8Linear
    down: Fp8Linear

    def __call__(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """bf16 [T, H] -> bf16 [T, H]; `decode` (a decode step) changes nothing here."""
        h = self.gate_up(x)
        act = pk.swiglu_forward_and_per_token_cast(h, round_sf=ACTIVATION_UE8M0, prepare_for=FP8_GEMM)
        return self.down.on_quantized(act, x.shape[0], x.device)


def slot_owners(counts: torch.Tensor, slots: int) -> torch.Tensor:
    """int32 [E · slots]: the expert of each slot of the masked layout, -1 past expert e's counts[e]
    (the pos_to_expert of its rows)."""
    filled = torch.arange(slots, device=counts.device)[None, :] < counts[:, None]
    experts = torch.arange(counts.shape[0], dtype=torch.int32, device=counts.device)[:, None]
    return torch.where(filled, experts, -1).view(-1)


@attrs.frozen
class Moe:
    """Routed experts (+ shared experts). Router: `top2_sum_gate`, DeepSeek-V3's group-limited
    sigmoid gate with the correction bias for selection only (tests/models checks it against
    Hugging Face's router). Experts: expand -> grouped FP8 GEMM (w13) -> SwiGLU + cast -> grouped
    FP8 GEMM (w2) -> weighted reduce, in the contiguous layout for prefill. A decode step (at most
    MASKED_MAX_TOKENS tokens) uses the masked layout [experts, T slots, H] and the masked GEMMs
    (`masked_experts`): every expert's rows are padded to T, not to the contiguous alignment (128),
    so far fewer padding rows are expanded, cast and swiglu'd. Under expert parallelism the decode
    step's rows come in that layout from the low-latency dispatch and go back through its weighted
    combine (models.deepseek.ep)."""

    cfg: DeepseekV3Config
    router: torch.Tensor        # fp32 [E, H]
    bias: torch.Tensor          # fp32 [E]
    w13: pk.PreparedTensor      # [E, 2I, H]: each expert's gate rows, then its up rows
    w2: pk.PreparedTensor       # [E, H, I] (this rank's E / N experts under expert parallelism)
    shared: Mlp | None
    ep: Any = None              # models.deepseek.ep.ExpertParallel, or None: every expert here

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = x.float() @ self.router.T
        return pk.top2_sum_gate(logits, self.bias, cfg.num_experts_per_tok, cfg.topk_group, cfg.n_group,
                                routed_scaling_factor=cfg.routed_scaling_factor, normalize=cfg.norm_topk_prob)

    def __call__(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """bf16 [T, H] -> fp32 [T, H]. decode: this is a decode step (one new token per sequence),
        which under expert parallelism runs the low-latency dispatch and the masked GEMMs."""
        topk_idx, topk_weights = self.route(x)
        if self.ep is None and decode and x.shape[0] <= MASKED_MAX_TOKENS:
            out = self.experts_masked_layout(x, topk_idx, topk_weights)
        elif self.ep is None:
            out = self.experts(x, topk_idx, topk_weights, self.cfg.n_routed_experts)
        else:
            out = self.ep.moe(x, topk_idx, topk_weights, self.experts, self.masked_experts if decode else None)
        if self.shared is not None:
            out = out + self.shared(x).float()
        return out

    def experts(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                num_experts: int) -> torch.Tensor:
        """sum_k w_k · expert_k(x) over the experts this layer holds (ids 0..num_experts-1; -1: none) -> fp32."""
        cfg = self.cfg
        mapping = pk.get_fused_mapping(topk_idx, num_experts)
        rows = pk.expand_to_fused(x, mapping)
        a = pk.per_token_cast_to_fp8(rows, use_ue8m0=ACTIVATION_UE8M0, prepare_for=GROUPED)
        h13 = torch.empty(rows.shape[0], 2 * cfg.moe_intermediate_size, dtype=torch.bfloat16, device=x.device)
        # padding rows of h13 and y are never read (swiglu returns them as zeros, reduce reads only
        # mapped rows), so they are not zeroed: at a decode step nearly every row is padding
        GROUPED(a, self.w13, h13, mapping.pos_to_expert, ensure_zero_padding=False)
        act = pk.swiglu_forward_and_per_token_cast(h13, round_sf=ACTIVATION_UE8M0,
                                                   pos_to_expert=mapping.pos_to_expert, prepare_for=GROUPED)
        y = torch.empty(rows.shape[0], cfg.hidden_size, dtype=torch.bfloat16, device=x.device)
        GROUPED(act, self.w2, y, mapping.pos_to_expert, ensure_zero_padding=False)
        return pk.reduce_fused(y, topk_weights, mapping).float()

    def experts_masked_layout(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
                              ) -> torch.Tensor:
        """`experts` for a decode step, in the masked layout: token t's copy for expert e goes to slot
        e·T + (its rank among e's tokens), each expert's T slots padded past its count -> fp32 [T, H].
        The slot arithmetic is plain torch on [T, k] and [E, T] index tensors (from get_fused_mapping's
        exact counts); every row operation is a library op."""
        experts, tokens = self.cfg.n_routed_experts, x.shape[0]
        mapping = pk.get_fused_mapping(topk_idx, experts, alignment=1)
        chosen = topk_idx >= 0
        expert = topk_idx.clamp(min=0)
        rank_in_expert = mapping.token_topk_to_pos - mapping.expert_start[expert]
        pos = torch.where(chosen, expert * tokens + rank_in_expert, -1).to(torch.int32)
        counts = mapping.num_tokens_per_expert
        rows = pk.expand_to_fused(x.bfloat16(), pos, slot_owners(counts, tokens))
        a = pk.per_token_cast_to_fp8(rows.view(experts, tokens, -1), use_ue8m0=ACTIVATION_UE8M0, prepare_for=MASKED)
        expected = max(1, -(-tokens * topk_idx.shape[1] // experts))
        y = self.masked_experts(a, counts, expected)
        return pk.reduce_fused(y.view(experts * tokens, -1), topk_weights, pos).float()

    def masked_experts(self, rows: pk.PreparedTensor, counts: torch.Tensor, expected_m: int) -> torch.Tensor:
        """expert_e(rows[e, :counts[e]]) for this layer's experts: rows FP8 [E, slots, H] in the masked
        GEMM's Format (the low-latency dispatch's output), counts int32 [E] -> bf16 [E, slots, H];
        slots past counts[e] are left unwritten (the combine never reads them)."""
        cfg = self.cfg
        experts, slots = counts.shape[0], rows.shape[1]
        inter = cfg.moe_intermediate_size
        h13 = torch.empty(experts, slots, 2 * inter, dtype=torch.bfloat16, device=counts.device)
        MASKED(rows, self.w13, h13, counts, expected_m)
        # the SwiGLU + cast runs over the slots as rows: unfilled slots are padding (-1)
        act = pk.swiglu_forward_and_per_token_cast(h13.view(experts * slots, 2 * inter), round_sf=ACTIVATION_UE8M0,
                                                   pos_to_expert=slot_owners(counts, slots))
        # the cast writes [E * slots, I] rows; the masked GEMM reads [E, slots, I]: on a backend whose
        # Format for it is not plain this is one conversion per call, not counted as implicit
        act = pk.prepare_inputs(MASKED, a=pk.QuantTensor(act.data.view(experts, slots, inter),
                                                         act.scale.view(experts, slots, -1), act.granularity,
                                                         ue8m0=act.ue8m0, element=act.element))["a"]
        y = torch.empty(experts, slots, cfg.hidden_size, dtype=torch.bfloat16, device=counts.device)
        MASKED(act, self.w2, y, counts, expected_m)
        return y


HEAD_PRODUCT = pk.m_grouped_bf16_gemm_nt_masked


@attrs.frozen
class HeadProduct:
    """y[t, h] = x[t, h] · W[h]ᵀ for one absorbed block of kv_b_proj, W [heads, N, K]: one masked
    grouped bf16 GEMM (each head a group of T rows, fp32 sums rounded once to bf16) when W is exact
    in bf16 — it is for power-of-two-scaled FP8 weights, an e4m3 value times 2^k fitting bf16 — so
    it reads half the bytes of fp32 and gives the fp32 product's sums; else fp32 torch.einsum."""

    w: torch.Tensor  # bf16 (exact) or fp32 [heads, N, K]

    @staticmethod
    def of(w: torch.Tensor, keep: Callable[[torch.Tensor, torch.dtype], torch.Tensor]) -> "HeadProduct":
        """From the fp32 block [heads, N, K]; keep(tensor, dtype) stores (and counts) the copy kept."""
        w = w.contiguous()
        exact = torch.equal(w.bfloat16().float(), w)
        return HeadProduct(keep(w, torch.bfloat16 if exact else torch.float32))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x bf16 [T, heads, K] -> bf16 [T, heads, N]."""
        if self.w.dtype != torch.bfloat16:
            return torch.einsum("thk,hnk->thn", x.float(), self.w).bfloat16()
        t, heads, _ = x.shape
        d = torch.empty(heads, t, self.w.shape[1], dtype=torch.bfloat16, device=x.device)
        counts = torch.full((heads,), t, dtype=torch.int32, device=x.device)
        HEAD_PRODUCT(x.bfloat16().transpose(0, 1).contiguous(), self.w, d, counts, max(t, 1))
        return d.transpose(0, 1)


@attrs.frozen
class Mla:
    """Multi-head latent attention with weight absorption: the cache holds per token the normed
    512-wide latent and the 64-wide rotated key (576 channels, one KV head); each query head is
    mapped into latent space by W_UK, attention runs over the latent cache, and W_UV maps the
    512-wide result back per head before o_proj."""

    cfg: DeepseekV3Config
    q_a: Fp8Linear | None
    q_a_norm: torch.Tensor | None
    q_b: Fp8Linear             # q_b_proj, or q_proj when q_lora_rank is None
    kv_a: Fp8Linear
    kv_a_norm: torch.Tensor
    uk: HeadProduct            # W_UKᵀ [heads, 512, qk_nope]: q_nope -> latent
    uv: HeadProduct            # W_UV [heads, v_head, 512]: latent -> v
    o_proj: Fp8Linear
    indexer: "Indexer | None" = None  # DeepSeek-V3.2

    @property
    def softmax_scale(self) -> float:
        return softmax_scale(self.cfg)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x bf16 [T, H] -> (q bf16 [T, heads, 576], cache entries bf16 [T, 576], the q latent
        bf16 [T, q_lora_rank] (x itself without q_lora) that V3.2's indexer reads)."""
        cfg = self.cfg
        hq = x if self.q_a is None else rms_norm(self.q_a(x), self.q_a_norm, cfg.rms_norm_eps)
        q = self.q_b(hq).view(x.shape[0], cfg.num_attention_heads, cfg.qk_head_dim)
        q_nope, q_rope = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_latent = self.uk(q_nope)
        q_rope = apply_rope(q_rope, cos, sin, cfg.rope_interleave)
        kv = self.kv_a(x)
        latent, k_rope = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        entry = torch.cat([rms_norm(latent, self.kv_a_norm, cfg.rms_norm_eps).float(),
                           apply_rope(k_rope, cos, sin, cfg.rope_interleave)], dim=-1)
        return torch.cat([q_latent.float(), q_rope], dim=-1).bfloat16(), entry.bfloat16(), hq

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """o bf16 [T, heads, 512] (attention over the latent cache) -> bf16 [T, H]."""
        return self.o_proj(self.uv(o).reshape(o.shape[0], -1))


def hadamard(d: int) -> torch.Tensor:
    """fp32 [d, d] Walsh-Hadamard matrix / sqrt(d) (d a power of two): orthogonal, so it keeps every
    q·k and spreads outliers across channels before the FP8 cast (DeepSeek-V3.2's rotate_activation)."""
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h * d ** -0.5


#: the indexer's query scales: UE8M0 per (token, head), as DeepSeek-V3.2's act_quant (scale_fmt ue8m0)
INDEX_Q_UE8M0 = True


@attrs.frozen
class Indexer:
    """DeepSeek-V3.2's lightning indexer. Keys: LayerNorm(wk · x), half-split RoPE on the first
    qk_rope_head_dim channels, Hadamard-rotated, cached as FP8 with one fp32 scale per token
    (layouts.indexer_cache). Queries: wq_b · q_latent per head, the same RoPE and rotation, FP8 with
    a power-of-two scale per (token, head) folded into the head weights
    weights_proj(x) · n_heads^-0.5 · head_dim^-0.5. Scores (fp8_mqa_logits / fp8_paged_mqa_logits)
    sum_h relu(q_h · k) · weight_h; each query keeps its index_topk best keys (topk)."""

    cfg: DeepseekV3Config
    wq_b: Fp8Linear
    wk: Fp8Linear
    k_norm_weight: torch.Tensor   # fp32 [D]
    k_norm_bias: torch.Tensor     # fp32 [D]
    weights_proj: torch.Tensor    # bf16 [n_heads, hidden]
    rotation: torch.Tensor        # fp32 [D, D] (hadamard)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, (heads,) D] -> fp32: RoPE (half-split) on the leading rope channels, then Hadamard."""
        rope = self.cfg.qk_rope_head_dim
        x = x.float()
        rotated = torch.cat([apply_rope(x[..., :rope], cos, sin, interleave=False), x[..., rope:]], dim=-1)
        return rotated @ self.rotation

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x bf16 [T, hidden] -> fp32 [T, D] keys (to be cached FP8)."""
        k = self.wk(x).float()
        k = torch.nn.functional.layer_norm(k, (k.shape[-1],), self.k_norm_weight, self.k_norm_bias, 1e-6)
        return self._rotate(k.bfloat16(), cos, sin)

    def queries(self, q_latent: torch.Tensor, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (q float8_e4m3fn [T, n_heads, D], weights fp32 [T, n_heads]) for the logits ops."""
        ix = self.cfg.indexer
        t = x.shape[0]
        q = self._rotate(self.wq_b(q_latent).view(t, ix.n_heads, ix.head_dim).bfloat16(), cos, sin)
        qq = pk.per_token_cast_to_fp8(q.reshape(t * ix.n_heads, ix.head_dim), gran_k=ix.head_dim,
                                      use_ue8m0=INDEX_Q_UE8M0)
        w = torch.empty(t, ix.n_heads, dtype=torch.float32, device=x.device)
        pk.bf16_gemm_nt(x.bfloat16(), self.weights_proj, w)
        w = w * (ix.n_heads ** -0.5 * ix.head_dim ** -0.5) * qq.scale.view(t, ix.n_heads)
        return qq.data.view(t, ix.n_heads, ix.head_dim), w.contiguous()
