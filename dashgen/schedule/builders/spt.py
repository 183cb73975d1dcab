"""spt: shortest processing time first, the order upstream FlashAttention uses for causal masks."""
from __future__ import annotations

from .base import Step, Tiling


def spt_units(t: Tiling) -> int:
    """Within each head the KV tiles launch last first (under a causal mask the ones with the
    fewest tasks); Q tiles ascending; ranks follow the launch, so the highest KV tile adds first.

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
    return t.num_n


def spt_tasks(t: Tiling, u: int) -> int:
    return t.rows(t.num_n - 1 - u)


def spt_step(t: Tiling, u: int, i: int) -> Step:
    n = t.num_n - 1 - u
    m = t.first_m(n) + i
    return Step(n, m, t.first_n(m) + t.count(m) - 1 - n, i == 0, i + 1 == t.rows(n))
