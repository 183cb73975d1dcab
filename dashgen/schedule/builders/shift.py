"""shift: the DASH cyclic shift for full masks (no two workers want one dQ tile at one step)."""
from __future__ import annotations

from ..problem import Problem
from .base import Step, Tiling, shift_rank


def shift_supports(problem: Problem) -> str | None:
    if problem.mask.kind != "full":
        return (f"shift needs a full mask, this problem has a {problem.mask} mask "
                f"(for causal use symmetric_shift, descending or spt)")
    return None


def shift_units(t: Tiling) -> int:
    """KV tile n starts on Q tile n mod M and walks the Q tiles cyclically. All KV tiles of a
    head run at once (one wave holds whole heads), so the adds into a Q tile arrive in step
    order, and that order is the rank: (min(m, N-1) - n) mod N with N <= M, a function of the
    tiles alone. More KV tiles than Q tiles make two of them meet on one Q tile at one step;
    the lower KV tile adds first.

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
    return t.num_n


def shift_tasks(t: Tiling, u: int) -> int:
    return t.num_m


def shift_step(t: Tiling, u: int, i: int) -> Step:
    m = (u + i) % t.num_m
    return Step(u, m, shift_rank(t.num_n, t.num_m, u, i), i == 0, i + 1 == t.num_m)
