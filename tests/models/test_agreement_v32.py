"""DeepSeek-V3.2 (lightning indexer -> top-k -> sparse MLA) against Hugging Face's eager
DeepseekV32ForCausalLM on the same dequantized checkpoint.

The tiny V3.2 config keeps the published indexer head (128 channels, 64 rotated) with 8 heads and
index_topk 24, so at 45-80 tokens most queries attend to a strict subset of their keys and the
selection decides the result. Our indexer scores FP8 queries and keys (as DeepSeek's inference and
DeepGEMM's kernels do; HF scores in fp32), so keys near the top-k boundary can swap: measured on
the seed-7 checkpoint (2026-12-04, cpu): median per-position logits calc_diff 1.5e-2 (bf16 cache)
and 1.9e-2 (FP8 cache), whole sequence 8.2e-2 / 8.8e-2; layer 0's selections (same input as HF's)
overlap HF's by 98 % on average. Faults give a median of 0.15 (attention over every key: the
indexer ignored), 0.18 (the indexer's RoPE interleaved instead of half-split), 0.13 (no indexer
RoPE), 0.41 (the unselected keys attended instead) — so the bounds below catch each.
"""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.models import load
from portable_kernels.models.deepseek import model as model_mod
from portable_kernels.models.deepseek.reference import hf_logits

from .agreement import median_diff, ragged_ids

V32_MEDIAN_BOUND = 3e-2
V32_WHOLE_BOUND = 0.15
#: mean overlap of layer 0's selections with HF's (measured 0.98; a wrong score gives far less)
LAYER0_OVERLAP = 0.93
LENGTHS = [80, 45]


@pytest.fixture(scope="module")
def prompt():
    return ragged_ids(2, 80, 512, seed=3)


@pytest.fixture(scope="module")
def hf_v32(references, prompt):
    return [hf_logits(references["v32"], prompt[b:b + 1, :n])[0] for b, n in enumerate(LENGTHS)]


def _worst(ours, refs, lengths, offset=0):
    med = max(median_diff(ours[b, offset:n], refs[b][offset:n]) for b, n in enumerate(lengths))
    whole = max(float(pk.calc_diff(ours[b, offset:n], refs[b][offset:n])) for b, n in enumerate(lengths))
    return med, whole


@pytest.mark.parametrize("kv_cache", ["bf16", "fp8"])
def test_v32_ragged_prefill_agrees_with_hf(checkpoints, hf_v32, prompt, kv_cache):
    model = load(checkpoints["v32"], kv_cache=kv_cache)
    assert model.config.is_v32 and model.config.indexer.topk < min(LENGTHS)
    pk.reset_implicit_conversions()
    med, whole = _worst(model.logits(prompt, lengths=LENGTHS), hf_v32, LENGTHS)
    assert med < V32_MEDIAN_BOUND and whole < V32_WHOLE_BOUND, (med, whole)
    assert pk.implicit_conversions() == 0


@pytest.mark.parametrize("kv_cache", ["bf16", "fp8"])
def test_v32_teacher_forced_decode_reads_the_paged_indexer_cache(checkpoints, hf_v32, prompt, kv_cache):
    model = load(checkpoints["v32"], kv_cache=kv_cache)
    calls = []
    paged = pk.fp8_paged_mqa_logits

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return paged(*args, **kwargs)

    model_mod.pk.fp8_paged_mqa_logits = counting
    try:
        ours = model.logits(prompt, lengths=LENGTHS, prefill=8)    # 8-token prefill, then 72 / 37 steps
    finally:
        model_mod.pk.fp8_paged_mqa_logits = paged
    assert len(calls) == (80 - 8) * model.config.num_hidden_layers
    med, whole = _worst(ours, hf_v32, LENGTHS, offset=8)
    assert med < V32_MEDIAN_BOUND and whole < V32_WHOLE_BOUND, (med, whole)


def test_v32_layer0_selection_matches_hf(checkpoints, references, prompt):
    ids = prompt[:1]
    theirs = []
    handle = references["v32"].model.layers[0].self_attn.indexer.register_forward_hook(
        lambda mod, inp, out: theirs.append(out[0].clone()))
    try:
        hf_logits(references["v32"], ids)
    finally:
        handle.remove()
    model = load(checkpoints["v32"])
    ours = []
    original = model_mod.DeepseekV3._index_positions

    def recording(self, layer, *args):
        picked = original(self, layer, *args)
        if layer == 0:
            ours.append(picked.clone())
        return picked

    model_mod.DeepseekV3._index_positions = recording
    try:
        model.logits(ids)
    finally:
        model_mod.DeepseekV3._index_positions = original
    overlaps = []
    for t in range(ids.shape[1]):
        hf_set = {k for k in theirs[0][t].tolist() if k <= t}
        our_set = {k for k in ours[0][t].tolist() if k >= 0}
        assert len(our_set) == min(t + 1, model.config.indexer.topk)
        assert max(our_set) <= t, "a query selected a future key"
        overlaps.append(len(hf_set & our_set) / len(hf_set))
    assert sum(overlaps) / len(overlaps) > LAYER0_OVERLAP, sum(overlaps) / len(overlaps)


def test_v32_bound_catches_attention_over_every_key(checkpoints, hf_v32, prompt):
    model = load(checkpoints["v32"])
    original = model_mod.DeepseekV3._index_positions

    def every_key(self, layer, attn, cache, step, *args):
        original(self, layer, attn, cache, step, *args)   # keep the indexer cache written
        keys = torch.arange(80)[None, :].expand(step.positions.shape[0], 80).clone()
        return keys.masked_fill(keys > step.positions[:, None], -1)

    model_mod.DeepseekV3._index_positions = every_key
    try:
        med = _worst(model.logits(prompt, lengths=LENGTHS), hf_v32, LENGTHS)[0]
    finally:
        model_mod.DeepseekV3._index_positions = original
    assert med > 3 * V32_MEDIAN_BOUND


@pytest.mark.parametrize("backend", ["nvidia:arch=sm100", "ascend:soc=950"])
def test_v32_emulated_backends_prefill_agrees_with_hf(checkpoints, hf_v32, prompt, backend):
    model = load(checkpoints["v32"], backend=backend, kv_cache="fp8")
    pk.reset_implicit_conversions()
    med, whole = _worst(model.logits(prompt, lengths=LENGTHS), hf_v32, LENGTHS)
    assert med < V32_MEDIAN_BOUND and whole < V32_WHOLE_BOUND, (med, whole)
    assert pk.implicit_conversions() == 0


def test_v32_config_needs_q_lora_and_a_power_of_two_index_head(tmp_path):
    from portable_kernels.models.deepseek.checkpoint import tiny_config
    from portable_kernels.models.deepseek.config import config_from_dict
    from portable_kernels.models.deepseek.errors import UnsupportedConfigError

    with pytest.raises(UnsupportedConfigError, match="q_lora_rank"):
        config_from_dict(tiny_config(q_lora_rank=None, model="v3.2"))
    with pytest.raises(UnsupportedConfigError, match="index_head_dim"):
        config_from_dict(dict(tiny_config(model="v3.2"), index_head_dim=96))
    with pytest.raises(UnsupportedConfigError, match="index_topk"):
        config_from_dict(dict(tiny_config(model="v3.2"), index_topk=5000))
