"""`python -m portable_kernels generate` end to end, and the Python API it is built on."""

from __future__ import annotations

import json

import pytest
import torch

import portable_kernels as pk

from portable_kernels.__main__ import main
from portable_kernels.models import load
from portable_kernels.models.deepseek.checkpoint import cached_random_checkpoint, tiny_config


def test_generate_writes_tokens_timings_and_agreement(checkpoints, tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = main(["generate", "--checkpoint", str(checkpoints["q_lora"]), "--batch", "2", "--prompt-len", "6",
               "--tokens", "3", "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["implicit_conversions"] == 0 and len(r["new_token_ids"]) == 2 and len(r["new_token_ids"][0]) == 3
    assert len(r["decode_step_s"]) == 2 and r["weight_bytes"]["fp32-row-major"] > 0
    assert r["agreement_with_hf_eager"]["median_position_calc_diff"] < 1e-2
    text = capsys.readouterr().out
    assert "implicit conversions: 0" in text and "agreement with HF eager" in text


def test_generate_labels_an_emulated_backend(checkpoints, capsys):
    rc = main(["generate", "--checkpoint", str(checkpoints["q_lora"]), "--backend", "ascend:soc=950",
               "--prompt-ids", "1,2,3", "--tokens", "2", "--kv-cache", "fp8", "--no-reference"])
    assert rc == 0
    assert "ascend[soc=950] (emulated on cpu tensors" in capsys.readouterr().out


def test_generate_rejects_a_bad_option_in_one_line(capsys):
    assert main(["generate", "--tokens", "0"]) == 2
    assert "--tokens must be a positive int" in capsys.readouterr().err


def test_cached_checkpoint_is_written_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PK_MODEL_CACHE", str(tmp_path))
    raw = tiny_config(num_hidden_layers=2)
    first = cached_random_checkpoint(raw, seed=5)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert cached_random_checkpoint(raw, seed=5) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp


def test_load_refuses_an_unknown_kv_cache(checkpoints):
    with pytest.raises(ValueError, match="kv_cache"):
        load(checkpoints["q_lora"], kv_cache="int4")


def test_logits_refuse_ids_that_are_not_a_batch_of_longs(checkpoints):
    model = load(checkpoints["q_lora"])
    with pytest.raises(ValueError, match=r"\[batch, seq\] LongTensor"):
        model.logits(torch.arange(4))


def test_prefill_and_decode_steps_are_generate_and_a_repeated_step_changes_nothing(checkpoints):
    from portable_kernels.models import load
    model = load(checkpoints["q_lora"])
    ids = torch.arange(3, 43).view(2, 20)
    want = model.generate(ids, 4)
    state = model.prefill(ids, 4)
    got = [state.token.clone()]
    for _ in range(3):
        again = model.decode_step(state, advance=False)   # the same step twice: same answer, state kept
        assert torch.equal(model.decode_step(state, advance=False), again)
        got.append(model.decode_step(state).clone())
        assert torch.equal(got[-1], again)
    assert torch.equal(torch.stack(got, 1), want)
    with pytest.raises(pk.ContractError, match="cache is full"):
        for _ in range(200):
            model.decode_step(state)


def test_generate_model_v32_writes_and_runs_a_v32_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PK_MODEL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run.json"
    rc = main(["generate", "--model", "v3.2", "--prompt-len", "30", "--tokens", "3", "--kv-cache", "fp8",
               "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["model"] == "v3.2" and r["implicit_conversions"] == 0 and len(r["new_token_ids"][0]) == 3
    assert r["agreement_with_hf_eager"]["median_position_calc_diff"] < 3e-2
    assert "DeepSeek-V3.2 architecture" in capsys.readouterr().out
