"""RoPE tables and the softmax scale of the DeepSeek-V3 path against Hugging Face's own
computation (DeepseekV3RotaryEmbedding, DeepseekV3Attention.scaling), default and YaRN."""

from __future__ import annotations

import math

import pytest
import torch

from portable_kernels.models.deepseek.checkpoint import tiny_config
from portable_kernels.models.deepseek.config import config_from_dict
from portable_kernels.models.deepseek.layers import rope_tables, softmax_scale

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf  # noqa: E402

YARNS = [
    None,
    {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
     "mscale": 1.0, "mscale_all_dim": 1.0},                                    # DeepSeek-V3 as published
    {"rope_type": "yarn", "factor": 8, "original_max_position_embeddings": 512, "mscale": 0.707,
     "mscale_all_dim": 1.0},                                                  # cos/sin scaled by 0.93
    {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 1024},  # no mscale: 0.1 ln 4 + 1
]


def _hf_config(raw):
    kwargs = {k: v for k, v in raw.items() if k not in ("quantization_config", "architectures", "torch_dtype")}
    return transformers.DeepseekV3Config(**kwargs)


@pytest.mark.parametrize("yarn", YARNS, ids=["default", "published", "mscale", "no-mscale"])
def test_cos_sin_and_softmax_scale_match_hugging_face(yarn):
    raw = dict(tiny_config(), **({"rope_scaling": yarn} if yarn else {}))
    cfg = config_from_dict(raw)
    positions = torch.tensor([0, 1, 7, 63, 64, 1000, 4095, 20000])
    cos, sin = rope_tables(cfg, positions)
    hf_config = _hf_config(raw)
    hf_cos, hf_sin = hf.DeepseekV3RotaryEmbedding(hf_config)(torch.zeros(1, 1, dtype=torch.float32), positions[None])
    half = cfg.qk_rope_head_dim // 2
    torch.testing.assert_close(cos, hf_cos[0, :, :half], rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(sin, hf_sin[0, :, :half], rtol=2e-5, atol=2e-5)
    hf_config._attn_implementation = "eager"
    scaling = hf.DeepseekV3Attention(hf_config, layer_idx=0).scaling
    assert math.isclose(softmax_scale(cfg), scaling, rel_tol=1e-12), (softmax_scale(cfg), scaling)
    if yarn is not None:
        assert not torch.allclose(cos, rope_tables(config_from_dict(tiny_config()), positions)[0])
