"""`python -m portable_kernels generate`: checkpoint on disk -> generated tokens, with timings.

With no arguments it writes (once, into a cache folder) a seeded random-weight DeepSeek-V3-
architecture checkpoint in the real on-disk format, loads it on the cpu backend, generates, and
prints per-phase timings, tokens/s, weight bytes per Format, implicit conversions and, when
transformers is installed, the agreement with Hugging Face's eager model on the same checkpoint.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

import portable_kernels as pk

from .checkpoint import cached_random_checkpoint, tiny_config
from .model import load, parse_backend


def add_parser(sub: Any, func: Any) -> None:
    p = sub.add_parser("generate", help="load a DeepSeek-V3 FP8 checkpoint and generate tokens (the main job)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", metavar="DIR", default=None,
                   help="a Hugging Face-style DeepSeek-V3 FP8 checkpoint (default: the cached random one)")
    p.add_argument("--model", choices=("v3", "v3.2"), default="v3",
                   help="architecture of the random checkpoint written when --checkpoint is not given: v3, or "
                        "v3.2 (the lightning indexer selecting each query's keys, then sparse MLA); a given "
                        "checkpoint's config.json decides by its model_type")
    p.add_argument("--backend", default="cpu",
                   help="NAME[:k=v,...], e.g. cpu, nvidia:arch=sm90, ascend:soc=950 (on CPU tensors a non-cpu "
                        "backend runs in emulation)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--prompt-len", type=int, default=16, help="random prompt length (default 16)")
    p.add_argument("--prompt-ids", default=None, help="comma-separated token ids (overrides --prompt-len)")
    p.add_argument("--tokens", type=int, default=16, help="new tokens per sequence (default 16)")
    p.add_argument("--kv-cache", choices=("bf16", "fp8"), default="bf16", help="latent cache format")
    p.add_argument("--seed", type=int, default=0, help="seed of the random checkpoint and prompt")
    p.add_argument("--requantize-ue8m0", action="store_true",
                   help="re-quantize non-power-of-two weight scales for backends whose Format needs UE8M0")
    p.add_argument("--ep", type=int, default=1, metavar="N",
                   help="run the routed experts expert-parallel over N local processes (Gloo; attention "
                        "replicated), and compare the tokens with the single-process run")
    p.add_argument("--no-reference", action="store_true", help="skip the Hugging Face comparison")
    p.add_argument("--json", metavar="FILE", default=None, help="also write token ids, timings and agreement")
    p.set_defaults(func=func)


def _prompt(args: argparse.Namespace, vocab: int) -> torch.Tensor:
    if args.prompt_ids:
        ids = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        if not ids or min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"--prompt-ids must be ids in 0..{vocab - 1}")
        return torch.tensor(ids, dtype=torch.long).repeat(args.batch, 1)
    g = torch.Generator().manual_seed(args.seed + 1)
    return torch.randint(0, vocab, (args.batch, args.prompt_len), generator=g)


def _agreement(path: Path, model: Any, ids: torch.Tensor, new: torch.Tensor) -> dict[str, Any]:
    """calc_diff of prefill logits against HF eager, and how many greedy tokens HF reproduces."""
    try:
        from .reference import hf_model
    except ImportError:
        return {"skipped": "transformers is not installed"}
    try:
        ref = hf_model(path)
    except ImportError as e:
        return {"skipped": f"transformers: {e}"}
    full = torch.cat([ids, new], dim=1)
    with torch.inference_mode():
        theirs = ref(input_ids=full).logits.float()
    ours = model.logits(full, prefill=ids.shape[1])
    per_pos = [float(pk.calc_diff(ours[b, t], theirs[b, t])) for b in range(full.shape[0])
               for t in range(full.shape[1])]
    p = ids.shape[1]
    greedy = theirs[:, p - 1:-1].argmax(-1)
    return {"logits_calc_diff": float(pk.calc_diff(ours, theirs)), "median_position_calc_diff":
            statistics.median(per_pos), "hf_argmax_equals_our_token": int((greedy == new).sum()),
            "tokens": int(new.numel())}


def run(args: argparse.Namespace) -> int:
    for name in ("batch", "prompt_len", "tokens", "ep"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive int")
    parse_backend(args.backend)
    t0 = time.perf_counter()
    path = Path(args.checkpoint) if args.checkpoint else cached_random_checkpoint(tiny_config(model=args.model),
                                                                                      seed=args.seed)
    written = time.perf_counter() - t0

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() and (done == total or done % 16 == 0):
            bar = "#" * (30 * done // total)
            print(f"\rload [{bar:<30}] {done}/{total} tensors", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)

    if args.ep > 1:
        return _run_ep(args, path)
    pk.reset_implicit_conversions()
    model = load(path, backend=args.backend, kv_cache=args.kv_cache, requantize_to_ue8m0=args.requantize_ue8m0,
                 progress=progress)
    ids = _prompt(args, model.config.vocab_size)
    new = model.generate(ids, args.tokens)
    conversions = pk.implicit_conversions()
    t = model.last_timings
    steps = t["decode_step_s"]
    emulated = model.backend != "cpu"
    rep = model.load_report
    result: dict[str, Any] = {
        "checkpoint": str(path), "model": "v3.2" if model.config.is_v32 else "v3",
        "backend": model.backend_label, "emulated_on_cpu": emulated,
        "kv_cache": args.kv_cache, "prompt_ids": ids.tolist(), "new_token_ids": new.tolist(),
        "load_s": rep.seconds, "checkpoint_bytes": rep.checkpoint_bytes,
        "load_gb_per_s": rep.checkpoint_bytes / rep.seconds / 1e9, "weight_bytes": rep.weight_bytes,
        "prefill_s": t["prefill_s"], "prefill_tokens_per_s": t["prefill_tokens"] / t["prefill_s"],
        "decode_step_s": steps,
        "decode_tokens_per_s": (t["batch"] * len(steps) / sum(steps)) if steps else None,
        "implicit_conversions": conversions, "checkpoint_written_s": written,
    }
    if not args.no_reference:
        result["agreement_with_hf_eager"] = _agreement(path, model, ids, new)
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if conversions == 0 else 1


def ep_rank(rank: int, num_ranks: int, group: Any, path: str, backend: str, kv_cache: str, ids: torch.Tensor,
            tokens: int) -> dict[str, Any]:
    """One rank of `generate --ep N` (a run_ranks target): load with the group, generate."""
    pk.reset_implicit_conversions()
    model = load(path, backend=backend, kv_cache=kv_cache, ep_group=group)
    new = model.generate(ids, tokens)
    steps = model.last_timings["decode_step_s"]
    ep = next(layer.mlp.ep for layer in model.layers if hasattr(layer.mlp, "w13"))
    return {"new_token_ids": new, "prefill_s": model.last_timings["prefill_s"], "decode_step_s": steps,
            "implicit_conversions": pk.implicit_conversions(), "moe_calls": ep.calls,
            "low_latency_calls": ep.low_latency_calls,
            "expert_bytes": sum(m.w13.data.numel() + m.w2.data.numel() for m in
                                (layer.mlp for layer in model.layers) if hasattr(m, "w13"))}


def _run_ep(args: argparse.Namespace, path: Path) -> int:
    from ...testing.ep_distributed import run_ranks

    single = load(path, backend=args.backend, kv_cache=args.kv_cache)
    ids = _prompt(args, single.config.vocab_size)
    want = single.generate(ids, args.tokens)
    outcomes = run_ranks(args.ep, ep_rank, (str(path), args.backend, args.kv_cache, ids, args.tokens),
                         timeout_s=600)
    failed = [o.describe() for o in outcomes if not o.ok]
    if failed:
        print("\n".join(failed), file=sys.stderr)
        return 1
    r = outcomes[0].value
    same_on_ranks = all(torch.equal(o.value["new_token_ids"], r["new_token_ids"]) for o in outcomes)
    equal = int((r["new_token_ids"] == want).sum())
    steps = r["decode_step_s"]
    print(f"checkpoint: {path}; expert parallel over {args.ep} Gloo ranks (routed experts split "
          f"{single.config.n_routed_experts // args.ep} per rank; attention replicated)")
    print(f"prefill: {r['prefill_s'] * 1e3:.1f} ms; decode: median "
          f"{statistics.median(steps) * 1e3 if steps else 0:.1f} ms/step")
    print(f"MoE calls: {r['moe_calls']} per rank; {r['low_latency_calls']} of them (the decode steps') through the "
          "low-latency dispatch/combine and the masked GEMMs, the prefill's through the normal pair")
    for row, ids_row in enumerate(r["new_token_ids"].tolist()):
        print(f"tokens[{row}]: {' '.join(map(str, ids_row))}")
    print(f"every rank generated the same tokens: {'yes' if same_on_ranks else 'NO'}; equal to the single-process "
          f"run at {equal}/{want.numel()} positions (in the prefill each rank's partial expert sum is rounded "
          "to bf16 before the normal combine, so near-ties can flip; docs/ep.md)")
    print(f"implicit conversions: {max(o.value['implicit_conversions'] for o in outcomes)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ep": args.ep, "new_token_ids": r["new_token_ids"].tolist(),
                                               "single_process_token_ids": want.tolist(),
                                               "equal_positions": equal, "same_on_every_rank": same_on_ranks,
                                               "moe_calls": r["moe_calls"],
                                               "low_latency_calls": r["low_latency_calls"]},
                                              indent=1))
    return 0 if same_on_ranks else 1


def _print(r: dict[str, Any]) -> None:
    label = r["backend"] + (" (emulated on cpu tensors: correctness, not that chip's speed)"
                            if r["emulated_on_cpu"] else "")
    print(f"checkpoint: {r['checkpoint']} (DeepSeek-{r['model'].upper()} architecture)")
    print(f"backend: {label}; kv cache {r['kv_cache']}; torch threads {torch.get_num_threads()}")
    print(f"load: {r['load_s'] * 1e3:.0f} ms for {r['checkpoint_bytes'] / 2**20:.2f} MiB "
          f"({r['load_gb_per_s']:.3f} GB/s of checkpoint)")
    for fmt, n in sorted(r["weight_bytes"].items()):
        print(f"  weights in {fmt}: {n / 2**20:.2f} MiB")
    b, p = len(r["prompt_ids"]), len(r["prompt_ids"][0])
    print(f"prefill: {b}x{p} tokens in {r['prefill_s'] * 1e3:.1f} ms ({r['prefill_tokens_per_s']:.1f} tokens/s)")
    steps = r["decode_step_s"]
    if steps:
        print(f"decode: {len(steps)} steps, median {statistics.median(steps) * 1e3:.1f} ms/step "
              f"(min {min(steps) * 1e3:.1f}, max {max(steps) * 1e3:.1f}); {r['decode_tokens_per_s']:.1f} tokens/s")
    for row, ids in enumerate(r["new_token_ids"]):
        print(f"tokens[{row}]: {' '.join(map(str, ids))}")
    print(f"implicit conversions: {r['implicit_conversions']}")
    a = r.get("agreement_with_hf_eager")
    if a is None:
        return
    if "skipped" in a:
        print(f"agreement with HF eager: skipped ({a['skipped']})")
        return
    hf_class = "DeepseekV32ForCausalLM" if r["model"] == "v3.2" else "DeepseekV3ForCausalLM"
    print(f"agreement with HF eager {hf_class} (dequantized weights, fp32): logits calc_diff "
          f"{a['logits_calc_diff']:.2e} (median per position {a['median_position_calc_diff']:.2e}); "
          f"HF's argmax equals our token at {a['hf_argmax_equals_our_token']}/{a['tokens']} steps")
