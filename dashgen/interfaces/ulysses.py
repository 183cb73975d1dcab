"""Context parallelism over heads (all-to-all, "Ulysses"): the same bits at every CP size.

Each rank of a torch.distributed group holds a contiguous shard of the sequence, all heads. One
all-to-all gives each rank the whole sequence for heads_q / P query heads and heads_kv / P KV
heads (P the group's size); dashgen.attention runs there; a second all-to-all returns each rank
its shard of o. A rank's attention call is the single-GPU call restricted to its heads, and
dashgen's bits never depend on the other heads or the batch, so o, lse, dq, dk and dv are the
bits of the unsharded call at every P that divides heads_kv, for every schedule (the plan:
lab/notes/context-parallel-plan.md). The all-to-alls move values, never add them.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single


def _size(group) -> int:
    return dist.get_world_size(group)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d (batch, seqlen / P, heads, head_dim), or 3-d "
                             f"(tokens / P, heads, head_dim) for a pack, got {t.dim()}-d")
    heads_q, heads_kv = q.shape[2], k.shape[2]
    for name, heads in (("heads_q", heads_q), ("heads_kv", heads_kv)):
        if heads % ranks:
            raise ValueError(f"{name}={heads} must be a multiple of the group's {ranks} ranks: "
                             f"each rank takes whole heads (and each KV head's query heads)")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")


def _heads_to_ranks(x: torch.Tensor, ranks: int, group) -> torch.Tensor:
    """(batch, seqlen / P, heads, d), this rank's tokens -> (batch, seqlen, heads / P, d), this
    rank's heads: block j of the input (heads j*heads/P ...) goes to rank j, and block i of the
    output comes from rank i (tokens i*seqlen/P ...), so the output is in token order."""
    batch, shard, heads, d = x.shape
    send = x.reshape(batch, shard, ranks, heads // ranks, d).permute(2, 0, 1, 3, 4).contiguous()
    recv = all_to_all_single(torch.empty_like(send), send, group=group)
    return recv.permute(1, 0, 2, 3, 4).reshape(batch, ranks * shard, heads // ranks, d)


def _ranks_to_heads(x: torch.Tensor, ranks: int, group) -> torch.Tensor:
    """The inverse of _heads_to_ranks: (batch, seqlen, heads / P, d) -> (batch, seqlen / P,
    heads, d)."""
    batch, seqlen, local, d = x.shape
    shard = seqlen // ranks
    send = x.reshape(batch, ranks, shard, local, d).permute(1, 0, 2, 3, 4).contiguous()
    recv = all_to_all_single(torch.empty_like(send), send, group=group)
    return recv.permute(1, 2, 0, 3, 4).reshape(batch, shard, ranks * local, d)


def whole_call_schedule(q_shard: torch.Tensor, k_shard: torch.Tensor, ranks: int, causal: bool,
                        deterministic: bool | None, schedule: str) -> str:
    """The schedule the unsharded call would run: "auto" resolved on the whole problem (all
    heads, all tokens), so that every rank's call, whose problem has fewer heads, runs the same
    one (lab/notes/context-parallel-plan.md). Through runtime.select.plan, the calls' memoized
    door to the selection: a training step's repeated shapes cost one lookup."""
    if schedule != "auto":
        return schedule
    from ..runtime.device import DTYPE_NAMES, sm_count
    from ..runtime.select import Overrides, plan
    dtype = DTYPE_NAMES.get(q_shard.dtype)
    if dtype is None:
        return schedule  # dashgen.attention refuses the dtype by name
    batch, shard_q, heads_q, head_dim = q_shard.shape
    ordered = (torch.are_deterministic_algorithms_enabled() if deterministic is None
               else bool(deterministic))
    whole = plan((batch, shard_q * ranks, heads_q, head_dim),
                 (batch, k_shard.shape[1] * ranks, *k_shard.shape[2:]),
                 dtype, bool(causal), ordered, False, "auto", None, sm_count(q_shard.device),
                 Overrides())
    return whole.schedule


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                      causal: bool = False, softmax_scale: float | None = None,
                      deterministic: bool | None = None, schedule: str = "auto",
                      attention: Callable | None = None) -> torch.Tensor:
    """Attention of a sequence sharded over the ranks of `group` (None: the default group).

    q: (batch, seqlen_q / P, heads_q, head_dim), k and v: (batch, seqlen_k / P, heads_kv,
    head_dim): rank r's contiguous shard of the tokens (rank 0 the first), every rank's shard as
    long. heads_q and heads_kv must be multiples of P. Returns rank r's shard of o, with autograd
    (the backward's all-to-alls mirror the forward's). The other options are dashgen.attention's;
    schedule="auto" is resolved on the whole problem, so each rank runs what the unsharded call
    would. `attention` replaces dashgen.attention (the same signature; its "auto" passed as is),
    e.g. to run the pattern without a GPU.
    """
    ranks = _size(group)
    _check(q, k, v, ranks)
    if attention is None:
        from ..runtime.op import attention
        schedule = whole_call_schedule(q, k, ranks, causal, deterministic, schedule)
    if ranks == 1:
        return attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                         deterministic=deterministic, schedule=schedule)
    o = attention(_heads_to_ranks(q, ranks, group), _heads_to_ranks(k, ranks, group),
                  _heads_to_ranks(v, ranks, group), causal=causal, softmax_scale=softmax_scale,
                  deterministic=deterministic, schedule=schedule)
    return _ranks_to_heads(o, ranks, group)


def ulysses_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                             max_seqlen_q: int, max_seqlen_k: int, *, group=None,
                             causal: bool = False, softmax_scale: float | None = None,
                             deterministic: bool | None = None, schedule: str = "auto",
                             attention: Callable | None = None) -> torch.Tensor:
    """ulysses_attention for a packed batch (dashgen.attention_varlen's layout).

    q: (total_q / P, heads_q, head_dim), k and v: (total_k / P, heads_kv, head_dim): rank r's
    contiguous share of the packed tokens (a sequence may straddle ranks), every rank's share as
    long. cu_seqlens_q/k, max_seqlen_q/k describe the whole pack, the same on every rank. Each
    rank runs attention_varlen on the whole pack for its heads; a sequence's bits are those it
    has alone, as in any pack. Returns rank r's share of o. `attention` replaces
    dashgen.attention_varlen (the same signature).
    """
    ranks = _size(group)
    # A pack's (tokens, heads, head_dim) checked as one sequence of a batch of 1.
    _check(*(t[None] if isinstance(t, torch.Tensor) and t.dim() == 3 else t
             for t in (q, k, v)), ranks)
    if attention is None:
        from ..runtime.op_varlen import attention_varlen as attention
    gather = lambda x: _heads_to_ranks(x[None], ranks, group)[0]  # noqa: E731
    o = attention(*(gather(t) if ranks > 1 else t for t in (q, k, v)), cu_seqlens_q,
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                  softmax_scale=softmax_scale, deterministic=deterministic, schedule=schedule)
    return _ranks_to_heads(o[None], ranks, group)[0] if ranks > 1 else o
