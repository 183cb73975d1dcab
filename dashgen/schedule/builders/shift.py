"""shift: the DASH cyclic shift for full masks (no two workers want one dQ tile at one step)."""
from __future__ import annotations

from ..problem import Problem
from .base import Segment, Unit


def shift_supports(problem: Problem) -> str | None:
    if problem.mask.kind != "full":
        return (f"shift needs a full mask, this problem has a {problem.mask} mask "
                f"(for causal use symmetric_shift, descending or spt)")
    return None


def shift_units(problem: Problem, num_workers: int) -> list[Unit]:
    """KV tile n starts on Q tile n mod M and walks the Q tiles cyclically; ranks follow arrival.

    The dQ order of a tile is the order its adds arrive in, which depends on how KV tiles land on
    workers: the worker count is part of what fixes the bits. Fewer Q tiles than KV tiles active
    at once (M < A) makes some workers collide; the schedule stays valid, only slower.

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "shift", "--seqlen", "512", "--hdim", "64", "--workers", "4"])
    shift: batch 1, heads 1, seqlen 512, head_dim 64, full mask, blocks 128x128; 4 workers
    worker 0 | n0: m0 m1 m2 m3
    worker 1 | n1: m1 m2 m3 m0
    worker 2 | n2: m2 m3 m0 m1
    worker 3 | n3: m3 m0 m1 m2
    dQ reduction order (KV tiles, first to last):
      m0: n0 n3 n2 n1
      m1: n1 n0 n3 n2
      m2: n2 n1 n0 n3
      m3: n3 n2 n1 n0
    """
    units: list[Unit] = []
    for b, h, n in problem.kv_tiles():
        rows = problem.m_blocks_of(n)
        start = n % len(rows)
        units.append([Segment(b, h, n, tuple(rows[start:] + rows[:start]))])
    return units
