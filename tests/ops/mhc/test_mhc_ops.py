"""The mHC ops (portable_kernels.ops.mhc) against formulations written here independently (loops
over streams, explicit matrices; fp64 where the op computes fp32), their backwards against
torch.autograd on those formulations, the drop-in autograd Functions (TileKernels'
modeling.mhc.ops) end to end, and the bad-input errors."""

from __future__ import annotations

import pytest
import torch

import portable_kernels as pk
from portable_kernels import ContractError
from portable_kernels.core.dispatch import trace_providers
from portable_kernels.ops import mhc
from portable_kernels.testing.generators import poison, randn
from portable_kernels.tile_kernels.modeling.mhc import functional as tkf
from portable_kernels.tile_kernels.modeling.mhc import ops as tk

M = 4


# -- formulations of the test (fp64, written without the library's code) ---------------------------------

def my_sinkhorn(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    p = torch.exp(x - x.amax(-1, keepdim=True))
    p = p / p.sum(-1, keepdim=True) + eps
    for it in range(repeat):
        if it:
            p = p / (p.sum(-1, keepdim=True) + eps)
        p = p / (p.sum(-2, keepdim=True) + eps)
    return p


def my_split(z_in, scale, base, m, pmv, eps):
    pre, post, comb = [], [], []
    for j in range(m):
        pre.append(torch.sigmoid(z_in[..., j] * scale[0] + base[j]) + eps)
        post.append(torch.sigmoid(z_in[..., m + j] * scale[1] + base[m + j]) * pmv)
    for j in range(m * m):
        comb.append(z_in[..., 2 * m + j] * scale[2] + base[2 * m + j])
    a, b = z_in.shape[:2]
    return (torch.stack(pre, -1).unsqueeze(-1), torch.stack(post, -1).unsqueeze(-1),
            torch.stack(comb, -1).reshape(a, b, m, m))


def my_apply(x, mix):
    return sum(x[..., i, :] * mix[..., i, :] for i in range(x.shape[-2]))


def my_post(x, residual, post_mix, comb):
    m = residual.shape[-2]
    return torch.stack([x * post_mix[..., n, :] + sum(comb[..., i, n, None] * residual[..., i, :] for i in range(m))
                        for n in range(m)], dim=-2)


def my_norm_fn(residual, fn, eps):
    x = residual.flatten(-2)
    rms = torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return torch.einsum("...k,nk->...n", x / rms, fn)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


def _grads(f, inputs, grads_out):
    leaves = [_leaf(t) for t in inputs]
    outs = f(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    torch.autograd.backward(list(outs), [g.double() for g in grads_out])
    return [o.detach() for o in outs], [leaf.grad for leaf in leaves]


def close(got: torch.Tensor, want: torch.Tensor, bf16: bool = False) -> None:
    assert got.shape == want.shape
    assert torch.isfinite(got).all()
    assert pk.calc_diff(got.double(), want.double()) < (1e-5 if bf16 else 1e-10)


# -- forward and backward ops ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_expand_and_backward(dtype):
    h = randn(2, 3, 40, seed=1, dtype=dtype)
    out = mhc.mhc_expand(h, M)
    assert out.dtype == dtype and out.shape == (2, 3, M, 40)
    for i in range(M):
        assert torch.equal(out[..., i, :], h)
    g = randn(2, 3, M, 40, seed=2, dtype=dtype)
    close(mhc.mhc_expand_backward(g), g.double().sum(-2), bf16=True)


@pytest.mark.parametrize("repeat", [1, 3, 10])
def test_sinkhorn_forward_backward(repeat):
    x, g = randn(2, 5, M, M, seed=3), randn(2, 5, M, M, seed=4)
    (want,), (want_grad,) = _grads(lambda t: my_sinkhorn(t, repeat, 1e-6), [x], [g])
    out = mhc.mhc_sinkhorn(x, repeat, 1e-6)
    close(out, want)
    if repeat == 10:  # nearly doubly stochastic
        assert torch.allclose(out.sum(-1), torch.ones(2, 5, M), atol=1e-3)
        assert torch.allclose(out.sum(-2), torch.ones(2, 5, M), atol=1e-5)
    close(mhc.mhc_sinkhorn_backward(g, x, repeat, 1e-6), want_grad)


def test_pre_split_mixes_forward_backward():
    m3 = M * (M + 2)
    z, scale, base = randn(2, 7, m3, seed=5), randn(3, seed=6), randn(m3, seed=7)
    gs = [randn(2, 7, M, 1, seed=8), randn(2, 7, M, 1, seed=9), randn(2, 7, M, M, seed=10)]
    wants, want_grads = _grads(lambda a, b, c: my_split(a, b, c, M, 2.0, 1e-2), [z, scale, base], gs)
    for got, want in zip(mhc.mhc_pre_split_mixes(z, scale, base, M, 2.0, 1e-2), wants):
        close(got, want)
    for got, want in zip(mhc.mhc_pre_split_mixes_backward(*gs, z, scale, base, M, 2.0), want_grads):
        close(got, want)


def test_head_compute_mix_forward_backward():
    z, scale, base, g = randn(2, 9, M, seed=11), randn(1, seed=12), randn(M, seed=13), randn(2, 9, M, seed=14)
    (want,), want_grads = _grads(lambda a, s, b: 1 / (1 + torch.exp(-(a * s + b))) + 1e-2, [z, scale, base], [g])
    close(mhc.mhc_head_compute_mix(z, scale, base, 1e-2), want)
    for got, w in zip(mhc.mhc_head_compute_mix_backward(g, z, scale, base), want_grads):
        close(got, w)


def test_pre_apply_mix_forward_backward():
    x, mix = randn(2, 6, M, 72, seed=15, dtype=torch.bfloat16), randn(2, 6, M, 1, seed=16).softmax(-2)
    g = randn(2, 6, 72, seed=17, dtype=torch.bfloat16)
    (want,), (want_x, want_mix) = _grads(my_apply, [x, mix], [g])
    out = mhc.mhc_pre_apply_mix(x, mix)
    assert out.dtype == torch.bfloat16
    close(out, want, bf16=True)
    x_grad, mix_grad = mhc.mhc_pre_apply_mix_backward(g, x, mix)
    assert x_grad.dtype == torch.bfloat16 and mix_grad.dtype == torch.float32
    close(x_grad, want_x, bf16=True)
    close(mix_grad, want_mix)


def test_post_forward_backward():
    x, res = randn(2, 5, 64, seed=18, dtype=torch.bfloat16), randn(2, 5, M, 64, seed=19, dtype=torch.bfloat16)
    post, comb = randn(2, 5, M, 1, seed=20), randn(2, 5, M, M, seed=21)
    g = randn(2, 5, M, 64, seed=22, dtype=torch.bfloat16)
    (want,), want_grads = _grads(my_post, [x, res, post, comb], [g])
    close(mhc.mhc_post(x, res, post, comb), want, bf16=True)
    got = mhc.mhc_post_backward(g, x, res, post, comb)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    close(got[0], want_grads[0], bf16=True)
    close(got[1], want_grads[1], bf16=True)
    close(got[2], want_grads[2])
    close(got[3], want_grads[3])


def test_pre_norm_fn_forward_backward():
    m3, h = M * (M + 2), 48
    res = randn(1, 11, M, h, seed=23, dtype=torch.bfloat16)
    fn, g = randn(m3, M * h, seed=24) * 0.01, randn(1, 11, m3, seed=25)
    (want,), (want_res, want_fn) = _grads(lambda r, f: my_norm_fn(r, f, 1e-6), [res, fn], [g])
    assert_fp32(mhc.mhc_pre_norm_fn(res, fn, 1e-6), want)
    res_grad, fn_grad = mhc.mhc_pre_norm_fn_backward(g, res, fn, 1e-6)
    assert res_grad.dtype == torch.bfloat16
    close(res_grad, want_res, bf16=True)
    assert_fp32(fn_grad, want_fn)


def assert_fp32(got, want):
    """fp32 matmul over K values against fp64: calc_diff well under fp32's 1e-7."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert pk.calc_diff(got.double(), want) < 1e-9


def test_cpu_runs_the_reference_where_there_is_no_native_kernel():
    with trace_providers() as ran:
        mhc.mhc_sinkhorn(randn(3, M, M, seed=26))
        mhc.mhc_sinkhorn_backward(randn(3, M, M, seed=27), randn(3, M, M, seed=28))
    assert [(op, b, p) for op, b, p in ran] == [("mhc_sinkhorn", "cpu", "reference"),
                                                ("mhc_sinkhorn_backward", "cpu", "reference")]


# -- the drop-in autograd Functions ------------------------------------------------------------------------

def test_mhc_layer_gradients_match_autograd_on_the_formulation():
    """One block: pre (norm_fn, split, sinkhorn, apply) -> a stand-in layer -> post, backward through all."""
    h, m3 = 32, M * (M + 2)
    res0 = randn(1, 6, M, h, seed=31, dtype=torch.bfloat16)
    fn, scale, base = randn(m3, M * h, seed=32) * 0.05, randn(3, seed=33) * 0.1, randn(m3, seed=34) * 0.1
    g = randn(1, 6, M, h, seed=35, dtype=torch.bfloat16)

    def mine(r, f, s, b):
        z = my_norm_fn(r, f, 1e-6)
        pre, post, comb = my_split(z, s, b, M, 1.0, 1e-6)
        comb = my_sinkhorn(comb, 10, 1e-6)
        y = torch.tanh(my_apply(r, pre))
        return my_post(y, r, post, comb)

    (want,), want_grads = _grads(mine, [res0, fn, scale, base], [g])
    leaves = [res0.clone().requires_grad_(), fn.clone().requires_grad_(), scale.clone().requires_grad_(),
              base.clone().requires_grad_()]
    layer_input, (post, comb) = tkf.mhc_pre(leaves[0], leaves[1], leaves[2], leaves[3], mhc_mult=M)
    out = tk.mhc_post(torch.tanh(layer_input.float()).bfloat16(), leaves[0], post, comb)
    torch.autograd.backward([out], [g])
    assert pk.calc_diff(out.double(), want) < 1e-4
    for leaf, w in zip(leaves, want_grads):
        assert leaf.grad is not None and pk.calc_diff(leaf.grad.double(), w) < 1e-3


def test_pre_big_fuse_equals_the_steps_and_out_buffers_are_written():
    h, m3 = 40, M * (M + 2)
    res = randn(1, 9, M, h, seed=36, dtype=torch.bfloat16)
    fn, scale, base = randn(m3, M * h, seed=37) * 0.05, randn(3, seed=38) * 0.1, randn(m3, seed=39) * 0.1
    with torch.no_grad():
        fused = tk.mhc_pre_big_fuse(res, fn, scale, base, 1e-6, 1e-6, 1e-6, 1.0, 10)
        layer_input, (post, comb) = tkf.mhc_pre(res, fn, scale, base, mhc_mult=M)
    assert torch.equal(fused[0], post) and torch.equal(fused[1], comb) and torch.equal(fused[2], layer_input)
    out = poison(1, 9, h, dtype=torch.bfloat16)
    got = tk.mhc_pre_apply_mix(res, torch.full((1, 9, M, 1), 0.25), out=out)
    want = mhc.mhc_pre_apply_mix(res, torch.full((1, 9, M, 1), 0.25))
    assert torch.equal(out, want) and torch.equal(got, want)
    expanded = poison(1, 9, M, h, dtype=torch.bfloat16)
    tk.expand_to_mhc(layer_input, M, out=expanded)
    assert torch.equal(expanded, mhc.mhc_expand(layer_input, M))


def test_multilayer_recompute_writes_every_buffer():
    h, layers = 24, 3
    res0 = randn(1, 5, M, h, seed=40, dtype=torch.bfloat16)
    pre = [randn(1, 5, M, 1, seed=41 + i) for i in range(layers)]
    outs = [randn(1, 5, h, seed=50 + i, dtype=torch.bfloat16) for i in range(layers - 1)]
    posts = [randn(1, 5, M, 1, seed=60 + i) for i in range(layers - 1)]
    combs = [randn(1, 5, M, M, seed=70 + i) for i in range(layers - 1)]
    inputs = [poison(1, 5, h, dtype=torch.bfloat16) for _ in range(layers)]
    residuals = [poison(1, 5, M, h, dtype=torch.bfloat16) for _ in range(layers - 1)]
    tk.mhc_multilayer_recompute(res0, pre, outs, posts, combs, inputs, residuals)
    r = res0
    for i in range(layers):
        assert torch.equal(inputs[i], mhc.mhc_pre_apply_mix(r, pre[i]))
        if i < layers - 1:
            r = mhc.mhc_post(outs[i], r, posts[i], combs[i])
            assert torch.equal(residuals[i], r)


def test_head_matches_the_formulation():
    h = 16
    res = randn(1, 4, M, h, seed=80, dtype=torch.bfloat16)
    fn, scale, base = randn(M, M * h, seed=81) * 0.05, randn(1, seed=82), randn(M, seed=83)
    got = tkf.mhc_head(res, fn, scale, base, mhc_mult=M)
    z = my_norm_fn(res.double(), fn.double(), 1e-6)
    mix = (torch.sigmoid(z * scale.double() + base.double()) + 1e-6).unsqueeze(-1)
    close(got, my_apply(res.double(), mix), bf16=True)


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: mhc.mhc_sinkhorn(randn(2, 3, 4, seed=1)), "square"),
    (lambda: mhc.mhc_sinkhorn(randn(2, 4, 4, seed=1).double()), "float32"),
    (lambda: mhc.mhc_sinkhorn(randn(2, 4, 4, seed=1), repeat=0), "repeat"),
    (lambda: mhc.mhc_expand(randn(2, 8, seed=1), 0), "mhc_mult"),
    (lambda: mhc.mhc_pre_split_mixes(randn(1, 2, 23, seed=1), randn(3, seed=2), randn(24, seed=3), 4, 1.0, 1e-6),
     "input_mixes"),
    (lambda: mhc.mhc_pre_split_mixes(randn(1, 2, 24, seed=1), randn(2, seed=2), randn(24, seed=3), 4, 1.0, 1e-6),
     "scale"),
    (lambda: mhc.mhc_pre_apply_mix(randn(1, 2, 4, 8, seed=1), randn(1, 2, 4, 1, seed=2)), "bfloat16"),
    (lambda: mhc.mhc_pre_apply_mix(randn(1, 2, 4, 8, seed=1).bfloat16(), randn(1, 2, 3, 1, seed=2)), "mix"),
    (lambda: mhc.mhc_post(randn(1, 2, 9, seed=1).bfloat16(), randn(1, 2, 4, 8, seed=2).bfloat16(),
                          randn(1, 2, 4, 1, seed=3), randn(1, 2, 4, 4, seed=4)), "'x'|x"),
    (lambda: mhc.mhc_pre_norm_fn(randn(1, 2, 4, 8, seed=1).bfloat16(), randn(24, 31, seed=2)), "fn"),
    (lambda: mhc.mhc_pre_norm_fn(randn(1, 2, 4, 8, seed=1).bfloat16(), randn(24, 32, seed=2), -1.0), "norm_eps"),
    (lambda: tk.mhc_multilayer_recompute(randn(1, 2, 4, 8, seed=1).bfloat16(), [], [], [], [], [], []),
     "pre_mix_list"),
])
def test_bad_input_raises_a_contract_error_naming_the_argument(call, match):
    with pytest.raises(ContractError, match=match):
        call()


def test_mhc_pre_with_norm_weight_gives_the_same_values_with_and_without_autograd():
    h, m3 = 24, M * (M + 2)
    res = randn(1, 7, M, h, seed=90, dtype=torch.bfloat16)
    fn, scale, base = randn(m3, M * h, seed=91) * 0.05, randn(3, seed=92) * 0.1, randn(m3, seed=93) * 0.1
    w = randn(M * h, seed=94) * 0.1 + 1.0
    with torch.no_grad():
        fused_input, (fused_post, fused_comb) = tkf.mhc_pre(res, fn, scale, base, norm_weight=w, mhc_mult=M)
    layer_input, (post, comb) = tkf.mhc_pre(res, fn, scale, base, norm_weight=w, mhc_mult=M)
    assert torch.equal(fused_input, layer_input) and torch.equal(fused_post, post) and torch.equal(fused_comb, comb)
    unweighted, _ = tkf.mhc_pre(res, fn, scale, base, mhc_mult=M)
    assert not torch.equal(unweighted, layer_input)
