"""Shared fixtures of the model tests: seeded random FP8 checkpoints (written once per session)
and Hugging Face's eager DeepseekV3ForCausalLM on their dequantized weights."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from portable_kernels.models.deepseek.checkpoint import tiny_config, write_random_checkpoint  # noqa: E402
from portable_kernels.models.deepseek.reference import hf_model  # noqa: E402

# DeepSeek-V3's published rope_scaling (config.json of deepseek-ai/DeepSeek-V3)
PUBLISHED_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
CONFIGS = {"q_lora": tiny_config(q_lora_rank=256), "no_q_lora": tiny_config(q_lora_rank=None),
           "yarn": dict(tiny_config(q_lora_rank=256), rope_scaling=PUBLISHED_YARN),
           "v32": tiny_config(model="v3.2")}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek")
    return {name: write_random_checkpoint(root / name, raw, seed=7) for name, raw in CONFIGS.items()}


@pytest.fixture(scope="session")
def references(checkpoints):
    return {name: hf_model(path) for name, path in checkpoints.items()}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
