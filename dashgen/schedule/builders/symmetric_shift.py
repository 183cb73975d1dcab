"""symmetric_shift: DASH's two-phase schedule for causal masks (workload folding)."""
from __future__ import annotations

from ..problem import Problem
from .base import Step, Tiling, shift_rank


def symmetric_shift_supports(problem: Problem) -> str | None:
    if problem.mask.kind != "causal":
        return (f"symmetric_shift needs a causal mask, this problem has a {problem.mask} mask "
                f"(for a full mask use shift)")
    return None


def symmetric_shift_units(t: Tiling) -> int:
    """KV tiles p and N-1-p run back to back on one worker (unit p of P = ceil(N/2)), so the
    long and the short tile of a causal head even out (N+1 tasks a unit with square tiles; an
    odd N leaves the middle tile alone). All P units of a head run at once. Phase 1: the big
    side p walks the rectangle of Q tiles every big side has (from first_m(P-1) on, R of them)
    rotated by p, then its own extra Q tiles ascending. Phase 2: the small side visits its Q
    tiles descending. Ranks are the arrival order of that one head, (step, unit): in the
    rectangle the cyclic shift of P units over R rows; below it the extras, the unit whose
    extras start nearest first; the small sides after every big side, the one that reaches the
    tile first first. Functions of the tiles alone.

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
    return (t.num_n + 1) // 2


def _has_small(t: Tiling, p: int) -> bool:
    return t.num_n - 1 - p != p


def symmetric_shift_tasks(t: Tiling, p: int) -> int:
    return t.rows(p) + (t.rows(t.num_n - 1 - p) if _has_small(t, p) else 0)


def symmetric_shift_step(t: Tiling, p: int, i: int) -> Step:
    units, num_n, num_m = (t.num_n + 1) // 2, t.num_n, t.num_m
    r0 = t.first_m(units - 1)  # the rectangle: Q tiles r0 .. M-1, every big side has them
    rect = num_m - r0
    big = num_m - t.first_m(p)
    if i < rect:  # phase 1, the rectangle
        return Step(p, r0 + (p + i) % rect, shift_rank(units, rect, p, i), i == 0,
                    i + 1 == big)
    f = t.first_m(p)

    def below(x: int) -> int:  # big sides (units) whose first Q tile is at most x
        return min(units, t.count(x)) if x >= 0 else 0

    if i < big:  # phase 1, the extras below the rectangle, ascending
        m = f + i - rect
        # Before it: units whose extras start later (reach m sooner), then equal starts below p.
        rank = below(m) - below(f) + p - below(f - 1)
        return Step(p, m, rank, False, i + 1 == big)
    # Phase 2: the small side N-1-p, its Q tiles descending, after all `units` big sides. Small
    # sides at m are units q >= N - count(m) (q < N // 2); ahead of p those with a later first
    # Q tile (shorter big side, so sooner here), then equal first Q tiles below p.
    small = num_n - 1 - p
    j = i - big
    m = num_m - 1 - j
    lo = max(0, num_n - t.count(m))
    later = max(0, num_n // 2 - max(lo, below(f)))
    tied = max(0, p - max(lo, below(f - 1)))
    return Step(small, m, units + later + tied, j == 0, m == t.first_m(small))
