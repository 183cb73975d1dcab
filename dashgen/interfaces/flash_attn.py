"""FlashAttention's function signature over dashgen: replacing
`from flash_attn import flash_attn_func` with `from dashgen import flash_attn_func` is the whole
migration. The arguments are flash_attn 2.x's (the package transformers and most training code
import); what dashgen cannot do raises ValueError naming the argument, never a silent change.
"""
from __future__ import annotations

import torch

from ..runtime import op


def _refuse_unsupported(dropout_p, alibi_slopes, return_attn_probs, block_table=None) -> None:
    """ValueError naming each flash_attn argument dashgen cannot honour."""
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: dashgen has no dropout, got {dropout_p}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: dashgen has no ALiBi bias")
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be a bool, got {return_attn_probs!r}")
    if block_table is not None:
        raise ValueError("block_table: dashgen has no paged KV cache")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None,
                    deterministic: bool | None = None, return_attn_probs: bool = False):
    """q (batch, seqlen_q, heads_q, head_dim), k and v (batch, seqlen_k, heads_kv, head_dim),
    causal aligned bottom-right as in FlashAttention 2.1 and later. Returns out, or with
    return_attn_probs=True (out, softmax_lse, None): the logsumexp (batch, heads_q, seqlen_q,
    float32) where flash_attn returns it, and None for the dropout mask it returns.

    deterministic: None (dashgen's default; flash_attn's is False) follows
    torch.use_deterministic_algorithms; True orders the dQ sums so the backward is bitwise
    reproducible; False under the deterministic flag raises RuntimeError (see
    dashgen.attention). softcap: flash_attn's soft-capping (0: none; see dashgen.attention).
    window_size: flash_attn's sliding window (see dashgen.attention). dropout_p and
    alibi_slopes other than their defaults raise ValueError.
    """
    _refuse_unsupported(dropout_p, alibi_slopes, return_attn_probs)
    out, lse = op.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                            deterministic=deterministic, return_lse=True, softcap=softcap,
                            window_size=window_size)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None,
                           deterministic: bool | None = None, return_attn_probs: bool = False,
                           block_table: torch.Tensor | None = None):
    """flash_attn 2.x's packed function over dashgen.attention_varlen: q (total_q, heads_q,
    head_dim), k and v (total_k, heads_kv, head_dim), int32 cu_seqlens on the GPU. Returns out,
    or with return_attn_probs=True (out, softmax_lse, None), softmax_lse (heads_q, total_q)
    float32 as flash_attn lays it out. deterministic and the refused arguments as in
    flash_attn_func; block_table (a paged KV cache) raises ValueError too. window_size: as in
    dashgen.attention_varlen."""
    _refuse_unsupported(dropout_p, alibi_slopes, return_attn_probs, block_table)
    from ..runtime.op_varlen import attention_varlen
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                deterministic=deterministic, return_lse=True, softcap=softcap,
                                window_size=window_size)
    return (out, lse, None) if return_attn_probs else out
