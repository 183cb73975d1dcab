"""Problem validation and the tile geometry of masks."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


masks = st.one_of(st.just("full"), st.just("causal"),
                  st.tuples(st.integers(0, 400), st.integers(0, 400)).map(
                      lambda lr: f"window:{lr[0]},{lr[1]}"))


@settings(max_examples=300, deadline=None)
@given(seqlen_q=st.integers(1, 1000), seqlen_k=st.integers(1, 1000), mask=masks,
       block_m=st.sampled_from([16, 64, 128]), block_n=st.sampled_from([32, 64, 128]))
def test_m_blocks_of_is_every_kept_tile(seqlen_q, seqlen_k, mask, block_m, block_n):
    """m_blocks_of (computed once per problem from each Q tile's key range) lists exactly the
    tiles tile_kept keeps, and kv_tiles exactly the KV tiles with one."""
    p = Problem(batch=2, heads_q=2, seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=64,
                mask=mask, block_m=block_m, block_n=block_n)
    kept = {n: [m for m in range(p.num_m_blocks) if p.tile_kept(n, m)]
            for n in range(p.num_n_blocks)}
    assert {n: p.m_blocks_of(n) for n in range(p.num_n_blocks)} == kept
    assert list(p.kv_tiles()) == [(b, h, n) for b in range(2) for h in range(2)
                                  for n in range(p.num_n_blocks) if kept[n]]
    assert p.m_blocks_of(-1) == [] and p.m_blocks_of(p.num_n_blocks) == []  # outside: none
