"""What the two torch ops share besides their checks (dashgen/runtime/checks.py): dashgen.attention
(runtime/op.py) and dashgen.attention_varlen (runtime/op_varlen.py) resolve their arguments to
the same Options, keep what a signature runs in one validated entry, hand the kernels tensors
made ready the same way, send a traced call through their custom ops alike, and wire those ops'
autograd and fake gradients the same way."""
from __future__ import annotations

from typing import NamedTuple

import torch


class Options(NamedTuple):
    """The resolved arguments the custom ops receive (a NamedTuple so torch.compile folds it)."""

    causal: bool
    softmax_scale: float
    deterministic: bool
    schedule: str
    num_workers: int
    softcap: float = 0.0  # FlashAttention's softcap; 0: the scores uncapped
    # A sliding window's bounds (checks.window: FlashAttention's, -1 an open side); (-1, -1):
    # none, the mask is causal's.
    window_left: int = -1
    window_right: int = -1

    @property
    def window(self) -> tuple[int, int]:
        return self.window_left, self.window_right


class Validated:
    """What a call signature that passed every check holds: its Options, what runs for it
    (`plan`: dashgen.attention's runtime.select.Plan, a pack's Selection; None while
    torch.compile traces, where only the custom ops run) and, made on the signature's first
    eager call through the runtime's memos and kept, the runtime's prepared forward and
    backward. So a repeated eager call finds everything it runs in one lookup, in its op's memo
    of these; the runtime's memos serve its other callers (the custom ops, direct calls). Each
    op says how its calls are prepared (`prepare_forward`, `prepare_backward`)."""

    __slots__ = ("options", "plan", "key", "forward", "backward")

    def __init__(self, options: Options, plan, key):
        self.options, self.plan, self.key = options, plan, key  # key: None where not memoized
        self.forward = self.backward = None


def constant_for_compile(fn):
    """torch.compiler.assume_constant_result (torch.compile runs fn once while tracing and keeps
    its answer) without importing torch._dynamo, which takes 3-5 s: the whole host time of a
    process's first call, which otherwise needs none of it. The decorator only sets this marker,
    which dynamo reads when it traces; tests/test_op_errors.py checks that the two agree."""
    fn._dynamo_marked_constant = True
    return fn


def ready(t: torch.Tensor) -> torch.Tensor:
    """t as the kernels read it: contiguous, starting on a 16-byte boundary (TMA descriptors and
    the 16-byte loads need it; a contiguous view into a buffer at an odd offset does not have
    it, and is copied like any other layout the kernels cannot read)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def traced(q: torch.Tensor) -> bool:
    """Whether torch.compile is tracing or q is a fake tensor: then only the custom ops (with
    their fake kernels) may run."""
    if torch.compiler.is_compiling():
        return True
    if type(q) is torch.Tensor:  # fake tensors are a subclass
        return False
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(q)


def gradients_like(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """dq, dk, dv as a backward op's fake kernel makes them: contiguous, shaped like q, k, v."""
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def register_autograd(forward_op, backward_op, tensors: int) -> None:
    """Autograd for a custom-op pair called as forward_op(q, k, v, *more) -> (o, lse) and
    backward_op(grad_o, q, k, v, o, lse, *more) -> (dq, dk, dv): the first `tensors` of `more`
    (a pack's offsets) are saved with q, k, v, o and lse, the rest (lengths, options) ride on
    the context. register_autograd sees only the forward's inputs, and the backward needs them
    to reproduce the same bits. lse takes no gradient."""

    def setup_context(ctx, inputs, output) -> None:
        o, lse = output
        ctx.save_for_backward(*inputs[:3], o, lse, *inputs[3:3 + tensors])
        ctx.constants = tuple(inputs[3 + tensors:])
        ctx.mark_non_differentiable(lse)

    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, *more = ctx.saved_tensors
        dq, dk, dv = backward_op(grad_o, q, k, v, o, lse, *more, *ctx.constants)
        return (dq, dk, dv) + (None,) * (len(more) + len(ctx.constants))

    forward_op.register_autograd(backward, setup_context=setup_context)
