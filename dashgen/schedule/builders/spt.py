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


def spt_listed_units(t: Tiling) -> int:
    """spt's units, steps and ranks (the same bits), dealt listed: each unit, in launch order,
    to the worker whose dealt tasks end first (a per-launch table of units, 4 bytes a unit).

    The order for sequences whose KV tiles outnumber the SMs many times over. Dealt
    round-robin, a sequence's units continue from where the previous sequence stopped: the
    workers past the boundary start the new sequence's short first units while those before
    it still run the old one's longest, and the next round hands those busy workers the new
    sequence's earlier units, so every later unit of it reaches its first shared Q tile before
    the unit that adds ahead of it and waits there (about one long unit at each boundary).
    Listed, a unit starts no sooner than the one before it, and spt's next unit starts its walk
    on a lower Q tile, so the adds of one Q tile arrive in rank order, staggered, with one
    sequence's units side by side (the L2 keeps its Q/dO tiles and dQ sums between workers).
    docs/design.md, `listed-deal`. Two heads on 3 workers: spt's round-robin would give head
    1's n1 to worker 0 (free at step 5) and n0 to worker 1 (free at 3), so n0 would wait;
    listed, n0 goes last:

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "spt_listed", "--seqlen", "512", "--hdim", "64", "--mask",
    ...       "causal", "--workers", "3", "--heads", "2"])
    spt_listed: batch 1, heads 2, seqlen 512, head_dim 64, causal mask, blocks 128x128; 3 workers
    worker 0 | h0.n3: m3 | h0.n0: m0 m1 m2 m3 | h1.n0: m0 m1 m2 m3
    worker 1 | h0.n2: m2 m3 | h1.n3: m3 | h1.n2: m2 m3
    worker 2 | h0.n1: m1 m2 m3 | h1.n1: m1 m2 m3
    dQ reduction order (KV tiles, first to last):
      h0.m0: n0
      h0.m1: n1 n0
      h0.m2: n2 n1 n0
      h0.m3: n3 n2 n1 n0
      h1.m0: n0
      h1.m1: n1 n0
      h1.m2: n2 n1 n0
      h1.m3: n3 n2 n1 n0
    """
    return spt_units(t)
