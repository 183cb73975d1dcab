"""A padded batch as a pack (dashgen/interfaces/padding.py), on the CPU: where the kept tokens
go, the offsets attention_varlen gets, the way back with zeros at padded queries and zero
gradients at padded tokens, the checks that name the mask, and the remembered answer."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.interfaces import padding  # noqa: E402


def left_and_right_padded(seqlen=10):
    """Row 0 padded on the left by 3, row 1 on the right by 4, row 2 whole, row 3 all padding."""
    mask = torch.ones(4, seqlen, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, seqlen - 4:] = False
    mask[3] = False
    return mask


def test_kept_tokens_become_one_sequence_a_row_in_batch_order():
    mask = left_and_right_padded()
    rows = padding.padded_batch(mask, 10, 10)
    expected = [b * 10 + t for b in range(4) for t in range(10) if mask[b, t]]
    assert rows.rows_k.tolist() == expected and rows.rows_q.tolist() == expected
    assert rows.cu_seqlens_k.tolist() == [0, 7, 13, 23, 23]
    assert rows.cu_seqlens_k.dtype == torch.int32
    assert (rows.max_seqlen_q, rows.max_seqlen_k) == (10, 10)
    assert rows.varlen_args()[0] is rows.cu_seqlens_q


def test_queries_are_the_last_positions_of_the_keys():
    mask = left_and_right_padded(seqlen=12)
    rows = padding.padded_batch(mask, 2, 12)
    # Row 0 (left padded) and row 2 keep both new queries, row 1 (right padded) none.
    assert rows.cu_seqlens_q.tolist() == [0, 2, 2, 4, 4]
    assert rows.rows_q.tolist() == [0, 1, 4, 5]
    assert rows.cu_seqlens_k.tolist() == [0, 9, 17, 29, 29]
    assert (rows.max_seqlen_q, rows.max_seqlen_k) == (2, 12)


def test_the_way_back_puts_outputs_in_place_and_zeros_padded_queries():
    mask = left_and_right_padded()
    rows = padding.padded_batch(mask, 10, 10)
    x = torch.randn(4, 10, 3, 8, requires_grad=True)
    shapes = []

    def call(q, k, v):
        shapes.append((q.shape, k.shape, v.shape))
        return q * 2

    back = rows.attend(call, x, x, x)
    assert shapes == [((23, 3, 8),) * 3]
    assert back.shape == x.shape
    assert torch.equal(back[mask], x[mask].detach() * 2)
    assert torch.equal(back[~mask], torch.zeros_like(back[~mask]))
    back.sum().backward()
    assert torch.equal(x.grad[mask], torch.full_like(x.grad[mask], 2.0))
    assert torch.equal(x.grad[~mask], torch.zeros_like(x.grad[~mask]))


def test_integer_masks_of_zeros_and_ones_read_as_booleans():
    mask = left_and_right_padded()
    as_int = padding.padded_batch(mask.long(), 10, 10)
    as_bool = padding.unpad(mask, 10)
    assert torch.equal(as_int.rows_k, as_bool.rows_k)
    assert torch.equal(as_int.cu_seqlens_k, as_bool.cu_seqlens_k)


@pytest.mark.parametrize("mask, seqlen_q, seqlen_k, pattern", [
    (torch.zeros(2, 10), 10, 10, r"boolean or integer .* got torch.float32"),
    (torch.tensor([[1, 1, 2, 2]]), 4, 4, r"0 \(padding\) and 1 \(kept\) only.*segment ids"),
    (torch.ones(2, 1, 10, 10, dtype=torch.bool), 10, 10, r"\(batch, seqlen_k\) = \(batch, 10\)"),
    (torch.ones(2, 9, dtype=torch.bool), 10, 10, r"got shape \(2, 9\)"),
    (torch.ones(2, 10, dtype=torch.bool), 12, 10, r"12 queries over 10 keys"),
])
def test_masks_that_are_no_padding_are_refused_by_name(mask, seqlen_q, seqlen_k, pattern):
    with pytest.raises(ValueError, match=r"^attention_mask: .*" + pattern):
        padding.padded_batch(mask, seqlen_q, seqlen_k)


def test_the_answer_is_kept_for_the_same_mask_and_made_again_after_a_change():
    mask = left_and_right_padded()
    first = padding.padded_batch(mask, 10, 10)
    assert padding.padded_batch(mask, 10, 10) is first
    assert padding.padded_batch(mask, 2, 10) is not first  # another query count
    mask[2, 0] = False
    again = padding.padded_batch(mask, 10, 10)
    assert again.cu_seqlens_k.tolist() == [0, 7, 13, 22, 22]
    assert padding.padded_batch(mask.clone(), 10, 10) is not again


def test_a_mask_shared_by_batches_of_other_sizes_is_unpadded_for_each():
    keep = torch.ones(1, 6, dtype=torch.bool)
    keep[0, 4:] = False
    two = padding.padded_batch(keep.expand(2, 6), 3, 6, every_query=True, source=keep)
    three = padding.padded_batch(keep.expand(3, 6), 3, 6, every_query=True, source=keep)
    assert two.cu_seqlens_k.tolist() == [0, 4, 8] and two.cu_seqlens_q.tolist() == [0, 3, 6]
    assert three.cu_seqlens_k.tolist() == [0, 4, 8, 12] and three.rows_q is None
    assert padding.padded_batch(keep.expand(3, 6), 3, 6, every_query=True, source=keep) is three


def test_two_masks_in_turn_are_both_remembered():
    """A model with sliding and full layers hands its layers two mask tensors in turn."""
    full, sliding = left_and_right_padded(), left_and_right_padded()
    first = padding.padded_batch(full, 10, 10), padding.padded_batch(sliding, 10, 10)
    assert padding.padded_batch(full, 10, 10) is first[0]
    assert padding.padded_batch(sliding, 10, 10) is first[1]
