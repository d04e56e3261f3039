"""The model family: the DeepSeek-V3 path (portable_kernels.models) against Hugging Face's eager
DeepseekV3ForCausalLM in bf16 on the same checkpoint — the code a user would otherwise run.

- decode: one greedy step of a batch (1 or 8 rows) after a prompt; ours is `decode_step(state,
  advance=False)`, HF's one forward with its KV cache, cropped back after the step, so both
  repeat the same step. Target from issue 21: 2x HF.
- prefill: the prompt's logits into a fresh cache (no target set).
- load: the FP8 checkpoint into the backend's Formats (`models.load`) against the HF path a CPU
  user has: read the shards, dequantize every block to bf16 and hand the tensors to HF's model
  built on the meta device (from_pretrained's own empty init). Ratio and GB/s of checkpoint; the
  peak resident-set growth of each side (memory).

Every note states the resident weight bytes of both sides (issue 21: ours <= 0.6x HF's bf16). The
checkpoints are seeded random weights in the real on-disk format, written once into the model cache
(PK_MODEL_CACHE); needs transformers (the test extra), else the cases are skipped.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ....core.errors import BackendUnavailableError
from ....core.registry import forced_backend
from ..case import TINY, Case, Inputs, generator

FAMILY = "model"
TITLE = "DeepSeek-V3 model path vs Hugging Face eager (bf16)"
SOURCE = "issue 21"
ON = ("cpu",)
DEVICES = ("cpu",)  # the model path and HF's eager model run on CPU tensors here
PROMPT = 64

#: a small DeepSeek-V3-architecture config (MLA widths kept; 4 layers, 32 experts in 8 groups)
SMALL = {
    "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 512, "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": 512, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "n_routed_experts": 32, "num_experts_per_tok": 4, "n_group": 8, "topk_group": 4,
    "vocab_size": 8192,
}


#: the V3.2 variant of SMALL: its indexer (16 heads of 128, top-32 of the 64-token prompt + steps)
SMALL_V32_INDEXER = {"index_n_heads": 16, "index_head_dim": 128, "index_topk": 32}


def _config(size: str) -> dict[str, Any]:
    from ....models.deepseek.checkpoint import tiny_config
    if size == "v3.2-small":
        return dict(tiny_config(model="v3.2"), **SMALL, **SMALL_V32_INDEXER)
    raw = tiny_config()
    return raw if size == "tiny" else dict(raw, **SMALL)


_built: dict[str, Any] = {}


def _checkpoint_and_hf(size: str):
    """(checkpoint path, HF bf16 model, its weight bytes), built once per process and size."""
    if size not in _built:
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailableError("the model family compares with Hugging Face transformers, which is not "
                                          "installed. Fix: pip install 'portable_kernels[test]'") from exc
        from ....models.deepseek.checkpoint import cached_random_checkpoint
        from ....models.deepseek.reference import hf_model
        path = cached_random_checkpoint(_config(size), seed=0)
        hf = hf_model(path, torch.bfloat16, empty_init=True)
        nbytes = sum(p.numel() * p.element_size() for p in hf.parameters())
        _built[size] = (path, hf, nbytes)
    return _built[size]


def _ours(path, kv_cache: str = "bf16"):
    from ....models import load
    name, options = forced_backend() or ("cpu", {})
    return load(path, backend=name, options=dict(options), kv_cache=kv_cache)


#: V3.2 runs its sparse attention over the FP8 cache (FlashMLA's sparse decode, as DeepSeek serves it)
KV_CACHE = {"v3.2-small": "fp8"}


def _weights_note(model, hf_bytes: int) -> str:
    ours = sum(model.load_report.weight_bytes.values())
    return (f"weights resident: ours {ours / 2**20:.1f} MiB (prepared Formats), HF bf16 {hf_bytes / 2**20:.1f} MiB: "
            f"{ours / hf_bytes:.2f}x (issue 21 asks <= 0.6x)")


def _prompt(batch: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, PROMPT), generator=generator(61))


def _build_decode(size: str, batch: int):
    def build(device: torch.device) -> Inputs:
        path, hf, hf_bytes = _checkpoint_and_hf(size)
        model = _ours(path, KV_CACHE.get(size, "bf16"))
        ids = _prompt(batch, model.config.vocab_size)
        state = model.prefill(ids, 8)
        with torch.inference_mode():
            out = hf(input_ids=ids, use_cache=True)
        token = out.logits[:, -1].argmax(-1)
        return Inputs(model=model, state=state, hf=hf, hf_cache=out.past_key_values, hf_token=token[:, None],
                      cache_kwarg=_cache_kwarg(hf),
                      position=torch.tensor([PROMPT]), provider="models.deepseek (every op a portable_kernels op)",
                      note=_weights_note(model, hf_bytes))
    return build


def _decode_op(i: Inputs) -> object:
    return i.model.decode_step(i.state, advance=False)


def _decode_contiguous_peer(i: Inputs) -> object:
    """The same decode step with the MoE in the contiguous layout (the masked one switched off)."""
    from ....models.deepseek import layers
    bound, layers.MASKED_MAX_TOKENS = layers.MASKED_MAX_TOKENS, 0
    try:
        return i.model.decode_step(i.state, advance=False)
    finally:
        layers.MASKED_MAX_TOKENS = bound


def _cache_kwarg(hf) -> str:
    """The name HF's forward takes the KV cache under (`cache` from transformers 5.24, before it
    `past_key_values`)."""
    return "cache" if "cache" in inspect.signature(type(hf).forward).parameters else "past_key_values"


@torch.inference_mode()
def _decode_peer(i: Inputs) -> object:
    out = i.hf(input_ids=i.hf_token, use_cache=True, cache_position=i.position, **{i.cache_kwarg: i.hf_cache})
    i.hf_cache.crop(-1)  # drop the step just added: the next call repeats it
    return out.logits[:, -1].argmax(-1)


def _build_prefill(size: str, batch: int):
    def build(device: torch.device) -> Inputs:
        path, hf, hf_bytes = _checkpoint_and_hf(size)
        model = _ours(path)
        return Inputs(model=model, hf=hf, ids=_prompt(batch, model.config.vocab_size),
                      provider="models.deepseek (every op a portable_kernels op)", note=_weights_note(model, hf_bytes))
    return build


def _prefill_op(i: Inputs) -> object:
    return i.model.prefill(i.ids, 1).token


@torch.inference_mode()
def _prefill_peer(i: Inputs) -> object:
    return i.hf(input_ids=i.ids, use_cache=True).logits[:, -1].argmax(-1)


def _build_load(size: str):
    def build(device: torch.device) -> Inputs:
        path, hf, hf_bytes = _checkpoint_and_hf(size)
        model = _ours(path)
        return Inputs(path=path, bytes_moved=model.load_report.checkpoint_bytes, provider="models.load",
                      note=_weights_note(model, hf_bytes) + "; GB/s = checkpoint bytes / time")
    return build


def _load_op(i: Inputs) -> object:
    return _ours(i.path)


def _load_peer(i: Inputs) -> object:
    from ....models.deepseek.reference import hf_model
    return hf_model(i.path, torch.bfloat16, empty_init=True)


def _shape(size: str, batch: int | None = None) -> str:
    raw = _config(size)
    dims = (f"{raw['num_hidden_layers']} layers, hidden {raw['hidden_size']}, {raw['n_routed_experts']} experts "
            f"top-{raw['num_experts_per_tok']}")
    if "index_topk" in raw:
        dims = f"V3.2 (indexer top-{raw['index_topk']}, FP8 cache), " + dims
    return (f"b={batch} prompt={PROMPT}, " if batch else "") + dims


def _cases(size: str, sizes: frozenset[str]) -> list[Case]:
    judged = {"target_source": SOURCE, "target_on": ON}
    out = [Case(FAMILY, "decode step", _shape(size, b), _build_decode(size, b), _decode_op, _decode_peer,
                "DeepseekV3.decode_step", "HF eager bf16, one step with its KV cache", target=2.0, sizes=sizes,
                devices=DEVICES, **judged) for b in (1, 8)]
    out += [Case(FAMILY, "decode step, MoE layout", _shape(size, b), _build_decode(size, b), _decode_op,
                 _decode_contiguous_peer, "masked layout (rows padded to T per expert)",
                 "contiguous layout (rows padded to 128 per expert), same model", sizes=sizes, devices=DEVICES)
            for b in (1, 8)]
    out.append(Case(FAMILY, "prefill", _shape(size, 1), _build_prefill(size, 1), _prefill_op, _prefill_peer,
                    "DeepseekV3.prefill", "HF eager bf16 forward", sizes=sizes, devices=DEVICES))
    out.append(Case(FAMILY, "load", _shape(size), _build_load(size), _load_op, _load_peer, "models.load",
                    "read + dequantize to bf16 + HF model (meta init)", sizes=sizes, memory=True, devices=DEVICES))
    return out


def _v32_cases(sizes: frozenset[str]) -> list[Case]:
    """DeepSeek-V3.2's decode step (indexer -> top-k -> sparse MLA) against HF's DeepseekV32 eager."""
    return [Case(FAMILY, "decode step", _shape("v3.2-small", b), _build_decode("v3.2-small", b), _decode_op,
                 _decode_peer, "DeepseekV3.decode_step (V3.2)", "HF DeepseekV32 eager bf16, one step with its cache",
                 sizes=sizes, devices=DEVICES) for b in (1, 8)]


CASES = _cases("small", frozenset({"quick", "full"})) + _v32_cases(frozenset({"full"})) + _cases("tiny", TINY)
