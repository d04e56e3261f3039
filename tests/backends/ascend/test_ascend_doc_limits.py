"""The ascend providers' limits are the CANN / torch_npu docs' own (backends/ascend/limits.py): for each
one, a call the doc allows is accepted and one it forbids is declined with the reason and the page,
by the provider and by the stand-in alike. Stand-in only; nothing here ran on an NPU."""

import pytest
import torch

import portable_kernels as pk
from ascend_stub import StandInError, make_stand_in
from portable_kernels.backends.ascend import limits as doc
from portable_kernels.backends.ascend.vendor import gemm as npu_gemm, grouped as npu_grouped, runtime
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.core.registry import registry
from portable_kernels.layouts import ASCEND_MX_KMAJOR, PLAIN, ascend_mx_kmajor_encode_from_blocks, contiguous_m_indices
from portable_kernels.ops.gemm.grouped import ContiguousGroupedInputs
from portable_kernels.ops.quant.fp8 import CastInputs, per_block_cast_to_fp8, per_token_cast_to_fp8
from portable_kernels.testing.generators import poison, randn


def _provider(op: str, name: str):
    return next(p for p in registry().providers(op, "ascend") if p.name == name)


def _reasons(op: str, name: str, inputs, soc: str) -> list[str]:
    with runtime.use_stand_in(make_stand_in(soc)), pk.use_backend("ascend", soc=soc):
        return _provider(op, name).not_supported_reasons(inputs)


def test_every_ascend_provider_limit_carries_its_doc_citation():
    limits = [(p.op, p.name, lim) for op in registry().ops("ascend") for p in registry().providers(op, "ascend")
              for lim in p.limits]
    assert limits, "the ascend providers declare limits"
    for op, name, lim in limits:
        assert isinstance(lim, doc.CitedLimit) and lim.source, (op, name, lim)
        assert ".md" in lim.source and lim.source in str(lim)


def test_every_unbounded_size_names_the_page_that_was_read():
    assert doc.UNBOUNDED and all(".md" in u.source for u in doc.UNBOUNDED)


# -- npu_quant_matmul: no K / N bound on the 950 ---------------------------------------------------------

def test_mx_gemm_on_950_takes_k_past_65535():
    """aclnnQuantMatmulV5's 950 constraints state no k / n bound; 65535 is an A2/A3 page's."""
    m, n, k = 2, 3, 65600
    a = per_token_cast_to_fp8(randn(m, k, seed=1, dtype=torch.bfloat16), use_ue8m0=True)
    b = per_block_cast_to_fp8(randn(n, k, seed=2, dtype=torch.bfloat16, scale=k ** -0.5), use_ue8m0=True)
    npu = make_stand_in("950")
    d = poison(m, n, dtype=torch.float32)
    npu_gemm.mx_fp8_gemm_nt(npu, a.data, ascend_mx_kmajor_encode_from_blocks(a.scale, m, k, block_mn=1, block_k=128),
                            b.data, ascend_mx_kmajor_encode_from_blocks(b.scale, n, k, block_mn=128, block_k=128), d, None)
    ref = pk.dequantize(a).double() @ pk.dequantize(b).double().T
    assert pk.calc_diff(d, ref) < 1e-6
    assert not _provider("fp8_gemm_nt", "torch_npu-mx").limits and not _provider("fp8_gemm_nt", "torch_npu-gb").limits


# -- npu_grouped_matmul ---------------------------------------------------------------------------------

def _grouped_bf16(groups: int, n: int, k: int, m_per: int = 1):
    m_indices = contiguous_m_indices(torch.full((groups,), m_per), 1).int()
    m = m_indices.numel()
    a = randn(m, k, seed=3, dtype=torch.bfloat16)
    b = randn(groups, n, k, seed=4, dtype=torch.bfloat16)
    return ContiguousGroupedInputs(a, b, poison(m, n, dtype=torch.bfloat16), m_indices, False, 1, None)


@pytest.mark.parametrize("groups,n,k,declined", [
    (1024, 8, 16, None),          # 1024 groups: the A2/A3 maximum
    (1025, 8, 16, "G = 1025"),
    (1, 8, 65535, None),          # K < InnerLimit 65536
    (1, 8, 65536, "K = 65536"),
    (1, 65600, 16, None),         # N is not a last dimension of the transposed weight: no bound
])
def test_a2_a3_grouped_limits(groups, n, k, declined):
    reasons = _reasons("m_grouped_bf16_gemm_nt_contiguous", "torch_npu", _grouped_bf16(groups, n, k), "910b")
    if declined is None:
        assert reasons == []
    else:
        assert any(declined in r and "npu_grouped_matmul.md" in r for r in reasons), reasons


def test_950_grouped_has_no_documented_group_or_inner_bound():
    assert _reasons("m_grouped_bf16_gemm_nt_contiguous", "torch_npu-950", _grouped_bf16(1025, 8, 16), "950") == []
    assert _reasons("m_grouped_bf16_gemm_nt_contiguous", "torch_npu-950", _grouped_bf16(1, 8, 65536), "950") == []


def test_stand_in_grouped_group_count_is_bounded_on_a2_a3_only():
    a = randn(2, 16, seed=1, dtype=torch.bfloat16)
    b = randn(1025, 8, 16, seed=2, dtype=torch.bfloat16)
    ends = torch.full((1025,), 2, dtype=torch.int64)
    valid = torch.ones(2, dtype=torch.bool)
    d = poison(2, 8, dtype=torch.bfloat16)
    npu_grouped.bf16_grouped_gemm(make_stand_in("950"), a, b, d, ends, valid)
    assert not d.isnan().any()
    with pytest.raises(StandInError, match="1024"):
        npu_grouped.bf16_grouped_gemm(make_stand_in("910c"), a, b, d, ends, valid)


def test_stand_in_grouped_takes_a_last_group_end_below_m_and_leaves_the_rest_unwritten():
    npu = make_stand_in("910b")
    a, b = randn(6, 16, seed=5, dtype=torch.bfloat16), randn(2, 8, 16, seed=6, dtype=torch.bfloat16)
    out = npu.npu_grouped_matmul([a], [b.transpose(1, 2)], group_list=torch.tensor([2, 4]), split_item=3,
                                 group_type=0, group_list_type=0, output_dtype=torch.bfloat16)[0]
    assert not out[:4].isnan().any() and bool(out[4:].isnan().all())
    with pytest.raises(StandInError, match="<= x's rows"):
        npu.npu_grouped_matmul([a], [b.transpose(1, 2)], group_list=torch.tensor([2, 7]), split_item=3,
                               group_type=0, group_list_type=0, output_dtype=torch.bfloat16)


def test_mx_grouped_on_950_writes_fp32_d():
    """aclnnGroupedMatmulV5, Ascend 950 动态量化（MX）: out BFLOAT16 / FLOAT16 / FLOAT32."""
    m_indices = contiguous_m_indices(torch.tensor([5, 9]), 256)  # the ascend alignment (ASCEND_MOE_ALIGNMENT)
    m, n, k = m_indices.numel(), 32, 128
    x = randn(m, k, seed=7, dtype=torch.bfloat16)
    w = randn(2, n, k, seed=8, dtype=torch.bfloat16, scale=k ** -0.5)
    d = poison(m, n, dtype=torch.float32)
    with runtime.use_stand_in(make_stand_in("950")), pk.use_backend("ascend", soc="950"):
        a = pk.per_token_cast_to_fp8(x, use_ue8m0=True, prepare_for=pk.m_grouped_fp8_gemm_nt_contiguous)
        b = pk.prepare_inputs(pk.m_grouped_fp8_gemm_nt_contiguous, b=per_block_cast_to_fp8(w, use_ue8m0=True))["b"]
        with trace_providers() as ran:
            pk.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    assert ran[-1] == ("m_grouped_fp8_gemm_nt_contiguous", "ascend", "torch_npu-mx")
    assert a.format is ASCEND_MX_KMAJOR
    valid = m_indices >= 0
    groups = m_indices.long().clamp_min(0)
    ref = torch.einsum("mk,mnk->mn", pk.dequantize(a).double(), pk.dequantize(b).double()[groups])
    assert pk.calc_diff(d[valid], ref[valid]) < 1e-6


# -- npu_dynamic_mx_quant with a float32 input ------------------------------------------------------------

@pytest.mark.parametrize("dtype,gran_k,k,declined", [
    (torch.float32, 32, 64, False),
    (torch.float32, 64, 128, True),     # fp32: block 32 only
    (torch.float32, 32, 16, True),      # fp32: quantized axis >= 32
    (torch.bfloat16, 32, 16, False),    # bf16: no such rule
    (torch.bfloat16, 64, 128, False),
])
def test_mx_cast_fp32_input_rule(dtype, gran_k, k, declined):
    inputs = CastInputs(randn(4, k, seed=9).to(dtype), (1, gran_k), True, PLAIN)
    reasons = _reasons("per_token_cast_to_fp8", "torch_npu-mx", inputs, "950")
    assert any(doc.MX_QUANT in r for r in reasons) == declined, reasons


def test_stand_in_refuses_an_fp32_axis_under_32():
    npu = make_stand_in("950")
    npu.npu_dynamic_mx_quant(randn(2, 32, seed=1), dst_type=torch.float8_e4m3fn, block_size=32, scale_alg=1)
    with pytest.raises(StandInError, match="at least 32"):
        npu.npu_dynamic_mx_quant(randn(2, 16, seed=1), dst_type=torch.float8_e4m3fn, block_size=32, scale_alg=1)


# -- npu_fused_infer_attention_score, MLA D = 512 -----------------------------------------------------------

def _fia_args(s_q=1, s_k=40, heads=4):
    q = randn(s_q, heads, 576, seed=10, dtype=torch.bfloat16)
    nope = randn(1, 64, 512, seed=11, dtype=torch.bfloat16)
    rope = randn(1, 64, 64, seed=12, dtype=torch.bfloat16)
    return (q[..., :512].contiguous(), nope, nope), dict(
        query_rope=q[..., 512:].contiguous(), key_rope=rope, actual_seq_lengths=[s_q], actual_seq_lengths_kv=[s_k],
        block_table=torch.zeros(1, 1, dtype=torch.int32), num_heads=heads, input_layout="TND", num_key_value_heads=1,
        block_size=64)


def test_stand_in_fia_refuses_softmax_lse_for_mla_d512():
    npu = make_stand_in("910b")
    args, kwargs = _fia_args()
    out, lse = npu.npu_fused_infer_attention_score(*args, **kwargs)
    assert out.shape == (1, 4, 512) and lse.shape == (1,)
    with pytest.raises(StandInError, match="softmax_lse"):
        npu.npu_fused_infer_attention_score(*args, **kwargs, softmax_lse_flag=True)


def test_stand_in_fia_runs_causal_with_fewer_keys_than_queries():
    """The blocks-execution rule (sparse_mode 3, kv - q < 0) is for int8 output with quant_offset2 only."""
    from portable_kernels.backends.ascend.vendor.mla import causal_mask
    npu = make_stand_in("910c")
    args, kwargs = _fia_args(s_q=4, s_k=2)
    out, _ = npu.npu_fused_infer_attention_score(*args, **kwargs, sparse_mode=3, atten_mask=causal_mask(args[0].device))
    assert bool(out[:2].isnan().all()) and not out[2:].isnan().any()  # queries 0, 1 see no key: undocumented


def test_fia_provider_limits_cite_the_mla_constraints():
    p = _provider("flash_mla_with_kvcache", "torch_npu-fia")
    assert {lim.dim for lim in p.limits} == {"d", "h_kv"}
    assert all(doc.FIA in lim.source for lim in p.limits)
    assert "softmax_lse" in p.doc
