"""Problem validation and the tile geometry of masks."""
from __future__ import annotations

import pytest

from dashgen import Mask, Problem


@pytest.mark.parametrize("field,value", [
    ("batch", 0), ("heads_q", -1), ("seqlen_q", 0), ("seqlen_k", 0), ("head_dim", 0),
    ("block_m", 0), ("block_n", 1.5), ("heads_kv", 0),
])
def test_impossible_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Problem(**{field: value})


def test_heads_q_must_be_a_multiple_of_heads_kv():
    with pytest.raises(ValueError, match=r"heads_q \(6\) must be a multiple of heads_kv \(4\)"):
        Problem(heads_q=6, heads_kv=4)


@pytest.mark.parametrize("text", ["diagonal", "window:1", "window:a,b", "window:-1,0"])
def test_bad_masks_are_rejected(text):
    with pytest.raises(ValueError, match="mask"):
        Problem(mask=text)


def test_causal_is_bottom_right_aligned():
    # seqlen_k > seqlen_q: the first query row already sees the first seqlen_k - seqlen_q keys.
    p = Problem(seqlen_q=128, seqlen_k=512, mask="causal", block_m=128, block_n=128)
    assert p.m_blocks_of(3) == [0]
    # seqlen_q > seqlen_k: the first query rows see no key at all, so their tiles are dropped.
    p = Problem(seqlen_q=512, seqlen_k=128, mask="causal")
    assert p.m_blocks_of(0) == [3]


def test_window_keeps_a_band():
    p = Problem(seqlen_q=1024, mask=Mask.window(128, 0), block_m=128, block_n=128)
    assert p.m_blocks_of(3) == [3, 4]


def test_kept_fraction_of_a_square_diagonal_tile():
    p = Problem(seqlen_q=256, mask="causal", block_m=128, block_n=128)
    assert p.kept_fraction(0, 0) == pytest.approx((128 * 129 / 2) / 128**2)
    assert p.kept_fraction(0, 1) == 1.0
    assert p.kept_fraction(1, 0) == 0.0


def test_mask_spellings_round_trip():
    for text in ["full", "causal", "window:7,3"]:
        assert str(Mask.parse(text)) == text
    assert Problem.from_dict(Problem(heads_q=4, heads_kv=2, mask="window:7,3").to_dict()) == \
        Problem(heads_q=4, heads_kv=2, mask="window:7,3")
