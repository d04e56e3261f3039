"""The bad-checkpoint catalogue: each defect gets its typed error naming the tensor and the fix."""

from __future__ import annotations

import json

import pytest
import torch

from portable_kernels.errors import ContractError, LayoutError, PortableKernelsError
from portable_kernels.models import load
from portable_kernels.models.deepseek.checkpoint import random_tensors, tiny_config, write_checkpoint
from portable_kernels.models.deepseek.errors import (MissingTensorError, ScaleFormatError, ScaleGridError,
                                                     TensorDtypeError, TensorShapeError, UnexpectedTensorError,
                                                     UnsupportedConfigError)

from .agreement import MEDIAN_BOUND, median_diff

pytest.importorskip("safetensors")

RAW = tiny_config(num_hidden_layers=2)
O_PROJ = "model.layers.1.self_attn.o_proj.weight"


@pytest.fixture(scope="module")
def good():
    return random_tensors(RAW, seed=11)


def _write(tmp_path, tensors, raw=RAW):
    return write_checkpoint(tmp_path / "ckpt", raw, tensors)


def test_good_checkpoint_loads(tmp_path, good):
    model = load(_write(tmp_path, good))
    assert model.config.num_hidden_layers == 2


def test_missing_tensor_is_named(tmp_path, good):
    bad = {k: v for k, v in good.items() if k != O_PROJ}
    with pytest.raises(MissingTensorError, match="o_proj.weight'") as e:
        load(_write(tmp_path, bad))
    assert "Fix:" in str(e.value)


def test_unexpected_tensor_is_named(tmp_path, good):
    bad = dict(good, **{"model.layers.2.input_layernorm.weight": torch.ones(256)})
    with pytest.raises(UnexpectedTensorError, match="model.layers.2.input_layernorm.weight"):
        load(_write(tmp_path, bad))


def test_wrong_shape_is_named(tmp_path, good):
    bad = dict(good, **{O_PROJ: good[O_PROJ][:128].contiguous()})
    with pytest.raises(TensorShapeError, match=O_PROJ.replace(".", r"\.") + r": shape \[128, 256\]"):
        load(_write(tmp_path, bad))


def test_wrong_dtype_is_named(tmp_path, good):
    bad = dict(good, **{O_PROJ: good[O_PROJ].float().bfloat16()})
    with pytest.raises(TensorDtypeError, match="o_proj.weight: dtype torch.bfloat16"):
        load(_write(tmp_path, bad))


def test_scale_grid_that_does_not_match_the_weight(tmp_path, good):
    name = O_PROJ + "_scale_inv"
    bad = dict(good, **{name: good[name][:1].contiguous()})
    with pytest.raises(ScaleGridError, match=r"o_proj.weight_scale_inv: scale grid \[1, 2\]"):
        load(_write(tmp_path, bad))


@pytest.fixture(scope="module")
def fp32_scaled():
    """DeepSeek-V3's published checkpoint has arbitrary fp32 scales, not powers of two."""
    return random_tensors(RAW, seed=11, ue8m0=False)


def test_non_power_of_two_scales_on_a_ue8m0_backend_name_the_option(tmp_path, fp32_scaled):
    path = _write(tmp_path, fp32_scaled)
    with pytest.raises(ScaleFormatError, match="requantize_to_ue8m0=True") as e:
        load(path, backend="ascend:soc=950")
    assert isinstance(e.value, LayoutError) and "weight_scale_inv" in str(e.value)


def test_non_power_of_two_scales_load_where_the_format_keeps_fp32(tmp_path, fp32_scaled):
    path = _write(tmp_path, fp32_scaled)
    ids = torch.arange(0, 512, 16)[None]
    ref = load(path).logits(ids)[0]
    requantized = load(path, backend="ascend:soc=950", requantize_to_ue8m0=True).logits(ids)[0]
    # Re-quantizing changes each weight by at most one FP8 step: the same bound as FP8 activations.
    assert median_diff(requantized, ref) < MEDIAN_BOUND


@pytest.mark.parametrize("change, key", [
    ({"rope_scaling": {"type": "linear", "factor": 4}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"type": "yarn", "factor": 40}}, "original_max_position_embeddings"),
    ({"kv_lora_rank": 256}, "kv_lora_rank"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}, "weight_block_size"),
    ({"model_type": "llama"}, "model_type"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"moe_intermediate_size": 96}, "moe_intermediate_size"),
])
def test_unsupported_config_is_refused_by_key(tmp_path, good, change, key):
    path = _write(tmp_path, good)
    raw = dict(RAW, **change)
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match=key) as e:
        load(path)
    assert isinstance(e.value, ContractError) and "Fix:" in str(e.value)


def test_every_checkpoint_error_is_a_library_error():
    for cls in (MissingTensorError, UnexpectedTensorError, TensorShapeError, TensorDtypeError, ScaleGridError,
                ScaleFormatError, UnsupportedConfigError):
        assert issubclass(cls, PortableKernelsError) and issubclass(cls, ValueError)


def _shards(path):
    return sorted(path.glob("*.safetensors"))


def test_a_shard_cut_short_is_refused_by_name(tmp_path, good):
    from portable_kernels.models.deepseek.errors import CheckpointError
    path = _write(tmp_path, good)
    shard = _shards(path)[-1]
    shard.write_bytes(shard.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match=shard.name) as e:
        load(path)
    assert "Fix: download the shard again" in str(e.value)


def test_a_shard_that_is_not_safetensors_is_refused_by_name(tmp_path, good):
    from portable_kernels.models.deepseek.errors import CheckpointError
    path = _write(tmp_path, good)
    shard = _shards(path)[0]
    shard.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        load(path)


def test_the_reader_gives_the_tensors_safetensors_gives(tmp_path, good):
    from safetensors import safe_open
    from portable_kernels.models.deepseek.checkpoint import expected_tensors, index_checkpoint, read_shards
    from portable_kernels.models.deepseek.config import config_from_dict
    path = _write(tmp_path, good)
    cfg = config_from_dict(RAW)
    ours = dict(read_shards(index_checkpoint(path, cfg), expected_tensors(cfg)))
    for shard in _shards(path):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                want = f.get_tensor(name)
                assert ours[name].dtype == want.dtype and torch.equal(ours[name].view(torch.uint8),
                                                                       want.view(torch.uint8)), name


def _with_mtp_layer(tensors):
    """DeepSeek-V3's checkpoint layout of one multi-token-prediction layer after the decoder layers
    (here layer 2 of a 2-layer model): its own norms, eh_proj, a decoder layer, the shared head."""
    mtp = {name.replace("model.layers.1.", "model.layers.2."): t.clone() for name, t in tensors.items()
           if name.startswith("model.layers.1.")}
    mtp.update({"model.layers.2.enorm.weight": torch.ones(256), "model.layers.2.hnorm.weight": torch.ones(256),
                "model.layers.2.eh_proj.weight": tensors["model.layers.1.self_attn.o_proj.weight"].repeat(1, 2),
                "model.layers.2.shared_head.norm.weight": torch.ones(256),
                "model.layers.2.shared_head.head.weight": tensors["lm_head.weight"].clone()})
    return {**tensors, **mtp}, len(mtp)


def test_the_multi_token_prediction_layer_is_read_past_as_hugging_face_does(tmp_path, good):
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(2))
    plain = load(_write(tmp_path, good)).logits(ids)
    tensors, count = _with_mtp_layer(good)
    raw = dict(RAW, num_nextn_predict_layers=1)
    model = load(write_checkpoint(tmp_path / "mtp", raw, tensors))
    assert model.config.num_nextn_predict_layers == 1 and len(model.layers) == 2
    assert model.load_report.skipped_tensors == count
    assert torch.equal(model.logits(ids), plain)
    with pytest.raises(UnexpectedTensorError, match="num_nextn_predict_layers"):
        load(write_checkpoint(tmp_path / "no-key", RAW, tensors))
