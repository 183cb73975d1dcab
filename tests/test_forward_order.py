"""The persistent forward's tile order under a causal mask (an experiment, off): a mirror in
Python of fwd_sm90_persistent.cuh's tile_at on runtime.forward_ctas' grid. Every query tile
once, a head's tiles in one round, and every CTA about as busy as the others."""
import pytest

from dashgen.runtime.backward import forward_ctas


def causal_order(m_tiles: int, heads: int, ctas: int) -> list[list[tuple[int, int]]]:
    """Per CTA its (head, m) tiles, as tile_at gives them round after round."""
    per_round = ctas // m_tiles
    rounds = -(-heads // per_round)
    stride = max(1, m_tiles // rounds)
    out = []
    for c in range(ctas):
        tiles = []
        for i in range(rounds):
            bh = i * per_round + c // m_tiles
            if bh >= heads:
                break
            tiles.append((bh, m_tiles - 1 - (c + i * stride) % m_tiles))
        out.append(tiles)
    return out


@pytest.mark.parametrize("m_tiles, heads", [
    (8, 512), (16, 256), (32, 128), (64, 64), (128, 32),   # head_dim 64, 1k .. 16k
    (8, 256), (128, 16),                                   # head_dim 128, 1k and 16k
    (5, 3), (7, 40), (132, 1), (1, 1000)])
def test_every_tile_once_and_the_ctas_evenly_busy(m_tiles, heads):
    ctas = forward_ctas(m_tiles, heads, 132, causal=True)
    assert ctas % m_tiles == 0 and 0 < ctas <= 132
    order = causal_order(m_tiles, heads, ctas)
    tiles = [t for per_cta in order for t in per_cta]
    assert sorted(tiles) == [(h, m) for h in range(heads) for m in range(m_tiles)]
    # A causal tile m visits m + 1 KV tiles (square tiles): the busiest CTA against the mean.
    loads = [sum(m + 1 for _, m in per_cta) for per_cta in order]
    mean = sum(loads) / len(loads)
    if heads * m_tiles >= 4 * ctas:  # enough rounds to even out (all 20 benchmark shapes)
        assert max(loads) <= 1.1 * mean, (max(loads), mean)


def test_full_masks_keep_the_fewest_ctas():
    assert forward_ctas(8, 512, 132, causal=False) == 128
    assert forward_ctas(3, 2, 132, causal=False) == 6
