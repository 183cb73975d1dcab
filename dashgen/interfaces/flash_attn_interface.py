"""FlashAttention-3's Python interface over dashgen: its hopper package's `flash_attn_interface`
module names and signatures, so `from flash_attn_interface import flash_attn_func` becomes
`from dashgen.interfaces.flash_attn_interface import flash_attn_func`. Return values are FA3's
(out, or (out, softmax_lse) with return_attn_probs=True). What dashgen cannot do raises
ValueError naming the argument; the knobs that only decide FA3's own launch are taken as such.
The training functions: flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func.
Like FA3 they take any head_dim up to 256: one dashgen has no kernel of runs zero-padded to the
next (run_padded). FA3's decoding functions (flash_attn_with_kvcache, flash_attn_combine,
get_scheduler_metadata) import and raise NotImplementedError naming themselves.
"""
from __future__ import annotations

import torch

from ..runtime import op
from ..runtime.chunks import check_chunk
from .flash_attn import run_padded, unstack
from ..runtime.device import sm_count


def _refuse_unsupported(qv, q_descale, k_descale, v_descale, attention_chunk,
                        num_splits) -> None:
    """ValueError naming each FA3 argument dashgen cannot honour."""
    if qv is not None:
        raise ValueError("qv: dashgen has no extra query-value product (FA3's qv)")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale),
                        ("v_descale", v_descale)):
        if value is not None:
            raise ValueError(f"{name}: dashgen has no fp8 inputs")
    check_chunk(attention_chunk)
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise ValueError(f"num_splits must be a non-negative int, got {num_splits!r}")


def _options(q: torch.Tensor, deterministic, sm_margin) -> dict:
    """dashgen's deterministic and num_workers for FA3's deterministic and sm_margin.
    deterministic=False (FA3's default) promises no bits, so dashgen follows
    torch.use_deterministic_algorithms there (its own default); True orders the dQ sums.
    sm_margin leaves that many SMs to other kernels: dashgen runs on the rest (its bits never
    depend on the worker count)."""
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
    if not isinstance(sm_margin, int) or isinstance(sm_margin, bool) or sm_margin < 0:
        raise ValueError(f"sm_margin must be a non-negative int, got {sm_margin!r}")
    workers = None
    if sm_margin:
        sms = sm_count(q.device)
        if sm_margin >= sms:
            raise ValueError(f"sm_margin={sm_margin} leaves none of this GPU's {sms} SMs")
        workers = sms - sm_margin
    return dict(deterministic=True if deterministic else None, num_workers=workers)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, learnable_sink=None):
    """FA3's flash_attn_func: q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k,
    heads_kv, head_dim), causal bottom-right; window_size=(-1, 0) is the causal mask. Returns
    out, or (out, softmax_lse) with softmax_lse (batch, heads_q, seqlen_q) float32. num_splits
    and pack_gqa decide only how FA3 launches its forward. softcap and window_size as in
    dashgen.attention. attention_chunk (Llama 4's chunked attention): each query sees only the
    keys of its chunk (within its window), run as a pack of the chunks, forward and backward
    (FA3 itself has no chunked backward), each chunk's bits its own. learnable_sink (newer
    FlashAttention interfaces' name for GPT-OSS's sinks): dashgen.attention's sinks, one logit
    per query head. A head_dim up to 256 that dashgen has no kernel of runs zero-padded to
    the next one it has (run_padded), as FA3 pads into its own."""
    _refuse_unsupported(qv, q_descale, k_descale, v_descale, attention_chunk, num_splits)
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be a bool, got {return_attn_probs!r}")
    options = _options(q, deterministic, sm_margin)
    out, lse = run_padded(
        lambda q, k, v, scale: op.attention(
            q, k, v, causal=causal, return_lse=True, softmax_scale=scale, softcap=softcap,
            window_size=window_size, sinks=learnable_sink, attention_chunk=attention_chunk,
            **options),
        q, k, v, softmax_scale)
    return (out, lse) if return_attn_probs else out


def used_pack(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    """FA3's seqused_q / seqused_k (sequence b uses only the first seqused[b] of its tokens) as
    a pack of three sequences per sequence: its used queries against its used keys, its unused
    queries against no key (o = 0, lse = -inf, dq = 0), and no query against its unused keys
    (dk = dv = 0). The used tokens' bits are then the used sequence's alone, and nothing past
    seqused is read into a used token's result. Formed on the offsets' device, without reading
    them on the host; offsets past a sequence's end do not rise, and the kernels refuse such a
    pack (PackOffsetsError)."""
    for name, used, cu in (("seqused_q", seqused_q, cu_seqlens_q),
                           ("seqused_k", seqused_k, cu_seqlens_k)):
        if used is None:
            continue
        if not torch.is_tensor(used) or used.dtype != torch.int32 or used.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor, got "
                             f"{getattr(used, 'dtype', type(used).__name__)} "
                             f"{tuple(getattr(used, 'shape', ()))}")
        if torch.is_tensor(cu) and used.shape[0] != cu.shape[0] - 1:
            raise ValueError(f"{name} has {used.shape[0]} entries for {cu.shape[0] - 1} "
                             f"sequences")
        if torch.is_tensor(cu) and used.device != cu.device:
            raise ValueError(f"{name} is on {used.device} but its cu_seqlens on {cu.device}")

    def used_or_all(used, cu):
        return cu[1:] - cu[:-1] if used is None else used
    uq, uk = used_or_all(seqused_q, cu_seqlens_q), used_or_all(seqused_k, cu_seqlens_k)
    start_q, start_k = cu_seqlens_q[:-1], cu_seqlens_k[:-1]
    cu_q = torch.stack((start_q, start_q + uq, cu_seqlens_q[1:]), 1).flatten()
    cu_k = torch.stack((start_k, start_k + uk, start_k + uk), 1).flatten()
    return (torch.cat((cu_q, cu_seqlens_q[-1:])).to(torch.int32),
            torch.cat((cu_k, cu_seqlens_k[-1:])).to(torch.int32))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, learnable_sink=None):
    """FA3's flash_attn_varlen_func over dashgen.attention_varlen: q (total_q, heads_q,
    head_dim), k and v (total_k, heads_kv, head_dim), int32 cu_seqlens. Returns out, or
    (out, softmax_lse) with softmax_lse (heads_q, total_q) float32, FA3's layout. seqused_q /
    seqused_k: the tokens of each sequence that count (used_pack); the others get o = 0 and
    zero gradients. attention_chunk: each sequence's chunks, as in flash_attn_func (of its
    used tokens where seqused is given). Head dims dashgen has no kernel of run padded, as in
    flash_attn_func."""
    _refuse_unsupported(qv, q_descale, k_descale, v_descale, attention_chunk, num_splits)
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be a bool, got {return_attn_probs!r}")
    if seqused_q is not None or seqused_k is not None:
        cu_seqlens_q, cu_seqlens_k = used_pack(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    from ..runtime.op_varlen import attention_varlen
    options = _options(q, deterministic, sm_margin)
    out, lse = run_padded(
        lambda q, k, v, scale: attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
            softmax_scale=scale, return_lse=True, softcap=softcap, window_size=window_size,
            sinks=learnable_sink, attention_chunk=attention_chunk, **options),
        q, k, v, softmax_scale)
    return (out, lse) if return_attn_probs else out


def _unpack_qkv(qkv, num_heads_q):
    """q, k, v of FA3's packed layouts: (batch, seqlen, 3, heads, head_dim), or with num_heads_q
    (batch, seqlen, heads_q + 2 * heads_kv, head_dim), the query heads first, then the key
    heads, then the value heads (GQA/MQA)."""
    if not torch.is_tensor(qkv) or qkv.dim() == 5:  # num_heads_q is not read there, as in FA3
        return unstack(qkv, 3, "qkv", 2, "batch, seqlen, 3, heads, head_dim")
    if qkv.dim() != 4:
        raise ValueError("qkv must be (batch, seqlen, 3, heads, head_dim) or, with num_heads_q, "
                         f"(batch, seqlen, heads_q + 2 * heads_kv, head_dim); got "
                         f"{tuple(qkv.shape)}")
    if not isinstance(num_heads_q, int) or isinstance(num_heads_q, bool) or num_heads_q < 1:
        raise ValueError("num_heads_q must be a positive int with a 4-dim qkv (its query heads "
                         f"come first along dim 2), got {num_heads_q!r}")
    heads_kv, rest = divmod(qkv.shape[2] - num_heads_q, 2)
    if heads_kv < 1 or rest:
        raise ValueError(f"qkv's {qkv.shape[2]} heads are not num_heads_q={num_heads_q} query "
                         "heads and two equal groups of key and value heads")
    return qkv.split([num_heads_q, heads_kv, heads_kv], dim=2)


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """FA3's flash_attn_qkvpacked_func: q, k and v stacked in one tensor (_unpack_qkv's
    layouts), otherwise flash_attn_func. The gradient arrives in qkv's layout; dashgen's kernels
    read each of q, k and v contiguous, so the stacked layout costs a copy of each (FA3 reads the
    strided views directly)."""
    q, k, v = _unpack_qkv(qkv, num_heads_q)
    return flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                           q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                           window_size=window_size, attention_chunk=attention_chunk,
                           softcap=softcap, deterministic=deterministic, sm_margin=sm_margin,
                           return_attn_probs=return_attn_probs)


def _not_served(name: str, what: str):
    """FA3's inference-only functions: importable, so that a model file naming them beside the
    training functions still loads, and refused by name when called."""
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{name}: dashgen serves attention for training; {what} is "
                                  "not served (use FlashAttention-3's own for it)")
    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"FA3's {name}: {what}, not served by dashgen (raises NotImplementedError)."
    return refuse


flash_attn_with_kvcache = _not_served("flash_attn_with_kvcache", "decoding against a KV cache")
flash_attn_combine = _not_served("flash_attn_combine", "combining split-KV partial outputs")
get_scheduler_metadata = _not_served("get_scheduler_metadata",
                                     "FA3's split-KV decoding scheduler")
