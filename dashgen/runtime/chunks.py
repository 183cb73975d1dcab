"""Chunked attention (Llama 4's, FlashAttention-3's attention_chunk) as a pack of the chunks.

FlashAttention's chunk mask gives query row i of a sequence the keys of its chunk,
[p - p % chunk, p - p % chunk + chunk) with p = i + seqlen_k - seqlen_q and floor division
(FA3's hopper/mask.h), intersected with the window or causal mask. So chunk c of a sequence is a
sequence of its own: keys [c * chunk, (c + 1) * chunk) and the queries whose p falls among them.
Inside it, a query's bottom-right position is p - c * chunk and a key's j - c * chunk, so the
causal mask and any window (whose bounds are differences j - p) carry over unchanged; a window
wider than the chunk is opened by the chunk's length, as FA3 clamps it to chunk - 1. Rows whose p
is negative (seqlen_q > seqlen_k) see no key: they lead the sequence as one more sequence with no
keys (o = 0, lse = -inf, dq = 0). The packed kernels then run the chunks, forward and backward,
and each chunk's bits are its own, as a pack's sequences' are. The pack keeps the tokens in their
order, so o and lse need no reordering.
"""
from __future__ import annotations

import torch

from ..caches import memo


def check_chunk(attention_chunk) -> int:
    """attention_chunk as an int: 0 (no chunks) or the chunk's length in keys."""
    if isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int) \
            or attention_chunk < 0:
        raise ValueError(f"attention_chunk must be a non-negative int, got {attention_chunk!r}")
    return attention_chunk


def _check_count(sequences: int, chunk: int) -> None:
    from .op_varlen import MAX_SEQUENCES
    if sequences > MAX_SEQUENCES:
        raise ValueError(f"attention_chunk={chunk}: the call's {sequences} chunks (with the rows "
                         f"before the first key) exceed the {MAX_SEQUENCES} sequences a pack "
                         f"takes; use a longer chunk or fewer sequences a call")


def chunk_varlen_pack(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                      max_seqlen_q: int, max_seqlen_k: int, chunk: int,
                      lead_chunks: int | None = None):
    """A pack's chunks as a pack, formed on the offsets' device without reading them on the
    host: (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), the maxima bounds. Sequence
    b becomes the sequences c = -lead_chunks .. ceil(max_seqlen_k / chunk) - 1, queries
    [c * chunk - off, (c + 1) * chunk - off) (off = seqlen_k - seqlen_q) and keys [c * chunk,
    (c + 1) * chunk), both clipped to the sequence: chunk c < 0 holds rows that see no key, at
    most chunk of them, so no sequence is longer than the chunk; lead_chunks (default
    ceil(max_seqlen_q / chunk), enough for any seqlen_q) sets how many such sequences lead each
    (empty where seqlen_q <= seqlen_k)."""
    if lead_chunks is None:
        lead_chunks = -(-max_seqlen_q // chunk)
    chunks = max(-(-max_seqlen_k // chunk), 1)  # a sequence of no keys stays one sequence
    batch = cu_seqlens_q.shape[0] - 1
    _check_count(batch * (lead_chunks + chunks), chunk)
    start_q, start_k = cu_seqlens_q[:-1].to(torch.int64), cu_seqlens_k[:-1].to(torch.int64)
    len_q = (cu_seqlens_q[1:] - start_q)[:, None]
    len_k = (cu_seqlens_k[1:] - start_k)[:, None]
    first = torch.arange(-lead_chunks, chunks, device=cu_seqlens_q.device,
                         dtype=torch.int64)[None, :] * chunk
    q_lo = torch.minimum((first - (len_k - len_q)).clamp_min(0), len_q) + start_q[:, None]
    k_lo = torch.minimum(first.clamp_min(0), len_k) + start_k[:, None]
    cu_q = torch.cat((q_lo.flatten(), cu_seqlens_q[-1:].to(torch.int64))).to(torch.int32)
    cu_k = torch.cat((k_lo.flatten(), cu_seqlens_k[-1:].to(torch.int64))).to(torch.int32)
    return cu_q, cu_k, min(max_seqlen_q, chunk), min(max_seqlen_k, chunk)


def _batch_pack(batch: int, seqlen_q: int, seqlen_k: int, chunk: int, device=None):
    cu = lambda n: torch.arange(batch + 1, dtype=torch.int32, device=device) * n  # noqa: E731
    lead = -(-max(seqlen_q - seqlen_k, 0) // chunk)
    return chunk_varlen_pack(cu(seqlen_q), cu(seqlen_k), seqlen_q, seqlen_k, chunk,
                             lead_chunks=lead)


_batch_packs = memo(max_entries=64)(_batch_pack)  # a training loop asks for the same every step


def chunk_pack(batch: int, seqlen_q: int, seqlen_k: int, chunk: int, device=None):
    """A fixed-length batch's chunks as a pack over its (batch * seqlen, heads, head_dim)
    tensors: chunk_varlen_pack's with only the leading sequences seqlen_q - seqlen_k needs,
    int32 offsets on `device` (None: the host), memoized (so a call neither forms nor copies
    them again) except while torch.compile traces, which cannot enter the memo's lock."""
    if torch.compiler.is_compiling():
        return _batch_pack(batch, seqlen_q, seqlen_k, chunk, device)
    return _batch_packs(batch, seqlen_q, seqlen_k, chunk, device)


def chunked_attention(q, k, v, chunk: int, *, schedule, return_lse: bool, **options):
    """dashgen.attention with attention_chunk: the batch's chunks (chunk_pack) through
    dashgen.attention_varlen, o and lse in the fixed-length layouts; q, k and v checked by
    dashgen.attention."""
    from .op_varlen import attention_varlen
    if not isinstance(schedule, str):
        raise ValueError(f"schedule: with attention_chunk the chunks run as a pack, which takes "
                         f"a schedule's name or 'auto', got {type(schedule).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {return_lse!r}")
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    cu_q, cu_k, max_q, max_k = chunk_pack(batch, seqlen_q, seqlen_k, chunk, q.device)
    flat = lambda t, n, h: t.reshape(batch * n, h, t.shape[-1])  # noqa: E731
    out, lse = attention_varlen(flat(q, seqlen_q, heads_q), flat(k, seqlen_k, heads_kv),
                                flat(v, seqlen_k, heads_kv), cu_q, cu_k, max_q, max_k,
                                schedule=schedule, return_lse=True, **options)
    out = out.view(batch, seqlen_q, heads_q, v.shape[-1])
    if not return_lse:
        return out
    return out, lse.view(heads_q, batch, seqlen_q).transpose(0, 1).contiguous()
