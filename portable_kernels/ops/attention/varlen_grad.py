"""Backward of flash_attn_varlen_func: the reference math differentiated by torch autograd.

The forward runs on the chosen provider (any backend); when q, k or v needs a gradient the call is
wrapped so that its backward recomputes the reference (fp32, sequence by sequence) on the saved
inputs and lets autograd differentiate it. This is a correctness tool with the reference's speed
and memory (the [h, s_q, s_k] logits of one sequence at a time), not a fused backward kernel; lse
is not differentiable. Under torch.compile the op stays forward only (its custom op has no
autograd formula).
"""

from __future__ import annotations

from typing import Callable

import torch

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class _ReferenceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_qo, cu_seqlens_kv, scale: float, causal: bool, run_forward: Forward):
        out, lse = run_forward(q, k, v)
        ctx.save_for_backward(q, k, v, cu_seqlens_qo, cu_seqlens_kv)
        ctx.scale, ctx.causal = scale, causal
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        from .prefill import varlen_reference

        q, k, v, cu_q, cu_kv = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(need) for t, need in zip((q, k, v), ctx.needs_input_grad[:3])]
        with torch.enable_grad():
            out, _ = varlen_reference(*leaves, cu_q, cu_kv, ctx.scale, ctx.causal)
            grads = iter(torch.autograd.grad(out, [t for t in leaves if t.requires_grad], d_out.float()))
        dq, dk, dv = (next(grads).to(t.dtype) if t.requires_grad else None for t in leaves)
        return dq, dk, dv, None, None, None, None, None


def needs_backward(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def with_reference_backward(run_forward: Forward, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens_qo: torch.Tensor, cu_seqlens_kv: torch.Tensor, scale: float,
                            causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """run_forward(q, k, v) -> (out, lse), with out differentiable in q, k and v."""
    return _ReferenceBackward.apply(q, k, v, cu_seqlens_qo, cu_seqlens_kv, scale, causal, run_forward)
