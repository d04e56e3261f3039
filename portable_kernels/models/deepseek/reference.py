"""Hugging Face transformers' eager DeepseekV3ForCausalLM (DeepseekV32ForCausalLM for a V3.2
checkpoint) on a checkpoint's DEQUANTIZED weights:
the independent reference of the tests and of `generate`'s agreement line (needs transformers).

One rule: nothing of our model code is used here; only the checkpoint reader and the library's
`dequantize` (weight = e4m3 value x its block's weight_scale_inv).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

import portable_kernels as pk

from .checkpoint import SCALE_SUFFIX, expected_tensors, index_checkpoint, read_shards
from .config import config_from_dict


def dequantized_state(path: str | Path) -> dict[str, torch.Tensor]:
    """fp32 tensors of the checkpoint under their DeepSeek names (scales folded in)."""
    raw = json.loads((Path(path) / "config.json").read_text())
    cfg = config_from_dict(raw)
    specs = expected_tensors(cfg)
    tensors = dict(read_shards(index_checkpoint(path, cfg), specs))
    out = {}
    for name, spec in specs.items():
        t = tensors[name]
        if spec.kind == "fp8":
            t = pk.dequantize(pk.QuantTensor(t, tensors[name + SCALE_SUFFIX], granularity=(128, 128)))
        out[name] = t.float()
    return out


def hf_state_dict(path: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint's dequantized weights under DeepseekV3ForCausalLM's parameter names (its
    routed experts stacked into gate_up_proj / down_proj), in `dtype`."""
    raw = json.loads((Path(path) / "config.json").read_text())
    state = dequantized_state(path)
    cfg = config_from_dict(raw)
    mapped: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if ".mlp.experts." in name:
            continue
        mapped[name] = t.to(dtype)
    for i in range(cfg.num_hidden_layers):
        if not cfg.is_moe_layer(i):
            continue
        m = f"model.layers.{i}.mlp.experts"
        experts = range(cfg.n_routed_experts)
        mapped[f"{m}.gate_up_proj"] = torch.stack(
            [torch.cat([state[f"{m}.{e}.gate_proj.weight"], state[f"{m}.{e}.up_proj.weight"]]) for e in experts]).to(dtype)
        mapped[f"{m}.down_proj"] = torch.stack([state[f"{m}.{e}.down_proj.weight"] for e in experts]).to(dtype)
    return mapped


def hf_model(path: str | Path, dtype: torch.dtype = torch.float32, empty_init: bool = False):
    """DeepseekV3ForCausalLM (eager attention) holding the checkpoint's dequantized weights.
    empty_init: build it on the meta device and take the loaded tensors as its parameters (what
    from_pretrained does), instead of initialising random weights first."""
    import transformers

    raw = json.loads((Path(path) / "config.json").read_text())
    kwargs = {k: v for k, v in raw.items() if k not in ("quantization_config", "architectures", "torch_dtype")}
    family = "DeepseekV32" if raw.get("model_type") == "deepseek_v32" else "DeepseekV3"
    DeepseekV3ForCausalLM = getattr(transformers, f"{family}ForCausalLM")
    config = getattr(transformers, f"{family}Config")(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    if empty_init:
        with torch.device("meta"):
            model = DeepseekV3ForCausalLM(config).to(dtype).eval()
    else:
        model = DeepseekV3ForCausalLM(config).to(dtype).eval()
    mapped = hf_state_dict(path, dtype)
    own = model.state_dict()
    missing = sorted(set(own) - set(mapped))
    extra = sorted(set(mapped) - set(own))
    if missing or extra:
        raise RuntimeError(f"HF reference: names do not map (missing {missing[:3]}, extra {extra[:3]}); "
                           "transformers' DeepseekV3 parameter names changed")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in mapped.items()}, strict=True, assign=empty_init)
    if empty_init:  # the rotary embedding's buffers were built on meta: build it again for real
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child).__name__.endswith("RotaryEmbedding"):
                    setattr(parent, child_name, type(child)(config))
    return model


@torch.inference_mode()
def hf_logits(model, input_ids: torch.Tensor) -> torch.Tensor:
    """fp32 [batch, seq, vocab] of one unpadded batch."""
    return model(input_ids=input_ids).logits.float()
