"""The packed torch op: ``dashgen.attention_varlen`` over sequences of their own lengths.

Registers ``dashgen::attention_varlen_fwd`` and ``dashgen::attention_varlen_bwd`` with
torch.library (fake kernels for torch.compile: cu_seqlens are tensors, so a new pack's lengths
trace to the same graph; autograd via register_autograd). Eager calls take a
torch.autograd.Function over the same runtime calls (dashgen.runtime.varlen), as
dashgen.attention does. No call reads the lengths on the host, so a call is CUDA-graph
capturable. Every argument is checked before any kernel launches; errors name the argument.
"""
from __future__ import annotations

import math

import torch

from ..caches import Memo
from . import checks
from .chunks import check_chunk, chunk_varlen_pack
from .op_common import Options, Validated, gradients_like, ready, register_autograd, traced
from .select import PACK_SCHEDULES, Selection, pack_selection, pack_workers, select_pack


# The kernels' grids put a pack's sequences on gridDim.z, which CUDA caps at 65535.
MAX_SEQUENCES = 65535


def _check_tensors(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        checks.tensor(name, t)
        checks.rank(name, t, 3, "total_tokens, heads, head_dim")
    checks.dtype(q)
    for name, t in (("k", k), ("v", v)):
        checks.same_dtype(name, t, q)
    checks.same_head_dim("k", k, q)
    checks.head_dim_v(q, k, v)
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v has shape {tuple(v.shape)} but k has shape {tuple(k.shape)}")
    for name, t in (("q", q), ("k", k)):
        if t.shape[1] == 0:
            raise ValueError(f"{name} has 0 heads (shape {tuple(t.shape)})")
    checks.heads_divide(q.shape[1], k.shape[1])
    checks.head_dim(q)
    checks.last_dim_contiguous(q, k, v)


def _check_lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor of batch + 1 offsets, got "
                             f"dtype {cu.dtype} and shape {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} offsets but cu_seqlens_k has "
                         f"{cu_seqlens_k.shape[0]}: one per sequence boundary each")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    # Without reading the offsets: batch sequences of at most max_seqlen cannot hold more.
    batch = cu_seqlens_q.shape[0] - 1
    if batch > MAX_SEQUENCES:
        raise ValueError(f"cu_seqlens_q: {batch} sequences; the packed kernels take at most "
                         f"{MAX_SEQUENCES} (one grid row each)")
    for name, total, longest in (("max_seqlen_q", q.shape[0], max_seqlen_q),
                                 ("max_seqlen_k", k.shape[0], max_seqlen_k)):
        if longest * batch < total:
            raise ValueError(f"{name}={longest}: {batch} sequences of at most {longest} tokens "
                             f"cannot hold the {total} packed tokens")


def _check_cpu_offsets(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> None:
    """The values of offsets on the CPU, every call (a pack's lengths change from call to
    call); offsets on the GPU are read only by the kernels (no host synchronization)."""
    for cu, name, total, longest in ((cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q),
                                     (cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k)):
        if cu.device.type != "cpu" or torch.compiler.is_compiling():
            continue
        values = cu.tolist()
        lengths = [b - a for a, b in zip(values, values[1:])]
        if values[0] != 0 or any(n < 0 for n in lengths) or values[-1] != total:
            raise ValueError(f"{name} must rise from 0 to {total} (the packed tokens), got "
                             f"{values[:8]}{'...' if len(values) > 8 else ''}")
        if lengths and max(lengths) > longest:
            raise ValueError(f"{name}: a sequence of {max(lengths)} tokens exceeds the "
                             f"max_seqlen given for it ({longest})")


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                        causal=False, softmax_scale=None, deterministic=None, schedule="auto",
                        num_workers=None, softcap=0.0, window_size=(-1, -1)) -> Options:
    """Validate attention_varlen's arguments and resolve its defaults (ValueError/TypeError
    naming the argument). A signature that passed once (shapes, dtypes, devices, the longest
    lengths and the options) skips the checks that read no values; CPU offsets are checked
    every call, and the deterministic flag is read at each."""
    return _resolve((q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                    (causal, softmax_scale, deterministic, schedule, num_workers,
                     softcap, window_size)).options


class _Validated(Validated):
    """An attention_varlen signature's entry: its plan is the pack's Selection
    (select.pack_selection), its forward and backward the runtime's prepared packed calls
    (runtime.varlen.PackForwardCall, PackBackwardCall), made for the signature's sizes."""

    __slots__ = ()

    def prepare_forward(self, q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
        call = self.forward = _runtime().pack_forward_call(
            self.plan.forward, q.shape, k.shape, cu_seqlens_q.shape[0] - 1, int(max_seqlen_q),
            int(max_seqlen_k), self.options.softmax_scale, q.device, self.options.softcap,
            self.options.window)
        return call

    def prepare_backward(self, q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
        opts = self.options
        call = self.backward = _runtime().pack_backward_call(
            self.plan.backward, q.shape, k.shape, cu_seqlens_q.shape[0] - 1, int(max_seqlen_q),
            int(max_seqlen_k), opts.softmax_scale, opts.deterministic, opts.num_workers,
            q.device, opts.softcap, opts.window)
        return call


def _resolve(args, options) -> _Validated:
    """The signature's validated entry: check_varlen_inputs' Options, the pack's Selection
    (None while torch.compile traces, where only the custom ops run) and the prepared calls."""
    # The flag is read at call time: with deterministic=None its value is part of the key.
    flag = torch.are_deterministic_algorithms_enabled()
    key = _signature(args, options, flag)
    checked = []  # whether _check_all ran (it checks CPU offsets before the device)

    def check():
        checked.append(True)
        return _Validated(*_check_all(args, options, flag), key)
    resolved = check() if key is None else _VALIDATED.get(key, check)
    if not checked:
        _check_cpu_offsets(*args)
    if options[2] is False and flag:  # deterministic=False under the flag
        checks.refuse_nondeterministic()
    return resolved


# The entries of signatures that passed every check (a training loop repeats them).
_VALIDATED: Memo[_Validated] = Memo(None, max_entries=1024)


def _signature(args, options, flag):
    """Everything the value-free checks read, or None where a call must take them (tracing,
    tensor subclasses, unhashable options); option types are part of it, and with
    deterministic=None the flag."""
    q, k, v, cu_q, cu_k, max_q, max_k = args
    if torch.compiler.is_compiling() or not all(type(t) is torch.Tensor
                                                for t in (q, k, v, cu_q, cu_k)):
        return None
    key = (tuple((t.shape, t.dtype, t.stride(-1), t.device) for t in (q, k, v, cu_q, cu_k)),
           max_q, max_k, type(max_q), type(max_k), options, tuple(map(type, options)),
           flag if options[2] is None else None)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _check_all(args, options, flag) -> tuple[Options, Selection | None]:
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = args
    causal, softmax_scale, deterministic, schedule, num_workers, softcap, window_size = options
    _check_tensors(q, k, v)
    _check_lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _check_cpu_offsets(*args)
    checks.options(causal, softmax_scale, deterministic, "auto", num_workers)
    cap = checks.softcap(softcap)
    # A window opened by the longest lengths removes no key of any sequence.
    causal, window = checks.window(window_size, causal, max_seqlen_q, max_seqlen_k)
    if not isinstance(schedule, str):
        raise ValueError(f"schedule must be 'auto' or one of {PACK_SCHEDULES} for a pack, got "
                         f"{schedule!r}")
    ordered = flag if deterministic is None else deterministic
    # The schedule against the mask, where the kernels are chosen (ValueError naming it), and
    # the selection the eager launches take. While torch.compile traces, select_pack answers
    # without pack_selection's memo: the trace needs only the schedule and the tiles, and
    # dynamo can trace a memo's hit but not its miss (its lock); select_pack reads one memo
    # (problem_for), which the eager calls of the same head_dim, mask and GQA fill.
    chosen = ("bf16" if q.dtype == torch.bfloat16 else "fp16", q.shape[2], bool(causal),
              schedule, ordered, q.shape[1] != k.shape[1], window != (-1, -1))
    sel = (select_pack(*chosen[:4], deterministic=chosen[4], gqa=chosen[5], window=chosen[6])
           if torch.compiler.is_compiling() else pack_selection(*chosen)).soft_capped(
               cap > 0).with_head_dim_v(v.shape[-1])
    sm_count = checks.device(q, k, v)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.device != q.device and cu.device.type != "cpu":
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    if num_workers is not None and num_workers > sm_count:
        raise ValueError(f"num_workers={num_workers} exceeds this GPU's {sm_count} SMs")
    workers = pack_workers(sel.schedule, int(max_seqlen_k), sel.backward.block_n,
                           sm_count if num_workers is None else num_workers, bool(causal))
    scale = 1.0 / math.sqrt(q.shape[2]) if softmax_scale is None else float(softmax_scale)
    return (Options(bool(causal), scale, ordered, sel.schedule, workers, cap, *window),
            None if torch.compiler.is_compiling() else sel)


def _runtime():
    from . import varlen
    return varlen


def _on_device(cu: torch.Tensor, device: torch.device) -> torch.Tensor:
    """cu_seqlens where the kernels read them: CPU offsets (checked on the host) are copied."""
    return cu if cu.device == device else cu.to(device, non_blocking=True)


# The custom ops' kernel calls (the eager calls take their signature's prepared ones).

def _run_forward(q, k, v, cu_q, cu_k, max_q, max_k, opts: Options):
    return _runtime().forward(ready(q), ready(k), ready(v), cu_q, cu_k, int(max_q),
                              int(max_k), causal=opts.causal, softmax_scale=opts.softmax_scale,
                              softcap=opts.softcap, window=opts.window)


def _run_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, opts: Options):
    return _runtime().backward(ready(do), ready(q), ready(k), ready(v),
                               ready(o), lse, cu_q, cu_k, int(max_q), int(max_k),
                               causal=opts.causal, softmax_scale=opts.softmax_scale,
                               deterministic=opts.deterministic, schedule=opts.schedule,
                               workers=opts.num_workers, softcap=opts.softcap,
                               window=opts.window)


def _eager_forward(q, k, v, cu_q, cu_k, max_q, max_k, entry: _Validated):
    """o and lse from the signature's prepared forward (q, k and v ready)."""
    call = entry.forward or entry.prepare_forward(q, k, cu_q, max_q, max_k)
    return call(q, k, v, cu_q, cu_k)


@torch.library.custom_op("dashgen::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                         softmax_scale: float, deterministic: bool, schedule: str,
                         num_workers: int, softcap: float = 0.0, window_left: int = -1,
                         window_right: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """o (like q) and lse (float32, heads_q * total_q: sequence b's (heads_q, seqlen) block
    from heads_q * cu_seqlens_q[b]); lse is not differentiable."""
    return _run_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        Options(causal, softmax_scale, deterministic, schedule, num_workers,
                                softcap, window_left, window_right))


@attention_varlen_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
              softmax_scale, deterministic, schedule, num_workers, softcap=0.0, window_left=-1,
              window_right=-1):
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]))  # contiguous, V's width
    return o, q.new_empty((q.shape[0] * q.shape[1],), dtype=torch.float32)


@torch.library.custom_op("dashgen::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         o: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         causal: bool, softmax_scale: float, deterministic: bool, schedule: str,
                         num_workers: int, softcap: float = 0.0, window_left: int = -1,
                         window_right: int = -1
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, Options(causal, softmax_scale, deterministic, schedule,
                                               num_workers, softcap, window_left, window_right))


@attention_varlen_bwd.register_fake
def _bwd_fake(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              causal, softmax_scale, deterministic, schedule, num_workers, softcap=0.0,
              window_left=-1, window_right=-1):
    return gradients_like(q, k, v)


# The offsets are saved with the tensors; the longest lengths and the options ride along.
register_autograd(attention_varlen_fwd, torch.ops.dashgen.attention_varlen_bwd, tensors=2)


class _EagerVarlen(torch.autograd.Function):
    """Eager autograd over the signature's prepared packed calls. The forward also finds (or,
    once, prepares) the backward's on the caller's thread, so autograd's device thread only
    allocates and launches."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, entry: _Validated):
        q, k, v = ready(q), ready(k), ready(v)
        o, lse = _eager_forward(q, k, v, cu_q, cu_k, max_q, max_k, entry)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.call = entry.backward or entry.prepare_backward(q, k, cu_q, max_q, max_k)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = ctx.call(ready(grad_o), ready(q), ready(k), ready(v), ready(o), lse, cu_q,
                              cu_k)
        return dq, dk, dv, None, None, None, None, None


def lse_index(cu_seqlens_q: torch.Tensor, heads_q: int, total: int,
              device: torch.device) -> torch.Tensor:
    """Where the kernels keep (head h, token t)'s lse (each sequence's (heads_q, seqlen) block):
    an int64 (heads_q, total_q) index into their flat lse, formed on the GPU without reading the
    lengths on the host. A permutation of the flat positions."""
    tokens = torch.arange(total, device=device, dtype=torch.int64)
    cu = cu_seqlens_q.to(torch.int64)
    seq = torch.searchsorted(cu[1:], tokens, right=True)
    start = cu[seq]
    length = cu[seq + 1] - start
    heads = torch.arange(heads_q, device=device, dtype=torch.int64)[:, None]
    return heads_q * start[None, :] + heads * length[None, :] + (tokens - start)[None, :]


def lse_by_head(lse: torch.Tensor, cu_seqlens_q: torch.Tensor, heads_q: int) -> torch.Tensor:
    """The kernels' lse (each sequence's (heads_q, seqlen) block) as FlashAttention lays it out:
    (heads_q, total_q)."""
    return lse[lse_index(cu_seqlens_q, heads_q, lse.numel() // heads_q, lse.device)]


def _sunk_varlen(q, k, v, cu_q, cu_k, max_q, max_k, sinks, entry: _Validated):
    """(o, lse by head) of a pack with attention sinks (runtime.sinks) over the packed kernels:
    the pack as a batch of one, its lse (heads_q, total_q), the kernels' own layout restored
    for their backward (lse_index, a permutation)."""
    from .sinks import SinkAttention, check_sinks
    check_sinks(sinks, q, heads_dim=1)
    opts = entry.options
    q, k, v = ready(q), ready(k), ready(v)
    index = lse_index(cu_q, q.shape[1], q.shape[0], q.device)
    if traced(q):
        kernel_forward = lambda *t: torch.ops.dashgen.attention_varlen_fwd(  # noqa: E731
            *t, cu_q, cu_k, max_q, max_k, *opts)
        kernel_backward = lambda *t: torch.ops.dashgen.attention_varlen_bwd(  # noqa: E731
            *t, cu_q, cu_k, max_q, max_k, *opts)
    else:
        kernel_forward = lambda *t: _eager_forward(*t, cu_q, cu_k, max_q, max_k,  # noqa: E731
                                                   entry)
        kernel_backward = lambda *t: _run_backward(*t, cu_q, cu_k, max_q, max_k,  # noqa: E731
                                                   opts)

    def forward(q, k, v):
        o, lse = kernel_forward(q, k, v)
        return o[None], lse[index][None]

    def backward(do, q, k, v, o_sunk, lse_sunk):
        flat = torch.empty(index.numel(), dtype=lse_sunk.dtype, device=lse_sunk.device)
        flat[index.flatten()] = lse_sunk[0].flatten()
        return kernel_backward(do[0].contiguous(), q, k, v, o_sunk[0].contiguous(), flat)

    o, lse = SinkAttention.apply(q, k, v, sinks, forward, backward)
    return o[0], lse[0]


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False,
                     softmax_scale: float | None = None, deterministic: bool | None = None,
                     schedule: str = "auto", return_lse: bool = False,
                     num_workers: int | None = None, softcap: float = 0.0,
                     window_size: tuple[int, int] = (-1, -1), sinks: torch.Tensor | None = None,
                     attention_chunk: int = 0):
    """Attention over a packed batch of sequences of their own lengths, bitwise reproducible
    and batch-invariant: each sequence's o, dq, dk, dv are the bits dashgen.attention gives it
    alone (batch 1), wherever it sits in the pack and whatever else is packed with it.

    q: (total_q, heads_q, head_dim); k, v: (total_k, heads_kv, head_dim), bf16/fp16 CUDA
    tensors, heads_q a multiple of heads_kv; head_dim 64, 96, 128, 192 or 256. cu_seqlens_q/k:
    int32 (batch + 1) offsets rising from 0 to total_q / total_k, sequence b's tokens
    [cu_seqlens[b], cu_seqlens[b + 1]); sequences of 0 and 1 tokens are allowed, and seqlen_q
    may differ from seqlen_k per sequence. On the GPU they are read only by the kernels (no
    host synchronization: the call is CUDA-graph capturable), so they must be right: every
    sequence at most max_seqlen_q / max_seqlen_k long (as FlashAttention requires). On the CPU
    they are checked and copied to the GPU each call (not capturable).

    causal masks bottom-right per sequence: row i of a sequence sees its keys j <= i +
    seqlen_k - seqlen_q (a row that sees none gets o = 0, lse = -inf). deterministic: as in
    dashgen.attention (None follows torch.use_deterministic_algorithms). schedule: "auto"
    (hybrid: shift / symmetric_shift for each sequence of at most 64 KV tiles, i.e. 8,192
    keys, fa3 / descending for longer ones) or a named schedule, dealt over the pack on the GPU; shift and
    symmetric_shift need the longest sequence's units on the SMs at once.
    softcap, window_size and sinks: as in dashgen.attention, per sequence (0: uncapped; (-1, -1):
    no window, a window takes spt, fa3 or descending, "auto" spt; sinks one logit per query
    head).
    attention_chunk: as in dashgen.attention, per sequence (0: no chunks). The chunks run as a
    pack of their own (dashgen/runtime/chunks.py), formed on the offsets' device: each sequence
    becomes ceil(max_seqlen_k / chunk) chunks and ceil(max_seqlen_q / chunk) leading sequences
    for rows that see no key (empty unless seqlen_q > seqlen_k), so a call launches for that
    many sequences.
    Returns o, or (o, lse) with lse float32 (heads_q, total_q), not differentiable.
    """
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")
    if check_chunk(attention_chunk):
        # The pack as given is checked (errors name its offsets), then its chunks run.
        _check_tensors(q, k, v)
        _check_lengths(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        _check_cpu_offsets(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = chunk_varlen_pack(
            cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), attention_chunk)
    entry = _resolve((q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                     (causal, softmax_scale, deterministic, schedule, num_workers, softcap,
                      window_size))
    cu_q, cu_k = _on_device(cu_seqlens_q, q.device), _on_device(cu_seqlens_k, q.device)
    if sinks is not None:
        o, lse = _sunk_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, sinks, entry)
        return (o, lse) if return_lse else o
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if traced(q):
        o, lse = torch.ops.dashgen.attention_varlen_fwd(q, k, v, cu_q, cu_k, max_seqlen_q,
                                                        max_seqlen_k, *entry.options)
    elif not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        o, lse = _eager_forward(ready(q), ready(k), ready(v), cu_q, cu_k, max_seqlen_q,
                                max_seqlen_k, entry)
    else:
        o, lse = _EagerVarlen.apply(q, k, v, cu_q, cu_k, max_seqlen_q, max_seqlen_k, entry)
    if not return_lse:
        return o
    return o, lse_by_head(lse, cu_q, q.shape[1])
