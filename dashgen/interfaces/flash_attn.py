"""FlashAttention's function signature over dashgen: replacing
`from flash_attn import flash_attn_func` with `from dashgen import flash_attn_func` is the whole
migration. The arguments are flash_attn 2.x's (the package transformers and most training code
import); what dashgen cannot do raises ValueError naming the argument, never a silent change.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..codegen.variants import served_head_dims
from ..runtime import op

# FlashAttention (2.x and FA3) takes any head_dim up to this, computing it in the next of its
# kernels' widths.
FLASH_MAX_HEAD_DIM = 256


def padded_width(q, k, v) -> int | None:
    """The served head_dim that q, k and v are zero-padded to, as FlashAttention pads a
    head_dim it has no kernel of (40, 59, 160, 224 ...) into its next kernel: the narrowest
    served one above theirs. None where no padding applies: a served head_dim, V's width not
    q's (MLA's 192/128 runs as it is), past 256, or not tensors; dashgen's checks then take
    them as they are."""
    if not all(torch.is_tensor(t) and t.dim() >= 1 for t in (q, k, v)):
        return None
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d or d in served_head_dims():
        return None
    if not 0 < d <= FLASH_MAX_HEAD_DIM:
        return None
    return min(w for w in served_head_dims() if w > d)


def run_padded(call, q, k, v, softmax_scale):
    """call(q, k, v, softmax_scale) -> (out, lse), at a head_dim dashgen serves: q, k and v
    padded with zero columns where padded_width says so. The zeros add nothing to a score and
    V's give out columns that are cut off again (so their gradients vanish, and dq, dk, dv
    come back at the inputs' width through the pad's backward); the scale stays the
    inputs' width's, 1/sqrt(head_dim), unless given."""
    width = padded_width(q, k, v)
    if width is None:
        return call(q, k, v, softmax_scale)
    d = q.shape[-1]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = call(*(F.pad(t, (0, width - d)) for t in (q, k, v)), scale)
    return out[..., :d].contiguous(), lse


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
    alibi_slopes other than their defaults raise ValueError. A head_dim up to 256 that dashgen
    has no kernel of runs zero-padded to the next one it has (run_padded), as flash_attn pads.
    """
    _refuse_unsupported(dropout_p, alibi_slopes, return_attn_probs)
    out, lse = run_padded(
        lambda q, k, v, scale: op.attention(
            q, k, v, causal=causal, softmax_scale=scale, deterministic=deterministic,
            return_lse=True, softcap=softcap, window_size=window_size),
        q, k, v, softmax_scale)
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
    dashgen.attention_varlen; head dims as in flash_attn_func."""
    _refuse_unsupported(dropout_p, alibi_slopes, return_attn_probs, block_table)
    from ..runtime.op_varlen import attention_varlen
    out, lse = run_padded(
        lambda q, k, v, scale: attention_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
            softmax_scale=scale, deterministic=deterministic, return_lse=True,
            softcap=softcap, window_size=window_size),
        q, k, v, softmax_scale)
    return (out, lse, None) if return_attn_probs else out


def unstack(packed, count: int, name: str, dim: int, layout: str):
    """The `count` tensors stacked along `dim` of flash_attn's packed layouts (q, k, v: 3; k, v:
    2), as views; the gradient of each arrives in the packed tensor's layout through autograd."""
    if not torch.is_tensor(packed):
        raise TypeError(f"{name} must be a tensor, got {type(packed).__name__}")
    if packed.dim() != len(layout.split(",")) or packed.shape[dim] != count:
        raise ValueError(f"{name} must be ({layout}), got {tuple(packed.shape)}")
    return packed.unbind(dim=dim)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0,
                              softmax_scale: float | None = None, causal: bool = False,
                              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: torch.Tensor | None = None,
                              deterministic: bool | None = None, return_attn_probs: bool = False):
    """flash_attn 2.x's flash_attn_qkvpacked_func: qkv (batch, seqlen, 3, heads, head_dim),
    otherwise flash_attn_func. dashgen's kernels read q, k and v contiguous, so the stacked
    layout costs a copy of each."""
    q, k, v = unstack(qkv, 3, "qkv", 2, "batch, seqlen, 3, heads, head_dim")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None,
                             deterministic: bool | None = None, return_attn_probs: bool = False):
    """flash_attn 2.x's flash_attn_kvpacked_func: kv (batch, seqlen_k, 2, heads_kv, head_dim),
    otherwise flash_attn_func."""
    k, v = unstack(kv, 2, "kv", 2, "batch, seqlen_k, 2, heads_kv, head_dim")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor,
                                     max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: float | None = None, causal: bool = False,
                                     window_size: tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0,
                                     alibi_slopes: torch.Tensor | None = None,
                                     deterministic: bool | None = None,
                                     return_attn_probs: bool = False):
    """flash_attn 2.x's flash_attn_varlen_qkvpacked_func: qkv (total, 3, heads, head_dim), one
    cu_seqlens and max_seqlen for queries and keys, otherwise flash_attn_varlen_func."""
    q, k, v = unstack(qkv, 3, "qkv", 1, "total, 3, heads, head_dim")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor,
                                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: float | None = None, causal: bool = False,
                                    window_size: tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0,
                                    alibi_slopes: torch.Tensor | None = None,
                                    deterministic: bool | None = None,
                                    return_attn_probs: bool = False):
    """flash_attn 2.x's flash_attn_varlen_kvpacked_func: kv (total_k, 2, heads_kv, head_dim),
    otherwise flash_attn_varlen_func."""
    k, v = unstack(kv, 2, "kv", 1, "total_k, 2, heads_kv, head_dim")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)
