"""dashgen in PyTorch's scaled_dot_product_attention layout, and as SDPA's flash backend.

`sdpa` takes F.scaled_dot_product_attention's arguments and (batch, heads, seqlen, head_dim)
tensors. Importing this module also registers "dashgen" with torch.nn.attention's registry of
flash-backend implementations (where the installed torch has one: 2.11 and 2.13 do); nothing is
activated until the user calls torch.nn.attention.activate_flash_attention_impl("dashgen").
Once active, every F.scaled_dot_product_attention call that PyTorch routes to its flash backend
runs dashgen's kernels, and their backward follows torch.use_deterministic_algorithms.
restore_flash_attention_impl() puts PyTorch's own kernels back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime import op

IMPL_NAME = "dashgen"


def _sdpa_support_error(query, key, attn_mask, dropout_p, is_causal, enable_gqa) -> str | None:
    """Why dashgen cannot serve an SDPA call, or None. Shapes and dtypes beyond these are
    dashgen.attention's checks."""
    if attn_mask is not None and is_causal:
        return "attn_mask with is_causal: SDPA takes one or the other, not both"
    if dropout_p != 0.0:
        return f"dropout_p: dashgen has no dropout, got dropout_p={dropout_p}"
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            return f"{name} must be a 4-d tensor (batch, heads, seqlen, head_dim)"
    if query.shape[1] != key.shape[1] and not enable_gqa:
        return (f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True "
                f"for grouped-query attention (as SDPA requires)")
    if is_causal and query.shape[2] != key.shape[2]:
        # SDPA's is_causal aligns the mask top-left, dashgen's causal bottom-right; they agree
        # only where the lengths do.
        return (f"is_causal with {query.shape[2]} queries and {key.shape[2]} keys: SDPA aligns "
                f"the causal mask top-left, dashgen bottom-right; call dashgen.attention("
                f"causal=True) for the bottom-right mask")
    if attn_mask is not None:
        return _key_padding_error(attn_mask, query, key)
    return None


def _key_padding_error(attn_mask, query, key) -> str | None:
    """Why attn_mask is no key-padding mask dashgen serves, or None: boolean (True takes part,
    SDPA's meaning), its shape (batch or 1, 1, 1, seqlen_k) up to leading ones, so that it
    depends on the batch and the key only."""
    if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
        return (f"attn_mask: dashgen takes a boolean key-padding mask, got "
                f"{getattr(attn_mask, 'dtype', type(attn_mask).__name__)} (an additive float "
                f"mask is not read); use F.scaled_dot_product_attention for it")
    shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    batch, seqlen_k = query.shape[0], key.shape[2]
    if len(shape) != 4 or shape[1:3] != (1, 1) or shape[3] != seqlen_k \
            or shape[0] not in (1, batch):
        return (f"attn_mask of shape {tuple(attn_mask.shape)}: dashgen serves a key-padding "
                f"mask ({batch} or 1, 1, 1, {seqlen_k}), one that depends on the batch and the "
                f"key only; use F.scaled_dot_product_attention for other masks")
    return None


def _attend_key_padded(query, key, value, attn_mask, scale) -> torch.Tensor:
    """SDPA over a boolean key-padding mask: each batch row's kept keys and every query as one
    sequence of a pack (interfaces/padding.py), the (batch, seqlen_q, heads, head_dim) output.
    A row with no kept key gives zeros (FlashAttention's rows that see no key), where SDPA's
    own kernels give NaN."""
    from ..runtime.op_varlen import attention_varlen
    from .padding import padded_batch
    batch, seqlen_q, seqlen_k = query.shape[0], query.shape[2], key.shape[2]
    key_mask = attn_mask.reshape(-1, seqlen_k).expand(batch, seqlen_k)
    rows = padded_batch(key_mask, seqlen_q, seqlen_k, name="attn_mask", every_query=True,
                        source=attn_mask)
    return rows.attend(
        lambda q, k, v: attention_varlen(q, k, v, *rows.varlen_args(), softmax_scale=scale),
        *(t.transpose(1, 2) for t in (query, key, value)))


def _autocast(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Autocast's rule for F.scaled_dot_product_attention (an op it runs in lower precision):
    under torch.autocast, 16- and 32-bit float inputs go to the autocast dtype; outside it they
    stay as they are (and dashgen.attention names a dtype it lacks)."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    target = torch.get_autocast_dtype(device)
    lower = (torch.float32, torch.float16, torch.bfloat16)
    return tuple(t.to(target) if t.dtype in lower else t for t in tensors)


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
         attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
         scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention's signature over dashgen.attention: query (batch,
    heads_q, seqlen_q, head_dim), key and value (batch, heads_kv, seqlen_k, head_dim); returns
    (batch, heads_q, seqlen_q, head_dim). The backward follows
    torch.use_deterministic_algorithms (deterministic=None). attn_mask may be a boolean
    key-padding mask ((batch, 1, 1, seqlen_k), True where a key takes part): each row's kept
    keys run as one sequence of a pack, every query kept (a row with no kept key gives zeros,
    where SDPA gives NaN). Other masks, dropout and is_causal with seqlen_q != seqlen_k raise
    ValueError. Tensors whose memory is (batch, seqlen, heads, head_dim), as a
    .transpose(1, 2) of a projection makes them, are used without a copy (but for the kept
    tokens' gather under a mask). Under torch.autocast the inputs take the autocast dtype, as SDPA's do."""
    error = _sdpa_support_error(query, key, attn_mask, dropout_p, is_causal, enable_gqa)
    if error is not None:
        raise ValueError(f"dashgen.sdpa: {error}")
    query, key, value = _autocast(query, key, value)
    if attn_mask is not None:
        return _attend_key_padded(query, key, value, attn_mask, scale).transpose(1, 2)
    o = op.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                     causal=is_causal, softmax_scale=scale)
    return o.transpose(1, 2)


# -- SDPA's flash backend ------------------------------------------------------------------------
# The aten ops of the flash backend, as PyTorch's own FA3 registration overrides them: the
# forward returns (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
# debug_attn_mask), the backward (grad_query, grad_key, grad_value). Autograd sits above these
# kernels, so each runs the runtime directly.

def _unsupported(direction: str, reason: str) -> RuntimeError:
    return RuntimeError(f"dashgen as SDPA's flash backend ({direction}): {reason}. "
                        f"torch.nn.attention.restore_flash_attention_impl() restores PyTorch's "
                        f"kernels; sdpa_kernel() selects another backend")


def _flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                   *, scale=None):
    error = _sdpa_support_error(query, key, None, dropout_p, is_causal, True)
    if error is None and return_debug_mask:
        error = "return_debug_mask: dashgen keeps no attention probabilities"
    if error is not None:
        raise _unsupported("forward", error)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    try:
        opts = op.check_inputs(q, k, v, causal=is_causal, softmax_scale=scale)
    except (TypeError, ValueError) as exc:
        raise _unsupported("forward", str(exc)) from None
    o, lse = op._run_forward(q, k, v, opts)
    device = query.device
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=device)  # no dropout: no RNG
    unused = torch.zeros((), dtype=torch.uint64, device=device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=device)
    return (o.transpose(1, 2), lse, None, None, query.shape[2], key.shape[2], rng_state, unused,
            debug_mask)


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q,
                    max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    if cum_seq_q is not None or cum_seq_k is not None:
        raise _unsupported("backward", "variable-length (nested) inputs")
    error = _sdpa_support_error(query, key, None, dropout_p, is_causal, True)
    if error is not None:
        raise _unsupported("backward", error)
    do, q, k, v, o = (t.transpose(1, 2) for t in (grad_out, query, key, value, out))
    # deterministic=None: the flag as the backward runs, as PyTorch's flash backward reads it.
    opts = op.check_inputs(q, k, v, causal=is_causal, softmax_scale=scale)
    dq, dk, dv = op._run_backward(do, q, k, v, o, logsumexp.contiguous(), opts)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


@dataclass
class _Handle:
    """What activate_flash_attention_impl keeps alive; remove() drops the overrides."""

    library: torch.library.Library | None

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


def _register_kernels() -> _Handle:
    lib = torch.library.Library("aten", "IMPL", "CUDA")
    lib.impl("_scaled_dot_product_flash_attention", _flash_forward, "CUDA")
    lib.impl("_scaled_dot_product_flash_attention_backward", _flash_backward, "CUDA")
    return _Handle(lib)


def registry_available() -> bool:
    """Whether the installed torch lets a library supply SDPA's flash backend."""
    return hasattr(torch.nn.attention, "register_flash_attention_impl")


if registry_available():
    torch.nn.attention.register_flash_attention_impl(IMPL_NAME, register_fn=_register_kernels)
