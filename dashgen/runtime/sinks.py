"""Attention sinks (GPT-OSS's learned per-head sink logits): each query row's softmax takes one
more term, exp(sinks[h]), in its denominator, with no value behind it, so a row may give part
of its weight to nothing.

Exact on top of the kernels, in three elementwise steps. The forward kernel's o and lse become
lse' = logaddexp(lse, sink) and o' = o * exp(lse - lse'): the sunk attention's output and
logsumexp. Handed o' and lse', the backward kernels compute the sunk attention's gradients of
q, k and v: their P = exp(S - lse') is its probabilities, and D = rowsum(dO * o') is the sum
over the real keys that its dS needs (the sink column has no value, so dP has no entry for
it). The sink's own gradient is -sum over rows of exp(sink - lse') * D. Each step is a torch
elementwise op or a fixed-shape reduction, so the bits stay a function of the inputs.
"""
from __future__ import annotations

import torch


def check_sinks(sinks, q: torch.Tensor, heads_dim: int = 2) -> None:
    """ValueError/TypeError naming `sinks` unless it is a floating (heads_q,) tensor on q's
    device (q's heads in dimension heads_dim: 2 for (batch, seqlen, heads, head_dim), 1 for a
    pack's (total, heads, head_dim))."""
    heads = q.shape[heads_dim]
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a tensor of one logit per query head, got "
                        f"{type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating tensor, got {sinks.dtype}")
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must have shape ({heads},), one logit per query head, got "
                         f"{tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks is on {sinks.device} but q is on {q.device}")


def _keep(lse: torch.Tensor, sinks: torch.Tensor):
    """(lse', keep) with lse' = logaddexp(lse, sink) and keep = exp(lse - lse') (0 where
    lse' = -inf: a row without a key and a sink of -inf), both (batch, heads_q, seqlen_q)."""
    lse_sunk = torch.logaddexp(lse, sinks.to(lse.dtype)[None, :, None])
    keep = torch.exp(lse - lse_sunk)
    return lse_sunk, torch.where(torch.isneginf(lse_sunk), torch.zeros_like(keep), keep)


def _scaled(o: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """o' = o * keep, formed in float32 for the kernels' 16-bit o."""
    wide = torch.promote_types(o.dtype, keep.dtype)
    return (o.to(wide) * keep.transpose(1, 2)[..., None]).to(o.dtype)


def sunk(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor):
    """(o', lse') of the sunk attention from the kernels' o (batch, seqlen_q, heads_q,
    head_dim) and lse (batch, heads_q, seqlen_q, float32)."""
    lse_sunk, keep = _keep(lse, sinks)
    return _scaled(o, keep), lse_sunk


def sink_gradient(do: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                  sinks: torch.Tensor) -> torch.Tensor:
    """d loss / d sinks: -sum over batch and rows of exp(sink - lse') * rowsum(dO * o'), from
    the kernels' o and lse: rowsum(dO * o') = keep * rowsum(dO * o) in float32, without the
    rounding of o' to 16 bits."""
    return _sink_gradient(do, o, *_keep(lse, sinks), sinks)


def _sink_gradient(do: torch.Tensor, o: torch.Tensor, lse_sunk: torch.Tensor,
                   keep: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """sink_gradient from lse' and keep (_keep) already formed."""
    wide = torch.promote_types(o.dtype, lse_sunk.dtype)
    d = keep * (do.to(wide) * o.to(wide)).sum(-1).transpose(1, 2)
    weight = torch.exp(sinks.to(lse_sunk.dtype)[None, :, None] - lse_sunk)
    weight = torch.where(torch.isneginf(lse_sunk), torch.zeros_like(weight), weight)
    return -(weight * d).sum((0, 2)).to(sinks.dtype)


class SinkAttention(torch.autograd.Function):
    """Autograd of the sunk attention: `forward(q, k, v)` runs the kernels' forward (o, lse),
    `backward(do, q, k, v, o, lse)` their backward, both the op's (eager or custom op). The
    kernels' o and lse are saved, and o', lse' formed again for the backward (the same
    elementwise ops, so the same bits): o' is not kept beside o."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, forward, backward):
        o, lse = forward(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.backward_fn = backward
        o_sunk, lse_sunk = sunk(o, lse, sinks)
        ctx.mark_non_differentiable(lse_sunk)
        ctx.set_materialize_grads(False)
        return o_sunk, lse_sunk

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels have no backward of their own
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        if grad_o is None:
            return None, None, None, None, None, None
        grad_o = grad_o.contiguous()
        lse_sunk, keep = _keep(lse, sinks)  # once, for o' and for the sinks' gradient
        dq, dk, dv = ctx.backward_fn(grad_o, q, k, v, _scaled(o, keep), lse_sunk)
        dsinks = (_sink_gradient(grad_o, o, lse_sunk, keep, sinks) if ctx.needs_input_grad[3]
                  else None)
        return dq, dk, dv, dsinks, None, None
