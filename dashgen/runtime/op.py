"""The public torch op: ``dashgen.attention`` with a bitwise reproducible backward on Hopper.

Registers ``dashgen::attention_fwd`` and ``dashgen::attention_bwd`` with torch.library (fake
kernels for torch.compile, autograd via register_autograd); torch.compile traces those. Eager
calls take a torch.autograd.Function over the same runtime calls: the custom-op layers cost
hundreds of microseconds of host time per backward, a third of a short one. Both paths run the
same kernels with the same arguments, so their bits agree. Every input is checked before any
kernel launches; errors name the argument.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..caches import Memo
from ..schedule.ir import Schedule
from . import checks
from .chunks import check_chunk, chunked_attention
from .op_common import (Options, Validated, constant_for_compile, gradients_like, ready,
                        register_autograd, traced)
from .select import NO_WINDOW, Overrides, Plan, plan, v_width, window_arg
from .tables import register


class _Kernels(NamedTuple):
    forward: object
    backward: object
    BackwardCall: type
    forward_call: object  # the runtime's memos of prepared calls, asked once per signature
    backward_launch: object


_KERNELS: _Kernels | None = None


def _kernels() -> _Kernels:
    # Imported on first use so that `import dashgen.runtime.op` loads no driver binding.
    global _KERNELS
    if _KERNELS is None:
        from .backward import BackwardCall, backward, backward_launch
        from .forward import forward, forward_call
        _KERNELS = _Kernels(forward, backward, BackwardCall, forward_call, backward_launch)
    return _KERNELS


# -- validation (the checks both ops share are dashgen/runtime/checks.py's) ---------------------

def _check_tensors(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.rank(name, t, 4, "batch, seqlen, heads, head_dim")
    checks.dtype(q)
    for name, t in (("k", k), ("v", v)):
        checks.same_dtype(name, t, q)
    dims = ("batch", "seqlen", "heads", "head_dim")
    for name, t in (("q", q), ("k", k), ("v", v)):
        for dim in range(3):  # a zero head_dim is caught by the supported-head_dim check
            if t.shape[dim] == 0:
                raise ValueError(f"{name} has {dims[dim]} 0 (shape {tuple(t.shape)}); "
                                 f"every dimension must be positive")
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != q.shape[0]:
            raise ValueError(f"{name} has batch {t.shape[0]} but q has batch {q.shape[0]}")
    checks.same_head_dim("k", k, q)
    checks.head_dim_v(q, k, v)
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v has shape {tuple(v.shape)} but k has shape {tuple(k.shape)}; "
                         f"k and v must have the same batch, seqlen and heads")
    checks.heads_divide(q.shape[2], k.shape[2])
    checks.head_dim(q)
    checks.last_dim_contiguous(q, k, v)


@constant_for_compile
def _plan(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int, head_dim: int,
          causal: bool, schedule: str, num_workers: int | None,
          sm_count: int, dtype: str = "bf16", deterministic: bool = True,
          window: tuple[int, int] = NO_WINDOW) -> tuple[str, int, str]:
    """(schedule, num_workers, error message or ""): torch.compile runs this once while tracing
    and keeps the answer. It returns its error instead of raising, because an exception thrown
    here would reach the user as an internal torch.compile error instead of a ValueError. The
    answer is the call's plan (runtime.select.plan), which the backward's launches find again."""
    try:
        made = plan((batch, seqlen_q, heads_q, head_dim), (batch, seqlen_k, heads_kv, head_dim),
                    dtype, causal, deterministic, False, schedule, num_workers, sm_count,
                    Overrides(), *window_arg(window))
    except ValueError as exc:
        return "", 0, str(exc)
    return made.schedule_key, made.num_workers, ""


class _Validated(Validated):
    """A dashgen.attention signature's entry: its forward is the runtime's ForwardCall, its
    backward the prepared launches (runtime.BackwardLaunch) each call's BackwardCall takes."""

    __slots__ = ()

    def prepare_forward(self, q, k, v):
        opts = self.options
        call = self.forward = _kernels().forward_call(
            q.shape, k.shape, q.dtype, opts.causal, opts.softmax_scale, q.device, Overrides(),
            opts.softcap, opts.window, v_width(q, v))
        return call

    def prepare_backward(self, device, head_dim_v: int):
        selection = self.plan.selection.soft_capped(bool(self.options.softcap),
                                                    self.plan.overrides.dq_writers == 2)
        launch = self.backward = _kernels().backward_launch(
            selection.with_head_dim_v(head_dim_v), device)
        if self.key is not None:
            # Its tables on the GPU (a schedule file's) count against the memo's bytes from now.
            _VALIDATED.refile(self.key, self)
        return launch

    def device_bytes(self) -> int:
        return 0 if self.backward is None else self.backward.device_bytes()


def check_inputs(q, k, v, *, causal=False, softmax_scale=None, deterministic=None,
                 schedule="auto", num_workers=None, softcap=0.0,
                 window_size=NO_WINDOW) -> Options:
    """Validate the arguments of :func:`attention` and resolve its defaults.

    Checks run in this order, so a CPU machine reaches every error path: argument types, ranks
    and dtypes; shapes (zero sizes, batch, head_dim, k vs v, heads_q a multiple of heads_kv,
    supported head_dim) and last-dim strides (meta tensors reach all of these); the options;
    one device for q, k and v (CPU vs meta tensors); CUDA (CPU tensors); compute capability 9.0
    and num_workers against the SM count (fake CUDA tensors from FakeTensorMode, with the device
    query stubbed); finally whether the schedule serves the problem.
    """
    return _resolve(q, k, v, causal, softmax_scale, deterministic, schedule,
                    num_workers, softcap, window_size).options


def _resolve(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers,
             softcap=0.0, window_size=NO_WINDOW) -> _Validated:
    """The signature's validated entry: check_inputs' Options, the call's plan (None while
    torch.compile traces, where only the custom ops run) and the prepared calls."""
    # The flag is read at call time, never a cached answer: with deterministic=None its value
    # is part of the key, so each state has its own resolved Options.
    flag = torch.are_deterministic_algorithms_enabled()
    key = _signature(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers,
                     flag, softcap, window_size)

    def checked():
        return _Validated(*_check_all(q, k, v, causal, softmax_scale, deterministic, schedule,
                                      num_workers, flag, softcap, window_size), key)

    resolved = checked() if key is None else _VALIDATED.get(key, checked)
    if deterministic is False and flag:
        checks.refuse_nondeterministic()
    return resolved


# The entries of argument signatures that passed every check: a training loop repeats the same
# shapes, and the checks' host time, and any further lookup, would delay every forward kernel.
# Bounded like the backward's launches by the tables they hold on the GPU.
_VALIDATED: Memo[_Validated] = Memo(None, max_entries=1024, max_bytes=1 << 30,
                                    size=_Validated.device_bytes)


def _signature(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers, flag,
               softcap=0.0, window_size=NO_WINDOW):
    """Everything the checks read, or None where a call must take the checks (torch.compile
    tracing, tensor subclasses such as fake tensors, unhashable options). Option types are part
    of it, so causal=1 never passes as causal=True. Only the options can be unhashable (the
    tensors' parts are sizes, dtypes, ints and devices), so only they are hashed to find out."""
    if torch.compiler.is_compiling() or not (type(q) is type(k) is type(v) is torch.Tensor):
        return None
    options = (causal, softmax_scale, deterministic, schedule, num_workers, softcap,
               type(causal), type(softmax_scale), type(deterministic), type(schedule),
               type(num_workers), type(softcap), flag if deterministic is None else None,
               window_size, type(window_size),
               *(type(x) for x in (window_size if type(window_size) is tuple else ())))
    try:
        hash(options)
    except TypeError:
        return None
    return (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.stride(-1), k.stride(-1),
            v.stride(-1), q.device, k.device, v.device, options)


def _check_all(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers,
               flag, softcap=0.0, window_size=NO_WINDOW) -> tuple[Options, Plan | None]:
    _check_tensors(q, k, v)
    checks.options(causal, softmax_scale, deterministic, schedule, num_workers)
    cap = checks.softcap(softcap)
    batch, seqlen_q, heads_q, head_dim = q.shape
    causal, window = checks.window(window_size, causal, seqlen_q, k.shape[1])
    sm_count = checks.device(q, k, v)
    # Whether the backward orders its sums: "auto" picks per mode (`listed-deal`).
    ordered = flag if deterministic is None else deterministic
    dtype = "bf16" if q.dtype == torch.bfloat16 else "fp16"
    name, workers, error = _plan(batch, heads_q, k.shape[2], seqlen_q, k.shape[1], head_dim,
                                 causal, schedule, num_workers, sm_count, dtype, ordered,
                                 window)
    if error:
        raise ValueError(error)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    # The plan _plan made, found again under the options it resolved to. While torch.compile
    # traces, only _plan's folded answer may be read.
    made = None if torch.compiler.is_compiling() else plan(
        tuple(q.shape), tuple(k.shape), dtype, causal, ordered, False, name, workers, sm_count,
        Overrides(), *window_arg(window))
    return Options(causal, scale, ordered, name, workers, cap, *window), made


# -- the kernel calls of the custom ops (the eager calls take their signature's prepared ones) ---

def _run_forward(q, k, v, opts: Options):
    """o and lse from the runtime."""
    return _kernels().forward(ready(q), ready(k), ready(v), causal=opts.causal,
                              softmax_scale=opts.softmax_scale, softcap=opts.softcap,
                              window=opts.window)


def _eager_forward(q, k, v, entry: _Validated):
    """o and lse from the signature's prepared forward (q, k and v ready)."""
    return (entry.forward or entry.prepare_forward(q, k, v))(q, k, v)


def _backward_options(opts: Options) -> dict:
    return dict(causal=opts.causal, softmax_scale=opts.softmax_scale,
                deterministic=opts.deterministic, schedule=opts.schedule,
                num_workers=opts.num_workers, softcap=opts.softcap, window=opts.window)


def _run_backward(do, q, k, v, o, lse, opts: Options):
    """dq, dk, dv from the runtime. The gradient of a reduction such as o.sum() arrives expanded
    (stride 0): contiguous() copies it."""
    return _kernels().backward(ready(do), ready(q), ready(k), ready(v), ready(o), lse,
                               **_backward_options(opts))


# -- the custom ops ----------------------------------------------------------------------------
# The backward's options ride along the forward op (op_common.register_autograd).

@torch.library.custom_op("dashgen::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float, deterministic: bool, schedule: str,
                  num_workers: int, softcap: float = 0.0, window_left: int = -1,
                  window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """o (like q) and lse (float32, batch x heads_q x seqlen_q); lse is not differentiable."""
    return _run_forward(q, k, v, Options(causal, softmax_scale, deterministic, schedule,
                                         num_workers, softcap, window_left, window_right))


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers,
                        softcap=0.0, window_left=-1, window_right=-1):
    batch, seqlen_q, heads_q, _ = q.shape
    o = q.new_empty((batch, seqlen_q, heads_q, v.shape[-1]))  # contiguous, V's width
    return o, q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("dashgen::attention_bwd", mutates_args=())
def attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  o: torch.Tensor, lse: torch.Tensor, causal: bool, softmax_scale: float,
                  deterministic: bool, schedule: str, num_workers: int,
                  softcap: float = 0.0, window_left: int = -1,
                  window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv: bitwise reproducible for fixed (problem, schedule, num_workers) when
    deterministic."""
    dq, dk, dv = _run_backward(do, q, k, v, o, lse, Options(
        causal, softmax_scale, deterministic, schedule, num_workers, softcap, window_left,
        window_right))
    return dq, dk, dv


@attention_bwd.register_fake
def _attention_bwd_fake(do, q, k, v, o, lse, causal, softmax_scale, deterministic, schedule,
                        num_workers, softcap=0.0, window_left=-1, window_right=-1):
    return gradients_like(q, k, v)


register_autograd(attention_fwd, torch.ops.dashgen.attention_bwd, tensors=0)


class _EagerAttention(torch.autograd.Function):
    """Eager autograd straight over the runtime (the custom ops' impls, minus their layers).
    The forward also prepares the backward's launches (runtime.BackwardCall) on the caller's
    thread while the GPU runs the forward, so that autograd's device thread, which the GPU
    waits on, has less to do."""

    @staticmethod
    def forward(ctx, q, k, v, entry: _Validated):
        q, k, v = ready(q), ready(k), ready(v)
        o, lse = _eager_forward(q, k, v, entry)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.opts = opts = entry.options
        ctx.call = _kernels().BackwardCall(
            q, k, v, o, lse, **_backward_options(opts),
            launch=entry.backward or entry.prepare_backward(q.device, v.shape[-1]))
        ctx.mark_non_differentiable(lse)
        # lse takes no gradient: without this, autograd would fill a zero tensor for it in every
        # backward (an allocation and a kernel launch, host time a short backward waits for).
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels have no backward of their own
    def backward(ctx, grad_o, grad_lse):
        saved = ctx.saved_tensors
        call = ctx.call
        if not call.serves(*saved):
            # Saved-tensor hooks (offloading, activation checkpointing) handed back other
            # tensors than the forward's: prepare for these.
            call = _kernels().BackwardCall(*(ready(t) for t in saved),
                                           **_backward_options(ctx.opts))
        dq, dk, dv = call(ready(grad_o))
        return dq, dk, dv, None, None


def _sunk_attention(q, k, v, sinks, entry: _Validated):
    """(o, lse) of attention with sinks (runtime.sinks) over the kernels: the custom ops while
    torch.compile traces, else the signature's prepared forward and the runtime's backward."""
    from .sinks import SinkAttention, check_sinks
    check_sinks(sinks, q)
    opts = entry.options
    q, k, v = ready(q), ready(k), ready(v)
    if traced(q):
        forward = lambda q, k, v: torch.ops.dashgen.attention_fwd(q, k, v, *opts)  # noqa: E731
        backward = lambda *t: torch.ops.dashgen.attention_bwd(*t, *opts)  # noqa: E731
    else:
        forward = lambda q, k, v: _eager_forward(q, k, v, entry)  # noqa: E731
        backward = lambda do, *t: _run_backward(do, *t, opts)  # noqa: E731
    return SinkAttention.apply(q, k, v, sinks, forward, backward)


# -- the public function -----------------------------------------------------------------------

def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None, deterministic: bool | None = None,
              schedule: str | Schedule = "auto", num_workers: int | None = None,
              return_lse: bool = False, softcap: float = 0.0,
              window_size: tuple[int, int] = NO_WINDOW, sinks: torch.Tensor | None = None,
              attention_chunk: int = 0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention whose backward is bitwise reproducible on Hopper.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim), bf16
    or fp16 CUDA tensors on an sm_90 GPU, heads_q a multiple of heads_kv (GQA/MQA); v may be 128
    wide under q and k of 192 (DeepSeek's MLA) with heads_q == heads_kv. causal masks
    bottom-right aligned: query row i sees key j iff j <= i + seqlen_k - seqlen_q (a row that sees
    no key gets o = 0). softmax_scale defaults to 1/sqrt(head_dim). Returns o, shaped like q
    with v's head_dim;
    with return_lse=True, (o, lse): lse is float32 (batch, heads_q, seqlen_q), the natural-log
    logsumexp of each row's scaled scores (-inf for a row that sees no key), not differentiable.

    deterministic: None (the default) follows torch.are_deterministic_algorithms_enabled(), so
    torch.use_deterministic_algorithms(True) is the one switch; True makes dq/dk/dv bitwise
    reproducible: a function of each sequence's shape, the dtype, head_dim and the schedule
    alone (never of num_workers, the GPU's SM count, the batch or the other heads); False asks
    for the fastest backward and promises no bits: atomic dQ adds, or at short sequences, where
    dQ is converted in the main kernel, the ordered kernel (faster there); under the
    deterministic flag False raises RuntimeError (a warning with warn_only=True, then it runs).

    schedule: a name from dashgen.list_schedules(), "auto", or a verified dashgen.Schedule
    (dashgen.load_schedule), which runs from its task table. "auto" picks the fastest order
    measured: the DASH schedules ("shift" for a full mask, "symmetric_shift" for causal) where
    one sequence's units fit on the SMs at once (up to 16,384 tokens a sequence with shift,
    32,768 with symmetric_shift on 132 SMs), else "fa3" / "spt_listed" (spt's order on a listed
    deal; "spt" with deterministic=False). A named schedule that cannot serve the problem, or
    needs more workers than it gets, raises ValueError, never falls back.

    num_workers: persistent CTAs (None: the SM count); the shift schedules run a whole multiple
    of one sequence's units of them. It decides only who runs what when. More than the SM count
    raises ValueError (they could not all be resident, and waiting on the dQ order would
    deadlock).

    softcap: FlashAttention's soft-capping (Gemma 2's attention-logit cap): 0 (the default)
    leaves the scores as they are; a positive cap c makes each scaled score s c * tanh(s / c)
    before the softmax, in the forward, in lse and through its derivative in the backward, with
    the same bit contract.

    window_size: FlashAttention's sliding window (left, right): query row i sees keys
    i + off - left .. i + off + right (off = seqlen_k - seqlen_q, bottom-right aligned as the
    causal mask), -1 leaving that side open; causal=True sets right to 0 (Mistral's and Gemma's
    local layers: (window - 1, 0)). (-1, -1), the default, is no window. A row that sees no key
    gets o = 0 and lse = -inf, a key no row sees dk = dv = 0. Schedules: "auto" (spt on the
    listed deal; spt with deterministic=False), "spt", "spt_listed", "fa3", "descending"; the
    shift orders need a full or causal mask.

    sinks: attention sinks (GPT-OSS's), a floating (heads_q,) tensor of logits, one per query
    head: each row's softmax takes exp(sinks[h]) into its denominator with no value behind it
    (o and lse are the sunk attention's); differentiable, its gradient deterministic too
    (dashgen/runtime/sinks.py).

    attention_chunk: chunked attention (Llama 4's; FlashAttention-3's attention_chunk): 0 (the
    default) none; a positive chunk C gives query row i the keys of its chunk, [p - p % C,
    p - p % C + C) with p = i + seqlen_k - seqlen_q (a row with p < 0 sees none), intersected
    with causal and window_size. The chunks run as a pack (dashgen.attention_varlen: a pack's
    schedules, "auto" by default), forward and backward, each chunk's bits its own.
    """
    if check_chunk(attention_chunk):
        _check_tensors(q, k, v)  # named in this layout, before the chunks flatten it
        return chunked_attention(q, k, v, attention_chunk, causal=causal,
                                 softmax_scale=softmax_scale, deterministic=deterministic,
                                 schedule=schedule, num_workers=num_workers,
                                 return_lse=return_lse, softcap=softcap,
                                 window_size=window_size, sinks=sinks)
    if isinstance(schedule, Schedule):
        schedule = register(schedule)  # the op carries a key string
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")
    entry = _resolve(q, k, v, causal, softmax_scale, deterministic, schedule, num_workers,
                     softcap, window_size)
    if sinks is not None:
        o, lse = _sunk_attention(q, k, v, sinks, entry)
        return (o, lse) if return_lse else o
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if traced(q):
        o, lse = torch.ops.dashgen.attention_fwd(q, k, v, *entry.options)
    elif not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        # Nothing to differentiate (inference, no_grad): the kernel without autograd's
        # bookkeeping, whose host time the GPU would wait for.
        o, lse = _eager_forward(ready(q), ready(k), ready(v), entry)
    else:
        o, lse = _EagerAttention.apply(q, k, v, entry)
    return (o, lse) if return_lse else o
