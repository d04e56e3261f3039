"""The on-disk format: DeepSeek-V3's Hugging Face checkpoint layout, read shard by shard and written.

A checkpoint directory holds config.json (with quantization_config {"quant_method": "fp8",
"weight_block_size": [128, 128]}), safetensors shards and model.safetensors.index.json. Every
linear weight except the router, embedding and lm_head is float8_e4m3fn [N, K] with a float32
`weight_scale_inv` [ceil(N/128), ceil(K/128)]: the multiplier that dequantizes each 128x128 block.
The one rule: `expected_tensors(config)` is the single list of names, shapes and kinds that both
the writer and the loader's checks follow.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Iterator

import attrs
import torch

import portable_kernels as pk

from .config import WEIGHT_BLOCK, DeepseekV3Config, config_from_dict
from .errors import (CheckpointError, MissingTensorError, ScaleGridError, TensorDtypeError, TensorShapeError,
                     UnexpectedTensorError)

INDEX_FILE = "model.safetensors.index.json"
SCALE_SUFFIX = "_scale_inv"


@attrs.frozen
class TensorSpec:
    """One tensor of the checkpoint: its shape and kind ('fp8' = e4m3 + weight_scale_inv,
    'bf16' = a bf16 (or fp32) matrix, 'norm' = a bf16/fp32 vector, 'bias' = fp32)."""

    shape: tuple[int, ...]
    kind: str

    @property
    def scale_shape(self) -> tuple[int, int]:
        n, k = self.shape
        return (math.ceil(n / WEIGHT_BLOCK[0]), math.ceil(k / WEIGHT_BLOCK[1]))


def scale_name(weight: str) -> str:
    return weight + SCALE_SUFFIX


def _mlp(prefix: str, hidden: int, inter: int) -> dict[str, TensorSpec]:
    return {f"{prefix}.gate_proj.weight": TensorSpec((inter, hidden), "fp8"),
            f"{prefix}.up_proj.weight": TensorSpec((inter, hidden), "fp8"),
            f"{prefix}.down_proj.weight": TensorSpec((hidden, inter), "fp8")}


def _indexer(prefix: str, cfg: DeepseekV3Config) -> dict[str, TensorSpec]:
    """DeepSeek-V3.2's indexer: wq_b and wk FP8 (as the published checkpoint), k_norm a LayerNorm
    (weight and fp32 bias), weights_proj a bf16 matrix (DeepSeek keeps it in the default dtype)."""
    ix = cfg.indexer
    return {f"{prefix}.wq_b.weight": TensorSpec((ix.n_heads * ix.head_dim, cfg.q_lora_rank), "fp8"),
            f"{prefix}.wk.weight": TensorSpec((ix.head_dim, cfg.hidden_size), "fp8"),
            f"{prefix}.k_norm.weight": TensorSpec((ix.head_dim,), "norm"),
            f"{prefix}.k_norm.bias": TensorSpec((ix.head_dim,), "bias"),
            f"{prefix}.weights_proj.weight": TensorSpec((ix.n_heads, cfg.hidden_size), "bf16")}


def expected_tensors(cfg: DeepseekV3Config) -> dict[str, TensorSpec]:
    """Every weight name of a DeepSeek-V3 checkpoint with this config (scales not listed: each
    'fp8' weight has one more tensor, `scale_name(name)`)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    specs = {"model.embed_tokens.weight": TensorSpec((cfg.vocab_size, h), "bf16"),
             "model.norm.weight": TensorSpec((h,), "norm"),
             "lm_head.weight": TensorSpec((cfg.vocab_size, h), "bf16")}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        specs[f"{p}.input_layernorm.weight"] = TensorSpec((h,), "norm")
        specs[f"{p}.post_attention_layernorm.weight"] = TensorSpec((h,), "norm")
        a = f"{p}.self_attn"
        if cfg.q_lora_rank is None:
            specs[f"{a}.q_proj.weight"] = TensorSpec((heads * cfg.qk_head_dim, h), "fp8")
        else:
            specs[f"{a}.q_a_proj.weight"] = TensorSpec((cfg.q_lora_rank, h), "fp8")
            specs[f"{a}.q_a_layernorm.weight"] = TensorSpec((cfg.q_lora_rank,), "norm")
            specs[f"{a}.q_b_proj.weight"] = TensorSpec((heads * cfg.qk_head_dim, cfg.q_lora_rank), "fp8")
        specs[f"{a}.kv_a_proj_with_mqa.weight"] = TensorSpec((cfg.kv_lora_rank + cfg.qk_rope_head_dim, h), "fp8")
        specs[f"{a}.kv_a_layernorm.weight"] = TensorSpec((cfg.kv_lora_rank,), "norm")
        specs[f"{a}.kv_b_proj.weight"] = TensorSpec(
            (heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank), "fp8")
        specs[f"{a}.o_proj.weight"] = TensorSpec((h, heads * cfg.v_head_dim), "fp8")
        if cfg.indexer is not None:
            specs.update(_indexer(f"{a}.indexer", cfg))
        m = f"{p}.mlp"
        if not cfg.is_moe_layer(i):
            specs.update(_mlp(m, h, cfg.intermediate_size))
            continue
        specs[f"{m}.gate.weight"] = TensorSpec((cfg.n_routed_experts, h), "bf16")
        specs[f"{m}.gate.e_score_correction_bias"] = TensorSpec((cfg.n_routed_experts,), "bias")
        for e in range(cfg.n_routed_experts):
            specs.update(_mlp(f"{m}.experts.{e}", h, cfg.moe_intermediate_size))
        if cfg.n_shared_experts:
            specs.update(_mlp(f"{m}.shared_experts", h, cfg.moe_intermediate_size * cfg.n_shared_experts))
    return specs


def _all_names(specs: dict[str, TensorSpec]) -> set[str]:
    names = set(specs)
    names.update(scale_name(n) for n, s in specs.items() if s.kind == "fp8")
    return names


_DTYPES = {"fp8": (torch.float8_e4m3fn,), "bf16": (torch.bfloat16, torch.float32),
           "norm": (torch.bfloat16, torch.float32), "bias": (torch.float32,), "scale": (torch.float32,)}


def check_tensor(name: str, tensor: torch.Tensor, specs: dict[str, TensorSpec]) -> None:
    """Shape and dtype of one tensor against the config; scale grids against their weight."""
    if name.endswith(SCALE_SUFFIX):
        spec = specs[name[: -len(SCALE_SUFFIX)]]
        if tensor.dtype not in _DTYPES["scale"]:
            raise TensorDtypeError(f"{name}: dtype {tensor.dtype}; expected torch.float32 block scales. "
                                   "Fix: store weight_scale_inv as float32")
        if tuple(tensor.shape) != spec.scale_shape:
            raise ScaleGridError(
                f"{name}: scale grid {list(tensor.shape)} does not match weight {list(spec.shape)}; expected "
                f"{list(spec.scale_shape)} = [ceil(N/128), ceil(K/128)]. Fix: re-export the scales with "
                "128x128 blocks (one fp32 multiplier per block)")
        return
    spec = specs[name]
    if tensor.dtype not in _DTYPES[spec.kind]:
        want = " or ".join(str(d) for d in _DTYPES[spec.kind])
        raise TensorDtypeError(f"{name}: dtype {tensor.dtype}; expected {want}. Fix: "
                               + ("quantize the weight to FP8 e4m3 with 128x128 block scales"
                                  if spec.kind == "fp8" else f"store it as {want}"))
    if tuple(tensor.shape) != spec.shape:
        raise TensorShapeError(f"{name}: shape {list(tensor.shape)}; config.json implies {list(spec.shape)}. "
                               "Fix: use the config.json that was saved with these weights")


@attrs.frozen
class CheckpointFiles:
    """Where each tensor lives: shard file -> its tensor names, in file order; `skipped`: the
    multi-token-prediction layers' tensor names, which are not read."""

    directory: Path
    shards: dict[str, list[str]]
    skipped: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum((self.directory / f).stat().st_size for f in self.shards)


def index_checkpoint(path: str | Path, cfg: DeepseekV3Config) -> CheckpointFiles:
    """Read the index (or the single shard's header) and refuse missing or unexpected names
    before a byte of weights is read."""
    directory = Path(path)
    index = directory / INDEX_FILE
    shards: dict[str, list[str]] = {}
    if index.is_file():
        for name, file in json.loads(index.read_text())["weight_map"].items():
            shards.setdefault(file, []).append(name)
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
        if not files:
            raise MissingTensorError(f"{directory}: no *.safetensors shard and no {INDEX_FILE}. Fix: point at the "
                                     "checkpoint directory")
        for file in files:
            shards[file] = list(_shard_header(directory / file)[0])
    missing_files = [f for f in shards if not (directory / f).is_file()]
    if missing_files:
        raise MissingTensorError(f"{INDEX_FILE} names shard(s) {missing_files} that are not in {directory}. "
                                 "Fix: download every shard")
    expected = _all_names(expected_tensors(cfg))
    skipped = tuple(sorted(n for names in shards.values() for n in names if is_mtp_tensor(n, cfg)))
    shards = {f: [n for n in names if not is_mtp_tensor(n, cfg)] for f, names in shards.items()}
    present = {n for names in shards.values() for n in names}
    extra = sorted(present - expected)
    if extra:
        raise UnexpectedTensorError(
            f"checkpoint holds {len(extra)} tensor(s) this config has no place for, e.g. '{extra[0]}'. Fix: check "
            "that config.json belongs to these shards (num_hidden_layers, n_routed_experts, q_lora_rank, "
            "first_k_dense_replace; DeepSeek's multi-token-prediction layers after the last decoder layer need "
            "num_nextn_predict_layers)")
    missing = sorted(expected - present)
    if missing:
        raise MissingTensorError(
            f"checkpoint lacks {len(missing)} tensor(s), e.g. '{missing[0]}'. Fix: download every shard, or "
            "use the config.json saved with these weights")
    return CheckpointFiles(directory, shards, skipped)


def is_mtp_tensor(name: str, cfg: DeepseekV3Config) -> bool:
    """A tensor of a multi-token-prediction layer: model.layers.{i} with num_hidden_layers <= i <
    num_hidden_layers + num_nextn_predict_layers (DeepSeek-V3 stores its one MTP layer as layer 61)."""
    if not name.startswith("model.layers.") or not cfg.num_nextn_predict_layers:
        return False
    index = name.split(".")[2]
    return index.isdigit() and cfg.num_hidden_layers <= int(index) < cfg.num_hidden_layers + \
        cfg.num_nextn_predict_layers


#: safetensors dtype names -> torch dtypes (https://huggingface.co/docs/safetensors: the header format)
SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "BF16": torch.bfloat16, "F16": torch.float16,
    "F32": torch.float32, "F64": torch.float64, "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool,
}


def _shard_header(path: Path) -> tuple[dict, int, int]:
    """(the header's tensor entries, the first data byte, the file size) of one safetensors file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        length = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if length < 2 or 8 + length > size:
            raise CheckpointError(f"{path}: not a safetensors file (header length {length}, file {size} bytes). "
                                  "Fix: download the shard again")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise CheckpointError(f"{path}: unreadable safetensors header ({exc}). Fix: download the shard again") \
                from exc
    header.pop("__metadata__", None)
    return header, 8 + length, size


def read_shards(files: CheckpointFiles, specs: dict[str, TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) shard by shard, each checked against the config as it is read.

    Each tensor's bytes are read into memory of its own (plain reads, no memory map): a mapped shard
    would count its touched pages in the process's resident set until it is closed, up to a shard
    beyond the prepared weights at the peak."""
    for file, names in files.shards.items():
        path = files.directory / file
        header, base, size = _shard_header(path)
        with open(path, "rb") as f:
            for name in names:
                meta = header.get(name)
                if meta is None:
                    raise MissingTensorError(f"{path}: the index places '{name}' in this shard, but its header does "
                                             "not list it. Fix: download the shard again")
                dtype = SAFETENSORS_DTYPES.get(meta.get("dtype"))
                if dtype is None:
                    raise TensorDtypeError(f"{name}: safetensors dtype {meta.get('dtype')!r}, which torch cannot "
                                           "hold. Fix: store it as float8_e4m3fn, bfloat16 or float32")
                start, end = meta["data_offsets"]
                shape = [int(d) for d in meta["shape"]]
                nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
                if not 0 <= start <= end <= size - base or end - start != nbytes:
                    raise CheckpointError(f"{path}: '{name}' spans bytes [{start}, {end}) of a {size - base}-byte "
                                          f"data section, expected {nbytes} bytes. Fix: download the shard again")
                buffer = bytearray(nbytes)
                f.seek(base + start)
                if f.readinto(buffer) != nbytes:
                    raise CheckpointError(f"{path}: '{name}' is cut short. Fix: download the shard again")
                tensor = torch.frombuffer(buffer, dtype=dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)
                check_tensor(name, tensor, specs)
                yield name, tensor


# ---------------------------------------------------------------------------------------------
# Writer: a seeded random-weight checkpoint in exactly this format.

#: the tiny V3.2 indexer: 128-wide heads as published (64 rotated), a top-k far below the test
#: sequences so the selection decides what attention sees
TINY_INDEXER = {"index_n_heads": 8, "index_head_dim": 128, "index_topk": 24}


def tiny_config(q_lora_rank: int | None = 256, num_hidden_layers: int = 3, vocab_size: int = 512,
                model: str = "v3") -> dict:
    """A DeepSeek-V3 (model="v3") or V3.2 ("v3.2") architecture config scaled down (MLA widths
    kept: the kernels need 512 + 64)."""
    raw = _tiny_v3(q_lora_rank, num_hidden_layers, vocab_size)
    if model == "v3.2":
        raw.update(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", **TINY_INDEXER)
    elif model != "v3":
        raise ValueError(f"model is {model!r}; expected 'v3' or 'v3.2'")
    return raw


def _tiny_v3(q_lora_rank: int | None, num_hidden_layers: int, vocab_size: int) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": vocab_size, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
        "num_hidden_layers": num_hidden_layers, "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": q_lora_rank, "kv_lora_rank": 512, "qk_nope_head_dim": 64, "qk_rope_head_dim": 64,
        "v_head_dim": 64, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "first_k_dense_replace": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_interleave": True,
        "hidden_act": "silu", "scoring_func": "sigmoid", "topk_method": "noaux_tc", "attention_bias": False,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128]},
    }


# A random router is far less decisive than a trained one: near-ties flip under FP8 activation
# error and dominate the logit difference. A wider logit spread keeps such flips rare.
ROUTER_GAIN = 4.0
ROUTER_BIAS_STD = 0.1
# Logits of std ~3 over the vocabulary, so greedy top-1 margins are not all near-ties.
LM_HEAD_GAIN = 3.0


def _random_tensor(spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    if spec.kind == "norm":
        return (1.0 + 0.1 * torch.randn(spec.shape, generator=g)).bfloat16()
    if spec.kind == "bias":
        return ROUTER_BIAS_STD * torch.randn(spec.shape, generator=g)
    # Every matrix scaled by fan_in^-0.5 keeps activations O(1) through each layer.
    return torch.randn(spec.shape, generator=g) * spec.shape[-1] ** -0.5


def write_checkpoint(directory: str | Path, raw_config: dict, tensors: dict[str, torch.Tensor],
                     num_shards: int = 2) -> Path:
    """Write tensors (already in checkpoint dtypes) as `num_shards` safetensors files + index."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per = math.ceil(len(names) / num_shards)
    weight_map = {}
    for s in range(num_shards):
        file = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        chunk = {n: tensors[n].contiguous() for n in names[s * per:(s + 1) * per]}
        save_file(chunk, str(directory / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in chunk})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                   indent=1))
    (directory / "config.json").write_text(json.dumps(raw_config, indent=1))
    return directory


def random_tensors(raw_config: dict, seed: int = 0, ue8m0: bool = True) -> dict[str, torch.Tensor]:
    """Seeded random weights for a config, FP8-quantized in 128x128 blocks where the format says so
    (`ue8m0=True`: power-of-two scales, which every backend's Format can hold)."""
    cfg = config_from_dict(raw_config)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, spec in expected_tensors(cfg).items():
        w = torch.randn(spec.shape, generator=g) if name == "model.embed_tokens.weight" else _random_tensor(spec, g)
        if name.endswith(".mlp.gate.weight"):
            w = w * ROUTER_GAIN
        if name == "lm_head.weight":
            w = w * LM_HEAD_GAIN
        if spec.kind == "fp8":
            data, sf = pk.per_block_cast_to_fp8(w.bfloat16(), use_ue8m0=ue8m0)
            out[name], out[scale_name(name)] = data, sf.float().contiguous()
        elif spec.kind == "bf16":
            out[name] = w.bfloat16()
        else:
            out[name] = w
    return out


def write_random_checkpoint(directory: str | Path, raw_config: dict | None = None, seed: int = 0,
                            ue8m0: bool = True, num_shards: int = 2) -> Path:
    raw = raw_config or tiny_config()
    return write_checkpoint(directory, raw, random_tensors(raw, seed, ue8m0), num_shards)


def cache_root() -> Path:
    return Path(os.environ.get("PK_MODEL_CACHE", Path.home() / ".cache" / "portable_kernels" / "models"))


def cached_random_checkpoint(raw_config: dict | None = None, seed: int = 0, ue8m0: bool = True) -> Path:
    """The seeded random checkpoint in a cache folder named by its config and seed (written once)."""
    raw = raw_config or tiny_config()
    key = hashlib.sha256(json.dumps([raw, seed, ue8m0], sort_keys=True).encode()).hexdigest()[:12]
    directory = cache_root() / f"deepseek-v3-random-{key}"
    done = directory / ".complete"
    if not done.is_file():
        tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
        write_random_checkpoint(tmp, raw, seed, ue8m0)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(directory)
        except OSError:
            if not done.is_file():
                raise CheckpointError(f"could not move {tmp} to {directory}. Fix: remove {directory} and rerun")
    return directory
