"""flash_attn_varlen_func's backward (the reference differentiated): gradients against torch
autograd through an independent fp32 SDPA formulation, on every backend's forward."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels.core.numerics import calc_diff

BACKENDS = ("cpu", "nvidia:arch=sm90", "ascend:soc=950")


def _sdpa_reference(q, k, v, lens_q, lens_k, scale, causal):
    """fp32 SDPA per sequence with an explicit bottom-right mask (torch's own autograd)."""
    outs, q0, k0 = [], 0, 0
    h_q, h_kv = q.shape[1], k.shape[1]
    for s_q, s_k in zip(lens_q, lens_k):
        qs = q[q0:q0 + s_q].float().transpose(0, 1)
        ks = k[k0:k0 + s_k].float().repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        vs = v[k0:k0 + s_k].float().repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)
        mask = torch.ones(s_q, s_k, dtype=torch.bool).tril(s_k - s_q) if causal else None
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale)
                    .transpose(0, 1))
        q0, k0 = q0 + s_q, k0 + s_k
    return torch.cat(outs)


def _inputs(seed, dtype=torch.bfloat16, h_q=4, h_kv=2, d=32, d_v=16, lens_q=(5, 9), lens_k=(7, 9)):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(sum(lens_q), h_q, d, generator=g) / 3).to(dtype).requires_grad_()
    k = (torch.randn(sum(lens_k), h_kv, d, generator=g) / 3).to(dtype).requires_grad_()
    v = torch.randn(sum(lens_k), h_kv, d_v, generator=g).to(dtype).requires_grad_()
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k)]
    grad_out = torch.randn(sum(lens_q), h_q, d_v, generator=g).to(dtype)
    return q, k, v, cu[0], cu[1], grad_out, lens_q, lens_k


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_autograd_of_an_independent_reference(backend, causal):
    q, k, v, cu_q, cu_k, grad_out, lens_q, lens_k = _inputs(seed=3 + causal)
    name, _, opts = backend.partition(":")
    with pk.use_backend(name, **dict(o.split("=") for o in filter(None, opts.split(",")))):
        out, lse = pk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), softmax_scale=0.3,
                                             causal=causal)
    assert out.requires_grad and not lse.requires_grad
    out.backward(grad_out)
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = _sdpa_reference(q, k, v, lens_q, lens_k, 0.3, causal)
    ref.backward(grad_out.float())
    assert calc_diff(out.float(), ref) < 1e-5
    for name, g, t in zip("qkv", got, (q, k, v)):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert calc_diff(g.float(), t.grad.float()) < 1e-5, name


def test_only_the_inputs_that_need_it_get_a_gradient():
    q, k, v, cu_q, cu_k, grad_out, lens_q, lens_k = _inputs(seed=9)
    k.requires_grad_(False)
    out, _ = pk.flash_attn_varlen_func(q, k.detach(), v, cu_q, cu_k, max(lens_q), max(lens_k))
    out.backward(grad_out)
    assert q.grad is not None and v.grad is not None and k.grad is None


def test_no_graph_is_built_without_gradients():
    q, k, v, cu_q, cu_k, _, lens_q, lens_k = _inputs(seed=11)
    with torch.no_grad():
        out, lse = pk.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k))
    assert out.grad_fn is None and not out.requires_grad
    q2, k2, v2 = (t.detach() for t in (q, k, v))
    out2, _ = pk.flash_attn_varlen_func(q2, k2, v2, cu_q, cu_k, max(lens_q), max(lens_k))
    assert out2.grad_fn is None
    assert torch.equal(out, out2)
