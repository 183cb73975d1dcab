"""spt: shortest processing time first, the order upstream FlashAttention uses for causal masks."""
from __future__ import annotations

from itertools import groupby

from ..problem import Problem
from .base import Segment, Unit


def spt_units(problem: Problem, num_workers: int) -> list[Unit]:
    """Within each head, KV tiles with the fewest tasks launch first (the last ones under a causal
    mask; ties by descending n); Q tiles ascending; ranks follow the launch, so the highest KV
    tile adds first.

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "spt", "--seqlen", "512", "--hdim", "64", "--mask", "causal",
    ...       "--workers", "4"])
    spt: batch 1, heads 1, seqlen 512, head_dim 64, causal mask, blocks 128x128; 4 workers
    worker 0 | n3: m3
    worker 1 | n2: m2 m3
    worker 2 | n1: m1 m2 m3
    worker 3 | n0: m0 m1 m2 m3
    dQ reduction order (KV tiles, first to last):
      m0: n0
      m1: n1 n0
      m2: n2 n1 n0
      m3: n3 n2 n1 n0
    """
    units: list[Unit] = []
    for (b, h), tiles in groupby(problem.kv_tiles(), key=lambda t: t[:2]):
        order = sorted((len(problem.m_blocks_of(n)), -n) for _, _, n in tiles)
        units += [[Segment(b, h, -neg_n, tuple(problem.m_blocks_of(-neg_n)))] for _, neg_n in order]
    return units
