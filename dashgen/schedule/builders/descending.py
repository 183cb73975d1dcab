"""descending: the DASH heuristic of reversed Q-tile iteration."""
from __future__ import annotations

from .base import Step, Tiling


def descending_units(t: Tiling) -> int:
    """Like fa3, but each KV tile visits its Q tiles from the last down to its first.

    Under a causal mask every KV tile starts on the last Q tile: the workers serialize once
    there and then never wait again. Ranks stay ascending by KV tile.

    >>> from dashgen.cli import main
    >>> main(["show", "--schedule", "descending", "--seqlen", "512", "--hdim", "64", "--mask", "causal",
    ...       "--workers", "4"])
    descending: batch 1, heads 1, seqlen 512, head_dim 64, causal mask, blocks 128x128; 4 workers
    worker 0 | n0: m3 m2 m1 m0
    worker 1 | n1: m3 m2 m1
    worker 2 | n2: m3 m2
    worker 3 | n3: m3
    dQ reduction order (KV tiles, first to last):
      m0: n0
      m1: n0 n1
      m2: n0 n1 n2
      m3: n0 n1 n2 n3
    """
    return t.num_n


def descending_tasks(t: Tiling, u: int) -> int:
    return t.rows(u)


def descending_step(t: Tiling, u: int, i: int) -> Step:
    m = t.last_m(u) - i
    return Step(u, m, u - t.first_n(m), i == 0, i + 1 == t.rows(u))
