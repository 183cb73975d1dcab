"""symmetric_shift: DASH's two-phase schedule for causal masks (workload folding)."""
from __future__ import annotations

from itertools import groupby

from ..problem import Problem
from .base import Segment, Unit, wave_of


def symmetric_shift_supports(problem: Problem) -> str | None:
    if problem.mask.kind != "causal":
        return (f"symmetric_shift needs a causal mask, this problem has a {problem.mask} mask "
                f"(for a full mask use shift)")
    return None


def symmetric_shift_units(problem: Problem, num_workers: int) -> list[Unit]:
    """KV tiles p and N-1-p run back to back on one worker, so the long and the short tile of a
    causal head even out (N+1 tasks a worker with square tiles; an odd N leaves the middle tile
    alone). Phase 1: the big side walks the rectangle of Q tiles that every pair of this head
    active in the same wave needs, rotated by its slot; then its own extra Q tiles ascending.
    Phase 2: the small side visits its Q tiles descending, filling the slots the rotation left.
    Ranks follow arrival; they depend on the worker count (waves decide who is active together).

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "symmetric_shift", "--seqlen", "512", "--hdim", "64", "--mask", "causal",
    ...       "--workers", "2"])
    symmetric_shift: batch 1, heads 1, seqlen 512, head_dim 64, causal mask, blocks 128x128; 2 workers
    worker 0 | n0: m1 m2 m3 m0 | n3: m3
    worker 1 | n1: m2 m3 m1 | n2: m3 m2
    dQ reduction order (KV tiles, first to last):
      m0: n0
      m1: n0 n1
      m2: n1 n0 n2
      m3: n1 n0 n2 n3
    """
    pairs: list[tuple[int, int, int, int | None]] = []  # (batch, head, big n, small n or None)
    for (b, h), tiles in groupby(problem.kv_tiles(), key=lambda t: t[:2]):
        ns = [n for _, _, n in tiles]
        count = len(ns)
        for p in range(count // 2):
            pairs.append((b, h, ns[p], ns[count - 1 - p]))
        if count % 2:
            pairs.append((b, h, ns[count // 2], None))

    # The rectangle of a (batch, head) in one wave: the Q tiles of its active big side with the
    # fewest rows, which (causal Q sets are nested suffixes) every other active big side needs.
    slots: dict[tuple[int, int, int], list[int]] = {}
    for i, (b, h, big, _) in enumerate(pairs):
        wave, _ = wave_of(i, num_workers)
        slots.setdefault((b, h, wave), []).append(big)
    units: list[Unit] = []
    for i, (b, h, big, small) in enumerate(pairs):
        wave, _ = wave_of(i, num_workers)
        active = slots[(b, h, wave)]
        slot = active.index(big)
        rect = problem.m_blocks_of(max(active))
        rows = problem.m_blocks_of(big)
        rotated = rect[slot % len(rect):] + rect[:slot % len(rect)]
        in_rect = set(rect)
        extra = [m for m in rows if m not in in_rect]
        unit = [Segment(b, h, big, tuple(rotated + extra))]
        if small is not None:
            unit.append(Segment(b, h, small, tuple(reversed(problem.m_blocks_of(small)))))
        units.append(unit)
    return units
