"""A padded batch as a pack: the tokens a (batch, seqlen_k) key mask keeps, gathered into one
row of sequences for dashgen.attention_varlen, and the outputs put back in their places.

This is how a batch padded to one length (what a padding collator hands a fine-tuning run)
reaches kernels that take whole sequences: each row's kept tokens become one sequence of the
pack, so its bits are the bits that sequence has alone (the packs' bit contract), whatever the
padding around it. The queries are the last seqlen_q positions of the keys (a cache's new
tokens), so their mask is the key mask's last seqlen_q columns; padded query positions come
back as zeros, and padded positions get zero gradients. Where a mask pads keys only (SDPA's
(batch, 1, 1, seqlen_k) key-padding mask), every query is kept (every_query).

The gather and the scatter index distinct rows, so their backward adds one value onto zeros
per row: the same bits under torch.use_deterministic_algorithms or not.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Unpadded:
    """Where a padded batch's kept tokens sit: rows_q and rows_k index the flattened
    (batch * seqlen) token axis (int64, in batch order; rows_q None: every query);
    cu_seqlens_q/k (int32, batch + 1) and max_seqlen_q/k are attention_varlen's arguments for
    them."""
    rows_q: torch.Tensor | None
    rows_k: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    batch: int
    seqlen_q: int

    def varlen_args(self) -> tuple:
        return self.cu_seqlens_q, self.cu_seqlens_k, self.max_seqlen_q, self.max_seqlen_k

    def attend(self, call, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor) -> torch.Tensor:
        """call(q, k, v) over the kept tokens ((tokens, heads, dim) each; the offsets are
        varlen_args()), with query, key and value (batch, seqlen, heads, dim) and the answer
        (batch, seqlen_q, heads, dim_v), zeros at padded queries."""
        q = _gather(query, self.rows_q)
        k, v = _gather(key, self.rows_k), _gather(value, self.rows_k)
        return self._scatter_q(call(q, k, v))

    def _scatter_q(self, out: torch.Tensor) -> torch.Tensor:
        """(kept queries, heads, dim) -> (batch, seqlen_q, heads, dim), zeros where padded."""
        if self.rows_q is None:
            return out.view(self.batch, self.seqlen_q, *out.shape[1:])
        full = out.new_zeros(self.batch * self.seqlen_q, *out.shape[1:])
        return full.index_copy(0, self.rows_q, out).view(self.batch, self.seqlen_q,
                                                         *out.shape[1:])


def _gather(x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """(batch, seqlen, heads, dim) -> (kept tokens, heads, dim); rows None keeps them all."""
    x = x.reshape(-1, *x.shape[2:])
    return x if rows is None else x.index_select(0, rows)


def _kept(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(flat rows kept, cu_seqlens int32, longest row) of a (batch, n) boolean mask."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    rows = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    return rows, cu, int(lengths.max()) if lengths.numel() else 0


def check_key_mask(attention_mask: torch.Tensor, seqlen_k: int,
                   name: str = "attention_mask") -> torch.Tensor:
    """attention_mask as a boolean (batch, seqlen_k) mask, True where a key is kept; ValueError
    naming `name` for anything else. Integer masks must hold 0 and 1 only: other values
    (segment ids, an additive mask's large negatives) mean something this reading would lose."""
    if attention_mask.dim() != 2 or attention_mask.shape[1] != seqlen_k:
        raise ValueError(f"{name}: a padding mask is (batch, seqlen_k) = (batch, {seqlen_k}), "
                         f"got shape {tuple(attention_mask.shape)}")
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise ValueError(f"{name}: a padding mask is boolean or integer (1 keeps a key, 0 pads "
                         f"it), got {attention_mask.dtype}; an additive float mask is not taken")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError(f"{name}: an integer padding mask holds 0 (padding) and 1 (kept) only, "
                         f"got other values (segment ids?); pack segments as sequences instead")
    return attention_mask != 0


def unpad(key_mask: torch.Tensor, seqlen_q: int, every_query: bool = False) -> Unpadded:
    """Unpadded of a boolean (batch, seqlen_k) key mask (check_key_mask's answer) for seqlen_q
    queries, the last seqlen_q positions (every_query: all of them, whatever the mask). Reads
    the longest rows on the host (one sync)."""
    batch, seqlen_k = key_mask.shape
    rows_k, cu_k, max_k = _kept(key_mask)
    if every_query:
        cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32,
                            device=key_mask.device)
        rows_q, max_q = None, seqlen_q
    elif seqlen_q == seqlen_k:
        rows_q, cu_q, max_q = rows_k, cu_k, max_k
    else:
        rows_q, cu_q, max_q = _kept(key_mask[:, seqlen_k - seqlen_q:])
    return Unpadded(rows_q, rows_k, cu_q, cu_k, max_q, max_k, batch, seqlen_q)


# Every layer of a forward gets the same mask tensor (a model with sliding and full layers, one
# of each); checking and unpadding one costs device syncs, so the answers for the last few mask
# tensors are kept (with their versions, for in-place changes).
_RECENT: list[tuple[weakref.ref, int, tuple, Unpadded]] = []
_KEEP = 4


def padded_batch(attention_mask: torch.Tensor, seqlen_q: int, seqlen_k: int,
                 name: str = "attention_mask", every_query: bool = False,
                 source: torch.Tensor | None = None) -> Unpadded:
    """check_key_mask, then unpad, remembered for the last few mask tensors asked about, not
    while torch.compile traces nor for inference tensors (which keep no version counter).
    source: the tensor attention_mask was derived from, the one every layer passes."""
    source = attention_mask if source is None else source
    remember = not (torch.compiler.is_compiling() or source.is_inference())
    # A (1, 1, 1, seqlen_k) SDPA mask serves any batch size: the batch is part of the answer.
    lengths = (attention_mask.shape[0], seqlen_q, seqlen_k, every_query)
    if remember:
        for ref, version, known, answer in _RECENT:
            if ref() is source and version == source._version and known == lengths:
                return answer
    if seqlen_q > seqlen_k and not every_query:
        raise ValueError(f"{name}: {seqlen_q} queries over {seqlen_k} keys; a padded batch's "
                         f"queries are the last of its keys (seqlen_q <= seqlen_k)")
    answer = unpad(check_key_mask(attention_mask, seqlen_k, name), seqlen_q, every_query)
    if remember:
        _RECENT[:] = [(weakref.ref(source), source._version, lengths, answer)] + [
            entry for entry in _RECENT[:_KEEP - 1] if entry[0]() is not None]
    return answer
