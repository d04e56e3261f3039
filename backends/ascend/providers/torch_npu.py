"""Registers the ascend backend's "torch_npu" providers: each op family's inputs value mapped onto the
CANN operator torch_npu documents for it (docs/ascend.md), per chip.

Every provider declines, with the reason, when torch_npu is missing (`runtime.native_unavailable_reason`),
when the call's chip lacks the operator, and on CPU tensors unless a test stand-in is active (real
torch_npu operators take NPU tensors; CPU tensors run the layout-reference oracle in emulation). The
chip is the `soc` option (use_backend / prepared operands), else the detected device, else 950.
Ops with no CANN mapping get a provider that always declines with the reason, so `doctor` and
NoKernelError say why and the layout-reference oracle runs.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from portable_kernels.core.checks import checks_values
from portable_kernels.core.errors import BackendUnavailableError
from portable_kernels.ops.attention.decode import reject_bad_cache_references
from portable_kernels.layouts import (ASCEND_BF16_KV, ASCEND_FP8_KV, ASCEND_BF16_VALUES, ASCEND_BF16_VALUES_NZ, ASCEND_FP32_VALUES, ASCEND_MX_KMAJOR, PLAIN,
                                      ascend_mx_kmajor_encode_from_blocks)
from portable_kernels.ops.quant.fp8 import nonfinite_ue8m0_error
from portable_kernels.core.registry import Registry, forced_backend
from portable_kernels.core.tensors import PreparedTensor
from portable_kernels.ops.topk import reject_nan

from .. import chips, limits as doc
from ..vendor import gemm as npu_gemm, grouped as npu_grouped, mla as npu_mla, moe as npu_moe, quant as npu_quant, topk as npu_topk, runtime
from ..vendor import indexer as npu_indexer

PROVIDER = "torch_npu"
PRIORITY = 10
A2A3 = ("910b", "910c")
#: head counts of the MLA kernels: FIA MLA约束 D = 512 and SFA 约束说明 (A2/A3: 1/2/4/8/16/32/64/128), SFA
#: 约束说明 Ascend 950 (1~128), KV-quant SFA 参数说明 query (1/2/4/8/16/32/48/64/128; 约束说明: A2/A3 not 48)
HEADS = {"a2a3": npu_mla.A2A3_MLA_HEADS, "950-sfa": tuple(range(1, 129)),
         "950-kvq": (1, 2, 4, 8, 16, 32, 48, 64, 128)}

#: ops with no CANN mapping, and why (docs/ascend.md): the backend's `not_mapped`, quoted by doctor
#: and NoKernelError; the layout-reference oracle runs them
NOT_MAPPED = {
    "fp8_fp4_gemm_nt": "npu_quant_matmul's MX A8W4 mode exists (aclnnQuantMatmulV5), but the packed "
                       "float4_e2m1fn_x2 x2 shape torch_npu expects and its nibble order are not documented",
    "per_block_cast_to_fp8": "no documented CANN op quantizes 128x128 blocks (npu_dynamic_block_mx_quant is 32x32)",
    "per_token_cast_to_fp4": "npu_dynamic_mx_quant's FP4 exponent rule (floor(log2 amax) - 2) is not the contract's "
                             "ceil_pow2(amax / 6)",
    "swiglu_forward_and_per_token_cast": "no torch_npu op checked against this contract",
    "get_mla_metadata": "CANN's attention ops schedule internally: there is no metadata to compute",
    "get_fused_mapping": "npu_moe_init_routing_v2 builds a dropless, unaligned expert-sorted layout and rejects "
                         "negative expert ids; the contract is DeepGEMM's aligned contiguous layout",
    "expand_to_fused": "npu_moe_init_routing_v2 gathers into its own unaligned layout, not the contract's",
    "expand_to_fused_with_sf": "npu_moe_init_routing_v2 gathers into its own unaligned layout, not the contract's",
    "reduce_fused": "npu_moe_finalize_routing (Atlas A2 only) has no -1 slots and another row order",
    "normalize_weight": "no CANN operator for it (a division by the row sum)",
    "get_dispatch_layout": "the HCCL dispatch ops (npu_moe_distribute_*) compute it internally; not mapped",
    # TileKernels' ops (portable_kernels.tile_kernels): none checked against a CANN operator yet
    "block_cast": "npu_dynamic_quant / npu_dynamic_mx_quant compute data as x / scale with their own scale rules, "
                  "not TileKernels' x * (max / amax) with its amax floors",
    "per_token_cast_to_e5m6": "no CANN operator for TileKernels' 12-bit E5M6 packing",
    "per_block_cast_lossless": "no CANN operator recasts E2M1 with UE8M0 scales to E4M3 by TileKernels' "
                               "scale rule (largest input scale / 2^6 per output block)",
    "swiglu_backward_and_per_token_cast": "no torch_npu op checked against this contract (SwiGLU backward with "
                                          "router weights, clamp and TileKernels' FP8 cast of the gradient)",
    "swiglu_forward": "no torch_npu op checked against this contract (fp32 SwiGLU with row weights and clamp counts)",
    # TileKernels' mHC ops (ops/mhc): CANN has no hyper-connection operators; the oracle runs the reference on the NPU
    **{f"mhc_{name}{kind}": "no CANN operator for TileKernels' mHC " + what + " (the oracle runs the reference)"
       for name, what in (("expand", "stream expansion"), ("sinkhorn", "Sinkhorn normalization"),
                          ("pre_split_mixes", "mix split"), ("head_compute_mix", "head mix"),
                          ("pre_apply_mix", "stream mix"), ("post", "residual update"),
                          ("pre_norm_fn", "RMS-normalized projection"))
       for kind in ("", "_backward")},
    "topk_gate": "no torch_npu op documented to rank ties to the smaller index",
    "topk_sum_and_topk_group_idx": "npu_moe_gating_top_k selects groups only inside its full gate",
    "group_count": "no CANN operator for it (a bincount)",
    "aux_fi": "no CANN operator for it (a bincount and one division)",
    "mask_indices_by_tp": "no CANN operator for it (integer arithmetic on expert ids)",
    "inplace_unique_group_indices": "no CANN operator for it",
    "map_to_physical_experts": "no CANN operator for it (a table lookup with TileKernels' replica hash)",
    # the contracts added for drop-in parity (issue 11); none has been mapped or checked against CANN yet
    **{f"{kind}_gemm_{layout}": "not mapped yet: torch_npu's matmuls take transposed views, but no mapping of the "
                                "MN-major operands has been written or checked against CANN's docs"
       for kind in ("fp8", "bf16") for layout in ("nn", "tn", "tt")},
    "per_channel_cast_to_fp8": "no documented CANN op quantizes (gran_k x 1) column blocks with the contract's "
                               "1e-4 amax floor",
    "m_grouped_fp8_fp4_gemm_nt_contiguous": "npu_grouped_matmul's MX A8W4 mode: the packed float4_e2m1fn_x2 weight "
                                            "shape and nibble order are not documented",
    "m_grouped_fp8_fp4_gemm_nt_masked": "npu_grouped_matmul's MX A8W4 mode: the packed float4_e2m1fn_x2 weight "
                                        "shape and nibble order are not documented",
    **{op: "npu_grouped_matmul has a K-grouped mode (group_type=2), but its per-group FP8 scale layout is not "
           "documented; not mapped" for op in ("k_grouped_fp8_gemm_tn_contiguous", "k_grouped_fp8_gemm_nt_contiguous")},
    "k_grouped_bf16_gemm_tn_contiguous": "npu_grouped_matmul's K-grouped mode (group_type=2) has not been mapped or "
                                         "checked against this contract yet",
    "flash_mla_sparse_fwd": "npu_sparse_flash_attention serves sparse prefill, but its max_logits output and "
                            "attn_sink have not been mapped or checked against this contract yet",
    "tf32_hc_prenorm_gemm": "no torch_npu op checked against this contract (A·Bᵀ in TF32 with the per-row sum of "
                            "squares of each K split); not mapped yet",
    "flash_attn_varlen_func": "npu_fusion_attention takes varlen sequences, but the mapping (actual_seq_lengths, "
                              "the bottom-right causal mask) has not been written or checked yet",
}
#: the expert-parallel simulations (simulate_*) are single-process contracts without a device kernel
#: anywhere; the ascend backend registers nothing for them, like the other backends


# -- shared checks ---------------------------------------------------------------------------------------

def call_chip(inputs: Any) -> chips.Chip:
    """The chip a call runs for: the forced `soc` option, else a prepared operand's, else the detected
    device's, else 950 (what selection keys on: the forced options and the operands' signatures)."""
    forced = forced_backend()
    if forced is not None and forced[0] == "ascend" and "soc" in forced[1]:
        return forced[1]["soc"]
    for value in inputs.operands().values():
        if isinstance(value, PreparedTensor):
            soc = dict(value.params).get("soc")
            if soc is not None:
                return soc
    return runtime.detected_chip() or chips.DEFAULT_CHIP


def _native_reasons(inputs: Any) -> list[str]:
    reason = runtime.native_unavailable_reason()
    if reason is not None:
        return [reason]
    if inputs.device.type != "npu" and not runtime.using_stand_in():
        return [f"torch_npu operators take NPU tensors; these are on {inputs.device.type} (emulation runs the "
                "layout-reference oracle)"]
    return []


def _on(chips_: Iterable[str], what: str, extra: Callable[[Any], Iterable[str]] | None = None):
    """A check: torch_npu present, the call's chip in `chips_`, plus `extra` reasons."""
    allowed = tuple(chips_)

    def check(inputs: Any) -> list[str]:
        reasons = _native_reasons(inputs)
        chip = call_chip(inputs)
        if chip not in allowed:
            reasons.append(f"{what} is documented for {'/'.join(allowed)}, not {chip}")
        if extra is not None:
            reasons.extend(extra(inputs))
        return reasons
    return check


def _npu() -> Any:
    npu = runtime.torch_npu()
    if npu is None:  # selection checked this; reaching here means torch_npu vanished mid-run
        raise BackendUnavailableError(runtime.native_unavailable_reason() or "torch_npu is unavailable")
    return npu


# -- GEMM ---------------------------------------------------------------------------------------------------

def _gran(p: Any) -> tuple[int, int] | None:
    return tuple(p.granularity) if isinstance(p, PreparedTensor) else None


def _gb_granularity(inputs: Any) -> list[str]:
    a, b = _gran(inputs.a), _gran(inputs.b)
    if (a, b) != ((1, 128), (128, 128)):
        return [f"npu_quant_matmul's G-B mode takes (1, 128) x (128, 128) scales, got {a} x {b}"]
    return []


def _mx_gemm(call: Any) -> None:
    npu_gemm.mx_fp8_gemm_nt(_npu(), call.a.data, call.a.scale, call.b.data, call.b.scale, call.d, call.c)


def _gb_gemm(call: Any) -> None:
    npu_gemm.gb_fp8_gemm_nt(_npu(), call.a.data, call.a.scale, call.b.data, call.b.scale, call.d, call.c)


def _exact_bf16(inputs: Any) -> list[str]:
    """bf16 weight values need an activation that is exact in bf16 too (power-of-two scales)."""
    a, b = inputs.a, inputs.b
    reasons = []
    if a.granularity[0] != 1:
        reasons.append(f"activation scales must be per row (1, gran_k), got {a.granularity}")
    if b.format in (ASCEND_BF16_VALUES, ASCEND_BF16_VALUES_NZ) and not a.ue8m0:
        reasons.append("the activation's scales are not powers of two, so its bf16 values would round; quantize "
                       "it with use_ue8m0=True, or prepare the weights with scales='fp32'")
    return reasons


def _dequantized_gemm(call: Any) -> None:
    _npu()  # the matmul is torch_npu's: fail clearly if torch_npu vanished
    npu_gemm.dequantized_fp8_gemm_nt(call.a.data, call.a.scale, call.a.granularity[1], call.b.data, call.d,
                                     call.c, a_scales_pow2=call.b.data.dtype == torch.bfloat16)


def _bf16_gemm(call: Any) -> None:
    _npu()
    npu_gemm.bf16_gemm_nt(call.a, call.b, call.d, call.c)


def _register_gemm(registry: Registry) -> None:
    kernel = registry.kernel
    kernel("fp8_gemm_nt", "ascend", PROVIDER + "-mx", priority=PRIORITY,
           formats={"a": (ASCEND_MX_KMAJOR,), "b": (ASCEND_MX_KMAJOR,)}, dtypes={"d": (torch.bfloat16, torch.float32)},
           devices=("npu", "cpu"),  # no K / N bound: doc.UNBOUNDED (the 65535 is an A2/A3 page's)
           check=_on(("950",), "npu_quant_matmul's MX mode"),
           doc="npu_quant_matmul MX (group_sizes [1,1,32], e8m0 K-major pairs; Ascend 950; K, N: no documented "
               "bound)")(_mx_gemm)
    kernel("fp8_gemm_nt", "ascend", PROVIDER + "-gb", priority=PRIORITY,
           formats={"a": (PLAIN,), "b": (PLAIN,)}, dtypes={"d": (torch.bfloat16, torch.float32)},
           devices=("npu", "cpu"),  # no K / N bound: doc.UNBOUNDED
           check=_on(("950",), "npu_quant_matmul's G-B mode", _gb_granularity),
           shape_class=lambda i: (_gran(i.a), _gran(i.b)),
           doc="npu_quant_matmul G-B (group_sizes [1,128,128], fp32 scales as quantized; Ascend 950)")(_gb_gemm)
    kernel("fp8_gemm_nt", "ascend", PROVIDER + "-dequantized", priority=PRIORITY,
           formats={"a": (PLAIN,), "b": (ASCEND_BF16_VALUES_NZ, ASCEND_BF16_VALUES, ASCEND_FP32_VALUES)},
           dtypes={"d": (torch.bfloat16, torch.float32)}, devices=("npu", "cpu"),
           check=_on(A2A3, "the dequantized-weight matmul", _exact_bf16),
           shape_class=lambda i: (_gran(i.a), i.a.ue8m0),
           doc="weights dequantized once at ingest (bf16 exact / fp32), torch_npu matmul (Atlas A2/A3)"
           )(_dequantized_gemm)
    kernel("bf16_gemm_nt", "ascend", PROVIDER, priority=PRIORITY, devices=("npu", "cpu"),
           check=_on(chips.CHIPS, "torch_npu's matmul"), doc="torch_npu's matmul (aclnnMatmul)")(_bf16_gemm)


# -- grouped GEMM -------------------------------------------------------------------------------------------

def _contiguous_groups(call: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if call.use_psum_layout:
        return npu_grouped.psum_group_ends(call.grouped_layout, call.alignment, call.d.shape[0])
    return npu_grouped.contiguous_group_ends(call.grouped_layout, call.b.shape[0])


def _masked_groups(call: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return npu_grouped.masked_group_ends(call.masked_m, call.d.shape[1])


def _rows_of_d(call: Any) -> torch.Tensor:
    """d as [rows, N] for both layouts (masked [G, max_m, N] is viewed as [G·max_m, N])."""
    return call.d.view(-1, call.d.shape[-1])


def _rows2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _grouped(groups: Callable[[Any], tuple[torch.Tensor, torch.Tensor]], kind: str) -> Callable[[Any], None]:
    def run(call: Any) -> None:
        npu = _npu()
        ends, valid = groups(call)
        d = _rows_of_d(call)
        a, b = call.a, call.b
        if kind == "bf16":
            npu_grouped.bf16_grouped_gemm(npu, _rows2d(a), b, d, ends, valid)
        elif kind == "mx":
            npu_grouped.mx_grouped_gemm(npu, _rows2d(a.data), a.scale.reshape(-1, *a.scale.shape[-2:]), b.data,
                                        b.scale, d, ends, valid)
        else:  # dequantized weights (A2/A3)
            values = npu_gemm.dequantize_rows(_rows2d(a.data), _rows2d(a.scale), a.granularity[1]) \
                if b.data.dtype == torch.bfloat16 else None
            if values is None:
                k = a.data.shape[-1]
                values = _rows2d(a.data).float() * _rows2d(a.scale).repeat_interleave(a.granularity[1], -1)[:, :k]
            npu_grouped.dequantized_grouped_gemm(npu, values, b.data, d, ends, valid)
    return run


def _register_grouped(registry: Registry) -> None:
    a2a3_limits = (doc.GMM_A2A3_GROUPS, doc.GMM_A2A3_INNER)  # the 950 has none documented (doc.UNBOUNDED)
    for layout, groups in (("contiguous", _contiguous_groups), ("masked", _masked_groups)):
        fp8_op, bf16_op = f"m_grouped_fp8_gemm_nt_{layout}", f"m_grouped_bf16_gemm_nt_{layout}"
        registry.kernel(fp8_op, "ascend", PROVIDER + "-mx", priority=PRIORITY,
                        formats={"a": (ASCEND_MX_KMAJOR,), "b": (ASCEND_MX_KMAJOR,)},
                        dtypes={"d": (torch.bfloat16, torch.float32)}, devices=("npu", "cpu"),
                        check=_on(("950",), "npu_grouped_matmul with MX scales (aclnnGroupedMatmulV5)"),
                        doc="npu_grouped_matmul MX (e8m0 K-major pairs, bf16 / fp32 out; Ascend 950: "
                            "aclnnGroupedMatmulV5, no torch_npu page)")(_grouped(groups, "mx"))
        registry.kernel(fp8_op, "ascend", PROVIDER + "-dequantized", priority=PRIORITY,
                        formats={"a": (PLAIN,), "b": (ASCEND_BF16_VALUES_NZ, ASCEND_BF16_VALUES, ASCEND_FP32_VALUES)},
                        dtypes={"d": (torch.bfloat16,)}, devices=("npu", "cpu"), limits=a2a3_limits,
                        check=_on(A2A3, "npu_grouped_matmul on dequantized weights", _exact_bf16),
                        shape_class=lambda i: (_gran(i.a), i.a.ue8m0),
                        doc="npu_grouped_matmul bf16 / fp32 on weights dequantized at ingest (Atlas A2/A3)"
                        )(_grouped(groups, "dequantized"))
        registry.kernel(bf16_op, "ascend", PROVIDER, priority=PRIORITY, dtypes={"d": (torch.bfloat16,)},
                        devices=("npu", "cpu"), limits=a2a3_limits,
                        check=_on(A2A3, "npu_grouped_matmul bf16"),
                        doc="npu_grouped_matmul bf16 (group_list cumulative ends; Atlas A2/A3)")(_grouped(groups, "bf16"))
        registry.kernel(bf16_op, "ascend", PROVIDER + "-950", priority=PRIORITY, dtypes={"d": (torch.bfloat16,)},
                        devices=("npu", "cpu"),
                        check=_on(("950",), "npu_grouped_matmul bf16 (aclnnGroupedMatmulV5 非量化)"),
                        doc="npu_grouped_matmul bf16 (Ascend 950: aclnnGroupedMatmulV5, no torch_npu page; no "
                            "documented G / K / N bound)")(_grouped(groups, "bf16"))


# -- casts --------------------------------------------------------------------------------------------------

def _cast_reasons(inputs: Any) -> list[str]:
    gm, gk = inputs.granularity
    reasons = []
    if not inputs.use_ue8m0:
        reasons.append("npu_dynamic_mx_quant emits power-of-two scales only; fp32 scales (use_ue8m0=False) have no "
                       "exact CANN op (npu_dynamic_quant is per row without the 1e-4 amax floor)")
    if gm != 1 or gk % npu_quant.MX_BLOCK_MULTIPLE or gk > npu_quant.MX_BLOCK_MAX:
        reasons.append(f"npu_dynamic_mx_quant takes blocks (1, 32·n <= 1024), got {inputs.granularity}")
    k = inputs.x.shape[-1]
    if inputs.x.dtype == torch.float32 and (gk != doc.MX_QUANT_FP32_BLOCK or k < doc.MX_QUANT_FP32_MIN_AXIS):
        reasons.append(f"npu_dynamic_mx_quant on a float32 x takes blocks of {doc.MX_QUANT_FP32_BLOCK} along a "
                       f"quantized axis of at least {doc.MX_QUANT_FP32_MIN_AXIS}, got gran_k {gk} and K {k} "
                       f"(documented: {doc.MX_QUANT_FP32_SOURCE})")
    npu = runtime.torch_npu()
    if npu is not None and not runtime.has_argument(npu, "npu_dynamic_mx_quant", "max_low_bound"):
        reasons.append("this torch_npu's npu_dynamic_mx_quant has no max_low_bound (added after 26.1.0): blocks with "
                       "amax < 1e-4 would get another scale than the contract's")
    return reasons


def _mx_cast(call: Any) -> tuple[torch.Tensor, torch.Tensor]:
    npu = _npu()
    gk = call.granularity[1]
    k = call.x.shape[-1]
    data, pairs = npu_quant.mx_cast_pairs(npu, call.x, gk)
    if checks_values(pairs) and bool((pairs.view(torch.uint8) == npu_quant.E8M0_NAN).any()):
        raise nonfinite_ue8m0_error("per_token_cast_to_fp8")  # a NaN/Inf block has no UE8M0 scale
    scale = npu_quant.pairs_to_fp32(pairs, -(-k // gk))
    if call.out_format is ASCEND_MX_KMAJOR:
        return data, ascend_mx_kmajor_encode_from_blocks(scale, call.x.shape[-2], k, block_mn=1, block_k=gk)
    return data, scale


def _register_casts(registry: Registry) -> None:
    registry.kernel("per_token_cast_to_fp8", "ascend", PROVIDER + "-mx", priority=PRIORITY,
                    formats={"out_format": (PLAIN, ASCEND_MX_KMAJOR)}, devices=("npu", "cpu"),
                    check=_on(("950",), "npu_dynamic_mx_quant", _cast_reasons),
                    shape_class=lambda i: (tuple(i.granularity), i.x.shape[-1] >= doc.MX_QUANT_FP32_MIN_AXIS),
                    doc="npu_dynamic_mx_quant(scale_alg=1, max_low_bound=1e-4) (Ascend 950; fp32 x: gran_k 32, "
                        "K >= 32)")(_mx_cast)


# -- top-k, gate ----------------------------------------------------------------------------------------------

def _topk(call: Any) -> Any:
    _npu()
    reject_nan(call.input, call.end)  # the contract's NaN rule, checked in the provider's pass
    return npu_topk.topk_select(call.input, call.topk, call.end, call.sorted, call.sorted_index, call.indices_type,
                                call.idx_oob_fill_value, call.value_oob_fill_value, call.return_value)


def _gate_reasons(inputs: Any) -> list[str]:
    reasons = []
    if inputs.scoring_func != "sigmoid":
        reasons.append(f"npu_moe_gating_top_k scores with sigmoid or softmax, not {inputs.scoring_func}")
    if not inputs.normalize:
        reasons.append("npu_moe_gating_top_k always normalizes the weights (normalize=False is not expressible)")
    if inputs.fix_routing_mask is not None:
        reasons.append("npu_moe_gating_top_k chooses every token's experts (fixed routing is not expressible)")
    limit = npu_moe.gate_limits_reason(inputs.logits.shape[1], inputs.num_groups)
    if limit is not None:
        reasons.append(limit)
    return reasons


def _gate(call: Any) -> Any:
    return npu_moe.sigmoid_top2_sum_gate(_npu(), call.logits, call.bias, call.num_topk, call.num_topk_groups,
                                         call.num_groups, call.routed_scaling_factor, call.mask)


def _register_selection(registry: Registry) -> None:
    registry.kernel("topk", "ascend", PROVIDER, priority=PRIORITY, devices=("npu", "cpu"),
                    check=_on(chips.CHIPS, "torch.topk (aclnnTopk)"),
                    doc="torch_npu's torch.topk (aclnnTopk) + end/fill/order rules; npu_top_k_top_p is a "
                        "sampling filter, not a selection")(_topk)
    registry.kernel("top2_sum_gate", "ascend", PROVIDER, priority=PRIORITY, devices=("npu", "cpu"),
                    check=_on(A2A3, "npu_moe_gating_top_k", _gate_reasons),
                    shape_class=lambda i: (i.logits.shape[1], i.num_groups),
                    doc="npu_moe_gating_top_k (sigmoid, top-2-sum groups; Atlas A2/A3)")(_gate)


# -- MLA ---------------------------------------------------------------------------------------------------------

def _heads(key: str) -> Callable[[Any], list[str]]:
    allowed = HEADS[key]

    def check(inputs: Any) -> list[str]:
        h_q = inputs.q.shape[2]
        return [] if h_q in allowed else [f"the CANN MLA kernel takes {list(allowed)} query heads, got {h_q}"]
    return check


def _both(*checks: Callable[[Any], Iterable[str]]) -> Callable[[Any], list[str]]:
    return lambda inputs: [r for c in checks for r in c(inputs)]


def _dense_only(inputs: Any) -> list[str]:
    return [] if inputs.indices is None else ["this provider decodes dense calls (indices is None)"]


def _sparse_only(inputs: Any) -> list[str]:
    return [] if inputs.indices is not None else ["this provider decodes sparse calls (indices given)"]


def _fp8_cache(inputs: Any) -> list[str]:
    return [] if inputs.is_fp8_kvcache else ["this provider reads the FP8 656-byte cache"]


def _cann_rows(inputs: Any) -> list[str]:
    if inputs.k_cache_format is ASCEND_FP8_KV:
        return []
    return [f"this provider reads the FP8 cache in CANN's row order ({ASCEND_FP8_KV.name}), not "
            f"{getattr(inputs.k_cache_format, 'name', None)}"]


def _bf16_rows(inputs: Any) -> list[str]:
    """A2/A3's bf16 ops read bf16 rows: a bf16 cache, or the FP8 cache stored as its values."""
    fmt = inputs.k_cache_format
    if fmt is None or fmt is ASCEND_BF16_KV:
        return []
    return [f"this provider reads bf16 rows (a bf16 cache or {ASCEND_BF16_KV.name}), not a {fmt.name} cache"]


def _bf16_cache(inputs: Any) -> list[str]:
    return [] if not inputs.is_fp8_kvcache else ["this provider reads a bf16 cache"]


def _mla(kind: str) -> Callable[[Any], None]:
    def run(call: Any) -> None:
        reject_bad_cache_references(call)  # before anything reads the cache (the contract's rule)
        if call.out.numel() == 0:
            return
        npu = _npu()
        args = (call.q, call.k_cache)
        fmt = call.k_cache_format  # the cache's Format, as the op delivered it (None: a bf16 cache)
        if kind == "fia":
            npu_mla.dense_decode_fused_infer(npu, *args, call.block_table, call.cache_seqlens, call.softmax_scale,
                                             call.causal, call.out, call.lse, cache_format=fmt)
        elif call.indices is not None:
            npu_mla.sparse_decode(npu, *args, call.indices, call.softmax_scale, call.out, call.lse,
                                  fp8_op=kind == "kvq", cache_format=fmt)
        else:
            npu_mla.dense_decode_as_sparse(npu, *args, call.block_table, call.cache_seqlens, call.softmax_scale,
                                           call.causal, call.out, call.lse, fp8_op=kind == "kvq", cache_format=fmt)
    return run


def _register_mla(registry: Registry) -> None:
    fia_limits = (doc.FIA_MLA_D, doc.FIA_MLA_KV_HEADS)
    sfa_limits = (doc.SFA_D, doc.SFA_KV_HEADS)
    kvq_limits = (doc.KVQ_SFA_D, doc.KVQ_SFA_KV_HEADS)
    heads_class = lambda i: i.q.shape[2]  # noqa: E731 - the shape the head checks look at
    kernel = registry.kernel
    kernel("flash_mla_with_kvcache", "ascend", PROVIDER + "-fia", priority=PRIORITY, devices=("npu", "cpu"),
           limits=fia_limits, check=_on(A2A3, "npu_fused_infer_attention_score", _both(_dense_only, _bf16_rows, _heads("a2a3"))),
           shape_class=heads_class,
           doc="npu_fused_infer_attention_score MLA/TND, dense (Atlas A2/A3; the FP8 cache stored as its bf16 values, "
               "ASCEND_BF16_KV; lse from torch ops: the doc excludes softmax_lse for D = 512)")(_mla("fia"))
    kernel("flash_mla_with_kvcache", "ascend", PROVIDER + "-sfa", priority=PRIORITY, devices=("npu", "cpu"),
           limits=sfa_limits,
           check=_on(A2A3, "npu_sparse_flash_attention", _both(_sparse_only, _bf16_rows, _heads("a2a3"))),
           shape_class=heads_class,
           doc="npu_sparse_flash_attention MLA-absorb, sparse (Atlas A2/A3; the FP8 cache stored as its bf16 values, "
               "ASCEND_BF16_KV)")(_mla("sfa"))
    kernel("flash_mla_with_kvcache", "ascend", PROVIDER + "-kvquant-sfa", priority=PRIORITY, devices=("npu", "cpu"),
           limits=kvq_limits,
           check=_on(("950",), "npu_kv_quant_sparse_flash_attention with float8_e4m3fn keys",
                     _both(_fp8_cache, _cann_rows, _heads("950-kvq"))),
           shape_class=heads_class,
           doc="npu_kv_quant_sparse_flash_attention on CANN-order 656-byte rows, sparse and dense (Ascend 950)"
           )(_mla("kvq"))
    kernel("flash_mla_with_kvcache", "ascend", PROVIDER + "-sfa-950", priority=PRIORITY, devices=("npu", "cpu"),
           limits=sfa_limits,
           check=_on(("950",), "npu_sparse_flash_attention", _both(_bf16_cache, _heads("950-sfa"))),
           shape_class=heads_class,
           doc="npu_sparse_flash_attention over every position, dense bf16 (Ascend 950)")(_mla("sfa"))


# -- lightning indexer ------------------------------------------------------------------------------------------

def _indexer(kind: str) -> Callable[[Any], None]:
    def run(call: Any) -> None:
        _npu()  # the matmuls are torch_npu's: fail clearly if torch_npu vanished
        native_fp8 = call_chip(call) == "950"
        (npu_indexer.mqa_logits if kind == "mqa" else npu_indexer.paged_mqa_logits)(call, native_fp8)
    return run


def _register_indexer(registry: Registry) -> None:
    # no CANN op returns the logits (npu_(quant_)lightning_indexer fuse the top-k): torch ops on the NPU
    doc = ("FP8 (or FP4) -> fp32, torch_npu matmul, relu, batched matmul over heads (CANN's lightning indexer returns "
           "top-k indices only: vendor.indexer.lightning_indexer_topk)")
    for op, kind in (("fp8_mqa_logits", "mqa"), ("fp8_paged_mqa_logits", "paged")):
        registry.kernel(op, "ascend", PROVIDER, priority=PRIORITY, devices=("npu", "cpu"),
                        check=_on(chips.CHIPS, "torch_npu's matmul"), doc=doc)(_indexer(kind))


# -- not mapped ------------------------------------------------------------------------------------------------

def register(registry: Registry) -> None:
    """Register every torch_npu provider of the ascend backend."""
    _register_gemm(registry)
    _register_grouped(registry)
    _register_casts(registry)
    _register_selection(registry)
    _register_mla(registry)
    _register_indexer(registry)
