"""The DeepSeek-V3 configuration this model code implements, read from a checkpoint's config.json.

One rule: anything config.json asks for that the code does not implement is refused here, by name,
with an UnsupportedConfigError — never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import math

import attrs

from .errors import UnsupportedConfigError

WEIGHT_BLOCK = (128, 128)
MLA_LATENT = 512      # the MLA kernels' latent width (FlashMLA: 576 = 512 latent + 64 RoPE)
MLA_ROPE = 64


@attrs.frozen
class YarnRope:
    """YaRN's RoPE scaling (DeepSeek-V3's published config: factor 40 over 4096 original positions),
    with Hugging Face's rules for what config.json leaves out (beta_fast 32, beta_slow 1, truncate)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def cos_sin_factor(self) -> float:
        """What cos and sin are multiplied by (1 for DeepSeek-V3: mscale = mscale_all_dim)."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def softmax_factor(self) -> float:
        """What the attention's softmax scale is multiplied by: mscale(factor, mscale_all_dim)^2."""
        return yarn_mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@attrs.frozen
class DeepseekV3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    first_k_dense_replace: int
    rms_norm_eps: float
    rope_theta: float
    rope_interleave: bool
    tie_word_embeddings: bool
    rope_yarn: YarnRope | None = None  # None: the default RoPE
    #: DeepSeek-V3.2's lightning indexer (DeepSeek Sparse Attention); None for V3
    indexer: IndexerConfig | None = None
    #: multi-token-prediction layers stored after the decoder layers (DeepSeek-V3's checkpoint: 1);
    #: read past, not run — greedy decoding does not use them (as Hugging Face's model and
    #: DeepSeek's own inference code)
    num_nextn_predict_layers: int = 0

    @property
    def is_v32(self) -> bool:
        return self.indexer is not None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace


@attrs.frozen
class IndexerConfig:
    """DeepSeek-V3.2's indexer: index_n_heads query heads of index_head_dim channels (the first
    qk_rope_head_dim rotated, half-split as Hugging Face does), one key head; each query attends to
    the index_topk keys of highest indexer score."""

    n_heads: int
    head_dim: int
    topk: int


#: model_type -> the architecture it names
MODEL_TYPES = {"deepseek_v3": "DeepSeek-V3", "deepseek_v32": "DeepSeek-V3.2"}
#: DeepSelect's (and this library's topk's) largest k
MAX_INDEX_TOPK = 4096


def _indexer(raw: dict[str, Any]) -> IndexerConfig | None:
    if raw.get("model_type") != "deepseek_v32":
        return None
    if raw.get("q_lora_rank") is None:
        raise _refuse("q_lora_rank", None, "a q_lora_rank for DeepSeek-V3.2 (its indexer reads the q_a latent)",
                      "use DeepSeek-V3.2's config (q_lora_rank 1536)")
    cfg = IndexerConfig(int(raw.get("index_n_heads", 64)), int(raw.get("index_head_dim", 128)),
                        int(raw.get("index_topk", 2048)))
    d = cfg.head_dim
    if d & (d - 1) or d < int(raw["qk_rope_head_dim"]) or d > 256:
        raise _refuse("index_head_dim", d, f"a power of two in [{raw['qk_rope_head_dim']}, 256] (the Hadamard "
                      "rotation before the FP8 cast needs a power of two)", "use DeepSeek-V3.2's 128")
    if not 1 <= cfg.topk <= MAX_INDEX_TOPK:
        raise _refuse("index_topk", cfg.topk, f"1..{MAX_INDEX_TOPK} (the top-k op's range)", "use 2048 as V3.2")
    if cfg.n_heads < 1:
        raise _refuse("index_n_heads", cfg.n_heads, "a positive count", "use 64 as V3.2")
    return cfg


def _refuse(key: str, given: Any, expected: str, fix: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"config.json: '{key}' is {given!r}; this DeepSeek-V3 path supports "
                                  f"{expected}. Fix: {fix}")


def _rope(raw: dict[str, Any]) -> tuple[float, YarnRope | None]:
    """(rope_theta, YaRN scaling or None) from rope_parameters (transformers 5) or rope_scaling."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    given = params or scaling
    key = "rope_parameters" if params else "rope_scaling"
    kind = given.get("rope_type", given.get("type", "default"))
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise _refuse(f"{key}.rope_type", kind, "the default RoPE or 'yarn' (DeepSeek-V3's)",
                      "use a DeepSeek-V3 config with yarn or no rope scaling")
    if given.get("factor") is None and raw.get("max_position_embeddings") is None:
        raise _refuse(f"{key}.factor", None, "a yarn factor (or max_position_embeddings to derive it)",
                      "set rope_scaling.factor as DeepSeek's config does (40)")
    if given.get("original_max_position_embeddings") is None:
        raise _refuse(f"{key}.original_max_position_embeddings", None, "the pretraining context length",
                      "set it as DeepSeek's config does (4096)")
    original = int(given["original_max_position_embeddings"])
    factor = given.get("factor")
    factor = float(factor) if factor is not None else float(raw["max_position_embeddings"]) / original
    def opt(name):
        value = given.get(name)
        return None if value is None else float(value)
    yarn = YarnRope(factor=factor, original_max_position_embeddings=original,
                    beta_fast=float(given.get("beta_fast") or 32), beta_slow=float(given.get("beta_slow") or 1),
                    mscale=opt("mscale"), mscale_all_dim=opt("mscale_all_dim"),
                    attention_factor=opt("attention_factor"), truncate=bool(given.get("truncate", True)))
    return theta, yarn


def config_from_dict(raw: dict[str, Any]) -> DeepseekV3Config:
    """Validate config.json's dict and keep the fields the model reads."""
    if raw.get("model_type") not in MODEL_TYPES:
        raise _refuse("model_type", raw.get("model_type"), "'deepseek_v3' or 'deepseek_v32'",
                      "point at a DeepSeek-V3 or V3.2 checkpoint")
    quant = raw.get("quantization_config")
    if not quant or quant.get("quant_method") != "fp8":
        raise _refuse("quantization_config.quant_method", (quant or {}).get("quant_method"), "'fp8'",
                      "use DeepSeek's FP8 checkpoint format (e4m3 weights + weight_scale_inv)")
    if list(quant.get("weight_block_size", [])) != list(WEIGHT_BLOCK):
        raise _refuse("quantization_config.weight_block_size", quant.get("weight_block_size"), "[128, 128]",
                      "re-quantize the weights with 128x128 blocks")
    if quant.get("fmt", "e4m3") != "e4m3":
        raise _refuse("quantization_config.fmt", quant.get("fmt"), "'e4m3'", "store weights as float8_e4m3fn")
    checks = [
        ("kv_lora_rank", MLA_LATENT, "512 (the MLA kernels' latent width)"),
        ("qk_rope_head_dim", MLA_ROPE, "64 (the MLA kernels' RoPE width)"),
        ("hidden_act", "silu", "'silu'"),
        ("scoring_func", "sigmoid", "'sigmoid' (DeepSeek-V3's router)"),
        ("topk_method", "noaux_tc", "'noaux_tc' (group-limited top-k with the correction bias)"),
        ("attention_bias", False, "false"),
    ]
    for key, want, expected in checks:
        if raw.get(key, want) != want:
            raise _refuse(key, raw.get(key), expected, "use a DeepSeek-V3 config with that value")
    rope_theta, rope_yarn = _rope(raw)
    cfg = DeepseekV3Config(
        vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]), moe_intermediate_size=int(raw["moe_intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]), num_attention_heads=int(raw["num_attention_heads"]),
        q_lora_rank=None if raw.get("q_lora_rank") is None else int(raw["q_lora_rank"]),
        kv_lora_rank=int(raw["kv_lora_rank"]), qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]), v_head_dim=int(raw["v_head_dim"]),
        n_routed_experts=int(raw["n_routed_experts"]), n_shared_experts=int(raw.get("n_shared_experts") or 0),
        num_experts_per_tok=int(raw["num_experts_per_tok"]), n_group=int(raw.get("n_group") or 1),
        topk_group=int(raw.get("topk_group") or 1),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        first_k_dense_replace=int(raw.get("first_k_dense_replace", 0)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=rope_theta,
        rope_interleave=bool(raw.get("rope_interleave", True)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), rope_yarn=rope_yarn,
        indexer=_indexer(raw), num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers") or 0),
    )
    if raw.get("num_key_value_heads", cfg.num_attention_heads) != cfg.num_attention_heads:
        raise _refuse("num_key_value_heads", raw.get("num_key_value_heads"), "num_attention_heads (MLA)",
                      "set num_key_value_heads = num_attention_heads")
    if cfg.n_routed_experts % cfg.n_group:
        raise _refuse("n_group", cfg.n_group, f"a divisor of n_routed_experts={cfg.n_routed_experts}",
                      "fix n_group")
    for key in ("intermediate_size", "moe_intermediate_size"):
        if getattr(cfg, key) % WEIGHT_BLOCK[0]:
            raise _refuse(key, getattr(cfg, key), "a multiple of 128 (gate and up share 128-row scale blocks)",
                          "pad the MLP width to a multiple of 128")
    if cfg.tie_word_embeddings:
        raise _refuse("tie_word_embeddings", True, "false (DeepSeek-V3 has its own lm_head)", "untie lm_head")
    return cfg


def load_config(path: str | Path) -> DeepseekV3Config:
    file = Path(path) / "config.json"
    if not file.is_file():
        raise UnsupportedConfigError(f"{file}: no config.json. Fix: point at a Hugging Face-style checkpoint "
                                     "directory (config.json + *.safetensors + model.safetensors.index.json)")
    return config_from_dict(json.loads(file.read_text()))
