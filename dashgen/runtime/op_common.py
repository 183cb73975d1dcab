"""What the two torch ops share besides their checks (dashgen/runtime/checks.py): dashgen.attention
(runtime/op.py) and dashgen.attention_varlen (runtime/op_varlen.py) resolve their arguments to
the same Options, hand the kernels tensors made ready the same way, and send a traced call
through their custom ops alike."""
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
