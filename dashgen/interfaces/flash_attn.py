"""FlashAttention's function signature over dashgen: replacing
`from flash_attn import flash_attn_func` with `from dashgen import flash_attn_func` is the whole
migration. The arguments are flash_attn 2.x's (the package transformers and most training code
import); what dashgen cannot do raises ValueError naming the argument, never a silent change.
"""
from __future__ import annotations

import torch

from ..runtime import op


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
    dashgen.attention). dropout_p, window_size, softcap and alibi_slopes other than their
    defaults raise ValueError.
    """
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: dashgen has no dropout, got {dropout_p}")
    if tuple(window_size) != (-1, -1):
        raise ValueError(f"window_size: dashgen has no sliding window yet, got {window_size}")
    if softcap != 0.0:
        raise ValueError(f"softcap: dashgen has no logit soft-capping, got {softcap}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: dashgen has no ALiBi bias")
    if not isinstance(return_attn_probs, bool):
        raise TypeError(f"return_attn_probs must be a bool, got {return_attn_probs!r}")
    out, lse = op.attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                            deterministic=deterministic, return_lse=True)
    return (out, lse, None) if return_attn_probs else out
