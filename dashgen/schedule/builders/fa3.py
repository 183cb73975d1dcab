"""fa3: FlashAttention-3's original deterministic order (the baseline every schedule is measured against)."""
from __future__ import annotations

from .base import Step, Tiling


def fa3_units(t: Tiling) -> int:
    """KV tiles launched head by head, n ascending; each visits its Q tiles ascending.

    Ranks follow the launch order, so the dQ adds of a Q tile land in ascending KV order. Under a
    full mask every worker wants dQ 0 first: they serialize once and stay staggered by r.

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "fa3", "--seqlen", "512", "--hdim", "64", "--workers", "4"])
    fa3: batch 1, heads 1, seqlen 512, head_dim 64, full mask, blocks 128x128; 4 workers
    worker 0 | n0: m0 m1 m2 m3
    worker 1 | n1: m0 m1 m2 m3
    worker 2 | n2: m0 m1 m2 m3
    worker 3 | n3: m0 m1 m2 m3
    dQ reduction order (KV tiles, first to last):
      m0: n0 n1 n2 n3
      m1: n0 n1 n2 n3
      m2: n0 n1 n2 n3
      m3: n0 n1 n2 n3
    """
    return t.num_n


def fa3_tasks(t: Tiling, u: int) -> int:
    return t.rows(u)


def fa3_step(t: Tiling, u: int, i: int) -> Step:
    m = t.first_m(u) + i
    return Step(u, m, u - t.first_n(m), i == 0, i + 1 == t.rows(u))
