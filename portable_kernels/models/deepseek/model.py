"""DeepSeek-V3 inference on portable_kernels: `load` a checkpoint directory into a backend's
Formats once, then `logits` (prefill, or prefill + teacher-forced decode) and greedy `generate`.

One rule: the whole forward runs inside `use_backend(<the backend the weights were prepared
for>)`, and nothing on the hot path converts a weight (`pk.implicit_conversions()` stays 0).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import attrs
import torch

import portable_kernels as pk
from portable_kernels.layouts import indexer_cache_views, is_power_of_two

from .cache import KV_CACHE_KINDS, PAGE_SIZE, PagedLatentCache
from .checkpoint import expected_tensors, index_checkpoint, read_shards, scale_name
from .config import DeepseekV3Config, load_config
from .ep import ExpertParallel
from .errors import ScaleFormatError, UnsupportedConfigError
from .layers import (FP8_GEMM, GROUPED, Fp8Linear, HeadProduct, Indexer, Mla, Mlp, Moe, hadamard, rms_norm,
                     rope_tables)

log = logging.getLogger(__name__)


def parse_backend(spec: str) -> tuple[str, dict[str, str]]:
    """'ascend:soc=950' -> ('ascend', {'soc': '950'})."""
    name, _, rest = spec.partition(":")
    opts = dict(kv.split("=", 1) for kv in rest.split(",") if kv) if rest else {}
    return name, opts


@attrs.frozen
class Layer:
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    attn: Mla
    mlp: Mlp | Moe


@attrs.define
class LoadReport:
    seconds: float = 0.0
    checkpoint_bytes: int = 0
    #: tensors read past: the multi-token-prediction layers (not used by greedy decoding)
    skipped_tensors: int = 0
    weight_bytes: dict[str, int] = attrs.Factory(dict)   # Format name -> bytes of prepared weights


class _Weights:
    """Turns checkpoint tensors into prepared weights, counting bytes per Format."""

    def __init__(self, requantize_to_ue8m0: bool, report: LoadReport):
        self.requantize = requantize_to_ue8m0
        self.report = report

    def _count(self, name: str, nbytes: int) -> None:
        self.report.weight_bytes[name] = self.report.weight_bytes.get(name, 0) + nbytes

    def plain(self, t: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        out = t.to(dtype)
        self._count(f"plain-{str(dtype).removeprefix('torch.')}", out.numel() * out.element_size())
        return out

    def quant(self, names: list[str], raw: dict[str, torch.Tensor]) -> pk.QuantTensor:
        """One QuantTensor from one or more checkpoint weights stacked along N (names share K)."""
        data = torch.cat([raw[n] for n in names], dim=0)
        scale = torch.cat([raw[scale_name(n)] for n in names], dim=0)
        return self._quant(data, scale, names[0])

    def _quant(self, data: torch.Tensor, scale: torch.Tensor, name: str) -> pk.QuantTensor:
        pow2 = is_power_of_two(scale)
        q = pk.QuantTensor(data, scale, granularity=(128, 128), ue8m0=pow2)
        if pow2 or not self.requantize:
            return q
        return pk.per_block_cast_to_fp8(pk.dequantize(q).bfloat16(), use_ue8m0=True)

    def prepare(self, op: Callable[..., Any], q: pk.QuantTensor, name: str) -> pk.PreparedTensor:
        try:
            out = pk.prepare_inputs(op, b=q)["b"]
        except pk.LayoutError as e:
            raise ScaleFormatError(
                f"{name}: weight_scale_inv holds scales that are not powers of two, but this backend's Format "
                f"stores UE8M0 exponents ({e}). Fix: load(..., requantize_to_ue8m0=True) (CLI: "
                "--requantize-ue8m0) re-quantizes such weights with power-of-two scales, which changes them "
                "by at most one FP8 rounding step; or pick a backend whose Format keeps fp32 scales "
                "(cpu, nvidia:arch=sm90)") from e
        self._count(out.format.name, out.data.numel() * out.data.element_size()
                    + out.scale.numel() * out.scale.element_size())
        return out

    def linear(self, names: list[str], raw: dict[str, torch.Tensor]) -> Fp8Linear:
        q = self.quant(names, raw)
        return Fp8Linear(self.prepare(FP8_GEMM, q, names[0]), q.data.shape[0])

    def grouped(self, data: torch.Tensor, scale: torch.Tensor, name: str) -> pk.PreparedTensor:
        """The grouped weight [E, N, K] (and its scales) that _ExpertStacks assembled."""
        if is_power_of_two(scale) or not self.requantize:
            q = pk.QuantTensor(data, scale, granularity=(128, 128), ue8m0=is_power_of_two(scale))
        else:
            qs = [self._quant(data[e], scale[e], name) for e in range(data.shape[0])]
            q = pk.QuantTensor(torch.stack([x.data for x in qs]), torch.stack([x.scale for x in qs]),
                               granularity=(128, 128), ue8m0=True)
        return self.prepare(GROUPED, q, name)


class _ExpertStacks:
    """The routed experts' weights copied, as each is read, into one [E, N, K] buffer per layer and
    projection ("w13": each expert's gate rows then its up rows; "w2": down), with their scales. A
    checkpoint tensor is then dropped at once, so the loader never holds a layer's experts twice."""

    PROJ = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}

    def __init__(self, cfg: DeepseekV3Config):
        self.cfg = cfg
        self.buffers: dict[tuple[int, str, bool], torch.Tensor] = {}

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy `name` into its stack when it is a routed expert's weight or scale (True), else False."""
        parts = name.split(".")  # model.layers.{i}.mlp.experts.{e}.{proj}.weight[_scale_inv]
        if len(parts) != 8 or parts[3:5] != ["mlp", "experts"] or parts[6] not in self.PROJ:
            return False
        layer, expert, (group, half) = int(parts[2]), int(parts[5]), self.PROJ[parts[6]]
        is_scale = parts[7] != "weight"
        key = (layer, group, is_scale)
        buf = self.buffers.get(key)
        if buf is None:
            rows = tensor.shape[0] * (2 if group == "w13" else 1)
            buf = self.buffers[key] = torch.empty(self.cfg.n_routed_experts, rows, tensor.shape[1], dtype=tensor.dtype)
        rows = tensor.shape[0]
        buf[expert, half * rows:(half + 1) * rows] = tensor
        return True

    def pop(self, layer: int, group: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.buffers.pop((layer, group, False)), self.buffers.pop((layer, group, True))


def _build_layer(cfg: DeepseekV3Config, i: int, raw: dict[str, torch.Tensor], w: _Weights,
                 stacks: _ExpertStacks, ep: ExpertParallel | None = None) -> Layer:
    p, a, m = f"model.layers.{i}", f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
    heads = cfg.num_attention_heads
    if cfg.q_lora_rank is None:
        q_a, q_a_norm, q_b = None, None, w.linear([f"{a}.q_proj.weight"], raw)
    else:
        q_a = w.linear([f"{a}.q_a_proj.weight"], raw)
        q_a_norm = w.plain(raw[f"{a}.q_a_layernorm.weight"])
        q_b = w.linear([f"{a}.q_b_proj.weight"], raw)
    kv_b = pk.dequantize(w.quant([f"{a}.kv_b_proj.weight"], raw)).float()
    kv_b = kv_b.view(heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    uk = HeadProduct.of(kv_b[:, :cfg.qk_nope_head_dim].transpose(1, 2), w.plain)
    uv = HeadProduct.of(kv_b[:, cfg.qk_nope_head_dim:], w.plain)
    indexer = None
    if cfg.indexer is not None:
        ix = f"{a}.indexer"
        indexer = Indexer(cfg, w.linear([f"{ix}.wq_b.weight"], raw), w.linear([f"{ix}.wk.weight"], raw),
                          w.plain(raw[f"{ix}.k_norm.weight"]), w.plain(raw[f"{ix}.k_norm.bias"]),
                          w.plain(raw[f"{ix}.weights_proj.weight"], torch.bfloat16), hadamard(cfg.indexer.head_dim))
    attn = Mla(cfg, q_a, q_a_norm, q_b, w.linear([f"{a}.kv_a_proj_with_mqa.weight"], raw),
               w.plain(raw[f"{a}.kv_a_layernorm.weight"]), uk, uv, w.linear([f"{a}.o_proj.weight"], raw), indexer)

    def mlp(prefix: str) -> Mlp:
        return Mlp(w.linear([f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"], raw),
                   w.linear([f"{prefix}.down_proj.weight"], raw))

    if not cfg.is_moe_layer(i):
        ffn: Mlp | Moe = mlp(m)
    else:
        local = slice(None) if ep is None else ep.local_experts
        w13 = w.grouped(*(t[local] for t in stacks.pop(i, "w13")), f"{m}.experts.0.gate_proj.weight")
        w2 = w.grouped(*(t[local] for t in stacks.pop(i, "w2")), f"{m}.experts.0.down_proj.weight")
        ffn = Moe(cfg, w.plain(raw[f"{m}.gate.weight"]), w.plain(raw[f"{m}.gate.e_score_correction_bias"]),
                  w13, w2, mlp(f"{m}.shared_experts") if cfg.n_shared_experts else None, ep)
    return Layer(w.plain(raw[f"{p}.input_layernorm.weight"]), w.plain(raw[f"{p}.post_attention_layernorm.weight"]),
                 attn, ffn)


def _owner(name: str) -> int | None:
    """The decoder layer a tensor belongs to (None: embedding, final norm, lm_head)."""
    if name.startswith("model.layers."):
        return int(name.split(".")[2])
    return None


class DeepseekV3:
    """A loaded model: `logits(input_ids)` and `generate(input_ids, max_new_tokens)`."""

    def __init__(self, cfg: DeepseekV3Config, embed: torch.Tensor, layers: list[Layer], norm: torch.Tensor,
                 lm_head: torch.Tensor, backend: str, options: dict[str, str], kv_cache: str, report: LoadReport):
        self.config, self.embed, self.layers, self.norm, self.lm_head = cfg, embed, layers, norm, lm_head
        self.backend, self.options, self.kv_cache, self.load_report = backend, options, kv_cache, report
        self.last_timings: dict[str, Any] = {}
        self.cache_seed = 0

    @property
    def backend_label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        return self.backend + (f"[{opts}]" if opts else "")

    # -- the forward pass over one batch step --------------------------------------------------

    def _step(self, cache: PagedLatentCache, tokens: list[torch.Tensor], hook: Callable | None = None
              ) -> torch.Tensor:
        """Feed `tokens[b]` (new token ids of sequence b, possibly none) after what the cache holds;
        return final hidden states bf16 [sum n_b, H] in (sequence, position) order."""
        cfg = self.config
        counts = [int(t.numel()) for t in tokens]
        s_q = max(counts)
        starts = cache.seqlens.clone()
        batch = torch.cat([torch.full((n,), b, dtype=torch.long) for b, n in enumerate(counts)])
        positions = torch.cat([starts[b].long() + torch.arange(n) for b, n in enumerate(counts)])
        # Queries sit left-padded in [B, s_q]: with FlashMLA's bottom-right causal mask, query t of a
        # sequence with n new tokens then sees exactly the keys up to its own position.
        slot = torch.cat([b * s_q + (s_q - n) + torch.arange(n) for b, n in enumerate(counts)])
        cache.seqlens += torch.tensor(counts, dtype=torch.int32)
        step = _Step(counts, s_q, starts, batch, positions, slot)
        if cfg.indexer is None:
            meta, splits = pk.get_mla_metadata(cache.seqlens, s_q * cfg.num_attention_heads, 1,
                                               is_fp8_kvcache=cache.is_fp8)
        else:  # what every V3.2 layer of this step shares: its indexer lengths and schedules
            step = self._sparse_plan(cache, step)
        cos, sin = rope_tables(cfg, positions)
        # one padded query buffer for every layer: each writes the same rows, the padding stays zero
        q_pad = torch.zeros(len(counts) * s_q, cfg.num_attention_heads, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                            dtype=torch.bfloat16)
        h = self.embed[torch.cat(tokens)].float()
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.attn_norm, cfg.rms_norm_eps)
            q, entry, hq = layer.attn.project(x, cos, sin)
            cache.write(i, batch, positions, entry)
            if layer.attn.indexer is not None:
                o = self._sparse_attention(i, layer.attn, cache, step, q_pad, q, x, hq, cos, sin)
            else:
                q_pad[slot] = q
                o, _ = pk.flash_mla_with_kvcache(q_pad.view(len(counts), s_q, cfg.num_attention_heads, -1),
                                                 cache.pages[i], cache.block_table, cache.seqlens, cfg.kv_lora_rank,
                                                 meta, splits, softmax_scale=layer.attn.softmax_scale, causal=True,
                                                 is_fp8_kvcache=cache.is_fp8)
                o = o.reshape(len(counts) * s_q, cfg.num_attention_heads, -1)[slot]
            h = h + layer.attn.output(o).float()
            h = h + layer.mlp(rms_norm(h, layer.mlp_norm, cfg.rms_norm_eps), s_q == 1).float()
            if hook is not None:
                hook(i, h)
        return rms_norm(h, self.norm, cfg.rms_norm_eps)

    def _index_positions(self, layer: int, attn: Mla, cache: PagedLatentCache, step: "_Step", x: torch.Tensor,
                         hq: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """DeepSeek-V3.2's selection: int64 [T, index_topk] key positions each query attends to
        (-1 past the keys it can see). A step that starts every sequence empty (a prefill) scores its
        own keys with fp8_mqa_logits (compressed: column j = key j of the query's sequence); any
        other step reads the paged indexer cache with fp8_paged_mqa_logits."""
        ix = attn.indexer
        topk = self.config.indexer.topk
        cache.write_index_keys(layer, step.batch, step.positions, ix.keys(x, cos, sin))
        q, weights = ix.queries(hq, x, cos, sin)
        if step.fresh:
            values, scales = indexer_cache_views(cache.index_pages[layer])
            page, offset = cache.slots(step.batch, step.positions)
            logits = pk.fp8_mqa_logits(q, (values[page, offset].contiguous(), scales[page, offset].contiguous()),
                                       weights, step.key_offsets, step.key_offsets + step.visible,
                                       clean_logits=False, max_seqlen_k=max(step.counts))
            _, picked = pk.topk(logits, topk, end=step.visible, idx_oob_fill_value=-1)
            return picked
        b = len(step.counts)
        q_pad = torch.zeros(b * step.s_q, *q.shape[1:], dtype=q.dtype)
        w_pad = torch.zeros(b * step.s_q, q.shape[1], dtype=torch.float32)
        q_pad[step.slot], w_pad[step.slot] = q, weights
        logits = pk.fp8_paged_mqa_logits(q_pad.view(b, step.s_q, *q.shape[1:]), cache.index_pages[layer], w_pad,
                                         step.index_lens, cache.block_table, step.index_meta,
                                         int(cache.seqlens.max()))
        _, picked = pk.topk(logits, topk, end=step.index_lens.view(-1), idx_oob_fill_value=-1)
        return picked[step.slot]

    def _sparse_plan(self, cache: PagedLatentCache, step: "_Step") -> "_Step":
        """The step with what its V3.2 layers share: each query's visible key count, the key offsets
        of a fresh prefill or the paged lengths and schedule, and the sparse MLA metadata (FP8 cache)."""
        cfg = self.config
        visible = (step.positions + 1).to(torch.int32)
        plan: dict[str, Any] = {"visible": visible}
        if step.fresh:
            plan["key_offsets"] = torch.tensor([0] + step.counts[:-1]).cumsum(0).to(torch.int32)[step.batch]
        else:
            lens = torch.zeros(len(step.counts) * step.s_q, dtype=torch.int32)
            lens[step.slot] = visible
            lens = lens.view(len(step.counts), step.s_q)
            plan["index_lens"] = lens
            plan["index_meta"] = pk.get_paged_mqa_logits_metadata(lens, PAGE_SIZE, INDEXER_SCHEDULE_WORKERS)
        if cache.is_fp8:
            plan["sparse_meta"] = pk.get_mla_metadata(cache.seqlens, step.s_q * cfg.num_attention_heads, 1,
                                                      cfg.num_attention_heads, True, cfg.indexer.topk)
        return attrs.evolve(step, **plan)

    def _sparse_attention(self, layer: int, attn: Mla, cache: PagedLatentCache, step: "_Step", q_pad: torch.Tensor,
                          q: torch.Tensor, x: torch.Tensor, hq: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor) -> torch.Tensor:
        """MLA over the selected keys only -> bf16 [T, heads, 512]: sparse flash_mla_with_kvcache on
        the FP8 cache (FlashMLA's sparse decode), flash_mla_sparse_fwd on the bf16 cache's pages."""
        cfg = self.config
        positions = self._index_positions(layer, attn, cache, step, x, hq, cos, sin)
        slots = cache.cache_slots(step.batch[:, None].expand_as(positions), positions)
        topk = slots.shape[1]
        if not cache.is_fp8:
            kv = cache.pages[layer].view(-1, 1, cache.pages[layer].shape[-1])
            return pk.flash_mla_sparse_fwd(q, kv, slots.view(-1, 1, topk), attn.softmax_scale,
                                           cfg.kv_lora_rank)[0]
        b = len(step.counts)
        idx = torch.full((b * step.s_q, topk), -1, dtype=torch.int32)
        idx[step.slot] = slots
        q_pad[step.slot] = q
        meta, splits = step.sparse_meta
        o, _ = pk.flash_mla_with_kvcache(q_pad.view(b, step.s_q, *q.shape[1:]), cache.pages[layer], None, None,
                                         cfg.kv_lora_rank, meta, splits, softmax_scale=attn.softmax_scale,
                                         is_fp8_kvcache=True, indices=idx.view(b, step.s_q, topk))
        return o.reshape(b * step.s_q, *o.shape[2:])[step.slot]

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        d = torch.empty(x.shape[0], self.config.vocab_size, dtype=torch.float32)
        pk.bf16_gemm_nt(x, self.lm_head, d)
        return d

    def _cache(self, lengths: list[int], extra: int) -> PagedLatentCache:
        index_dim = None if self.config.indexer is None else self.config.indexer.head_dim
        return PagedLatentCache(len(self.layers), [n + extra for n in lengths], self.kv_cache, self.cache_seed,
                                index_dim, self.backend, self.options)

    @staticmethod
    def _lengths(input_ids: torch.Tensor, lengths: torch.Tensor | list[int] | None) -> list[int]:
        if input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise pk.ContractError(f"input_ids is {input_ids.dtype} {list(input_ids.shape)}; expected a [batch, seq] "
                                   "LongTensor. Fix: pass torch.tensor(ids, dtype=torch.long).view(batch, -1)")
        if lengths is None:
            return [input_ids.shape[1]] * input_ids.shape[0]
        out = [int(n) for n in lengths]
        if len(out) != input_ids.shape[0] or min(out) < 1 or max(out) > input_ids.shape[1]:
            raise pk.ContractError(f"lengths {out} do not fit input_ids {list(input_ids.shape)}; expected one length "
                                   "per row in 1..seq (rows right-padded). Fix: pass each row's prompt length")
        return out

    # -- public API ---------------------------------------------------------------------------

    @torch.inference_mode()
    def logits(self, input_ids: torch.Tensor, lengths: torch.Tensor | list[int] | None = None,
               prefill: int | None = None, hook: Callable | None = None) -> torch.Tensor:
        """fp32 [batch, seq, vocab] logits of every position (rows right-padded to `lengths`; padded
        positions are 0). `prefill=p`: run the first p tokens as one prefill, then feed the rest one
        decode step at a time (teacher forcing). `hook(layer, hidden fp32 [T, H])` sees each layer's output."""
        lens = self._lengths(input_ids, lengths)
        out = torch.zeros(*input_ids.shape, self.config.vocab_size)
        cache = self._cache(lens, 0)
        first = [n if prefill is None else min(prefill, n) for n in lens]
        with pk.use_backend(self.backend, **self.options):
            x = self._step(cache, [input_ids[b, :n] for b, n in enumerate(first)], hook)
            rows = torch.cat([torch.arange(n) + b * input_ids.shape[1] for b, n in enumerate(first)])
            out.view(-1, out.shape[-1])[rows] = self._head(x)
            for t in range(min(first), max(lens)):
                feed = [input_ids[b, t:t + 1] if first[b] <= t < lens[b] else input_ids[b, :0]
                        for b in range(len(lens))]
                if not any(f.numel() for f in feed):
                    continue
                x = self._step(cache, feed, hook)
                fed = [b for b, f in enumerate(feed) if f.numel()]
                out[fed, t] = self._head(x)
        return out

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, max_new_tokens: int,
                lengths: torch.Tensor | list[int] | None = None) -> DecodeState:
        """Run the prompts (rows right-padded to `lengths`) into a fresh cache with room for
        `max_new_tokens` more; the state holds each row's greedy next token."""
        lens = self._lengths(input_ids, lengths)
        cache = self._cache(lens, max_new_tokens)
        with pk.use_backend(self.backend, **self.options):
            x = self._step(cache, [input_ids[b, :n] for b, n in enumerate(lens)])
            last = torch.tensor(lens).cumsum(0) - 1
            token = self._head(x[last]).argmax(-1)
        return DecodeState(cache, token, sum(lens))

    @torch.inference_mode()
    def decode_step(self, state: DecodeState, advance: bool = True) -> torch.Tensor:
        """Feed state.token (one per row) and return the greedy next tokens [batch]. advance=False
        leaves the state as it was (the step's cache rows are written again by the next step): a
        step that can be repeated, for benchmarks."""
        before = state.cache.seqlens.clone()
        if bool((before >= state.cache.capacity).any()):
            raise pk.ContractError(f"decode_step: the cache is full ({before.tolist()} tokens of "
                                   f"{state.cache.capacity.tolist()}). Fix: prefill with a larger max_new_tokens")
        with pk.use_backend(self.backend, **self.options):
            token = self._head(self._step(state.cache, [t.view(1) for t in state.token])).argmax(-1)
        if advance:
            state.token = token
        else:
            state.cache.seqlens.copy_(before)
        return token

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                 lengths: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """Greedy decoding: LongTensor [batch, max_new_tokens] of new token ids after each row's prompt
        (rows right-padded to `lengths`). Timings of the call land in `last_timings`."""
        t0 = time.perf_counter()
        state = self.prefill(input_ids, max_new_tokens, lengths)
        prefill = time.perf_counter() - t0
        new = torch.zeros(input_ids.shape[0], max_new_tokens, dtype=torch.long)
        steps: list[float] = []
        for s in range(max_new_tokens):
            new[:, s] = state.token
            if s + 1 == max_new_tokens:
                break
            t0 = time.perf_counter()
            self.decode_step(state)
            steps.append(time.perf_counter() - t0)
        self.last_timings = {"prefill_s": prefill, "prefill_tokens": state.prompt_tokens, "decode_step_s": steps,
                             "batch": input_ids.shape[0]}
        return new


#: workers the paged indexer schedule is split for (get_paged_mqa_logits_metadata's num_sms)
INDEXER_SCHEDULE_WORKERS = 8


@attrs.frozen
class _Step:
    """Where one forward step's tokens go: counts per sequence, the padded query width s_q, each
    sequence's length before the step, and per token its sequence, position and padded row."""

    counts: list[int]
    s_q: int
    starts: torch.Tensor
    batch: torch.Tensor
    positions: torch.Tensor
    slot: torch.Tensor
    # DeepSeek-V3.2's per-step plan (DeepseekV3._sparse_plan), None for V3
    visible: torch.Tensor | None = None
    key_offsets: torch.Tensor | None = None
    index_lens: torch.Tensor | None = None
    index_meta: torch.Tensor | None = None
    sparse_meta: tuple | None = None

    @property
    def fresh(self) -> bool:
        return not bool(self.starts.any())


@attrs.define
class DecodeState:
    """A batch being decoded: its cache and each row's next input token (DeepseekV3.prefill)."""

    cache: PagedLatentCache
    token: torch.Tensor  # int64 [batch]
    prompt_tokens: int


def load(path: str | Path, backend: str = "cpu", kv_cache: str = "bf16", *, options: dict[str, Any] | None = None,
         requantize_to_ue8m0: bool = False, progress: Callable[[int, int], None] | None = None,
         ep_group: Any = None) -> DeepseekV3:
    """Read a DeepSeek-V3 FP8 checkpoint directory shard by shard, prepare every weight once for
    `backend` ('cpu', 'nvidia:arch=sm90', 'ascend:soc=950', ...; on CPU tensors a non-cpu backend
    runs in emulation), and return the model. `kv_cache`: 'bf16' or 'fp8' (FlashMLA's 656-byte rows).
    `ep_group`: a torch.distributed group to run the routed experts expert-parallel over (every rank
    calls load and then the same logits / generate calls; models.deepseek.ep)."""
    if kv_cache not in KV_CACHE_KINDS:
        raise UnsupportedConfigError(f"kv_cache is {kv_cache!r}; expected one of {KV_CACHE_KINDS}. "
                                     "Fix: pass kv_cache='bf16' or 'fp8'")
    name, opts = parse_backend(backend)
    opts.update(options or {})
    t0 = time.perf_counter()
    cfg = load_config(path)
    specs = expected_tensors(cfg)
    files = index_checkpoint(path, cfg)
    report = LoadReport(checkpoint_bytes=files.nbytes, skipped_tensors=len(files.skipped))
    weights = _Weights(requantize_to_ue8m0, report)
    needed: dict[int | None, int] = defaultdict(int)
    for n, spec in specs.items():
        needed[_owner(n)] += 2 if spec.kind == "fp8" else 1
    raw: dict[int | None, dict[str, torch.Tensor]] = defaultdict(dict)
    received: dict[int | None, int] = defaultdict(int)
    stacks = _ExpertStacks(cfg)
    ep = None if ep_group is None else ExpertParallel.create(ep_group, cfg.n_routed_experts, cfg.hidden_size)
    layers: dict[int, Layer] = {}
    total, seen = sum(needed.values()), 0
    with pk.use_backend(name, **opts):
        for tensor_name, tensor in read_shards(files, specs):
            owner = _owner(tensor_name)
            if not stacks.take(tensor_name, tensor):
                raw[owner][tensor_name] = tensor
            del tensor  # an expert's tensor lives on only in its stack
            received[owner] += 1
            seen += 1
            if progress is not None:
                progress(seen, total)
            if owner is not None and received[owner] == needed[owner]:
                layers[owner] = _build_layer(cfg, owner, raw.pop(owner, {}), weights, stacks, ep)
        top = raw.pop(None)
        embed = weights.plain(top["model.embed_tokens.weight"], torch.bfloat16)
        norm = weights.plain(top["model.norm.weight"])
        lm_head = weights.plain(top["lm_head.weight"], torch.bfloat16)
    report.seconds = time.perf_counter() - t0
    return DeepseekV3(cfg, embed, [layers[i] for i in range(cfg.num_hidden_layers)], norm, lm_head, name, opts,
                      kv_cache, report)
