"""band_shift, measured and not kept: the DASH cyclic shift on a sliding-window band (no two
workers want one dQ tile at one step where the band is even; ranks in the arrival order of one
sequence), as a scheduler policy the package's assemble, verify and simulate read, and its
comparison in the simulator against fa3, spt, descending and spt_listed. It lost or tied
everywhere (docs/design.md, `band-shift`; lab/notes/tried-and-dropped.md): spt's walk is
already a diagonal on a band, and running a sequence's KV tiles in one wave costs the edge
tiles' short bands and the workers past a multiple of N.

    PYTHONPATH=. python3 lab/band_shift.py [--quick]
"""
from __future__ import annotations

import argparse

from dashgen import Problem
from dashgen.schedule.builders import build_schedule
from dashgen.schedule.builders.base import Policy, Step, Tiling, assemble
from dashgen.schedule.simulate import Cost, simulate


def band_shift_supports(problem: Problem) -> str | None:
    if problem.mask.kind != "window":
        return (f"band_shift needs a window mask, this problem has a {problem.mask} mask "
                f"(for a full mask use shift, for causal symmetric_shift)")
    return None


def band_diagonal(t: Tiling, n: int) -> int:
    """The Q tile KV tile n starts on: the one holding query row n * block_n - (seqlen_k -
    seqlen_q) (the row aligned with the tile's first key), clamped into the tile's band."""
    p = t.problem
    d = (n * p.block_n - (t.seqlen_k - t.seqlen_q)) // p.block_m
    return min(max(d, t.first_m(n)), t.last_m(n))


def band_position(t: Tiling, n: int, m: int) -> int:
    """The step at which KV tile n visits Q tile m of its band: from its diagonal up to its last
    Q tile, then from its first up to the diagonal (a rotation of the band)."""
    d = band_diagonal(t, n)
    if m >= d:
        return m - d
    return t.last_m(n) - d + 1 + m - t.first_m(n)


def band_shift_units(t: Tiling) -> int:
    """KV tile n (unit n of N) starts on its diagonal Q tile d(n) (the Q tile of the query row
    aligned with the tile's first key, clamped into its band first_m(n) .. last_m(n)) and walks
    its band as a rotation: d(n) .. last_m(n), then first_m(n) .. d(n) - 1. All N units of a
    sequence run at once (one wave holds whole sequences), and the adds into a Q tile are
    ranked in the order they arrive in that one sequence: by (step, KV tile), the step being
    the place of the tile in its unit's walk. A full-width window is the full mask's cyclic
    shift, a window of (L, 0) the diagonal walk ascending, every KV tile from its first Q tile.

    Coverage and contiguity: a unit's walk is a permutation of its band (the rotation), one
    segment of one KV tile. Total order: a Q tile's contributors are the KV tiles first_n(m) ..
    first_n(m) + count(m) - 1, and the rank of n is the number of them that sort before it by
    (step, KV tile): a permutation of 0 .. count(m) - 1, from the tiles and the window alone
    (never the worker count, the batch or the other heads). Liveness: a unit's steps rise along
    its walk, and a task waits only on adds that sort before it by (step, KV tile), so every
    wait points to a smaller (step, KV tile) pair and the waits and the walks form no cycle;
    with all N units of a sequence on distinct workers of one wave (the worker count rounded
    down to a multiple of N, at least N: its minimum) every wait is met, and a worker's earlier
    waves wait on nothing later. Fewer than N workers cannot hold a sequence at once: refused.
    Where the band is even (interior KV tiles of equal bands, block_m <= block_n) the rotation
    puts the units on distinct Q tiles at every step (the diagonals are distinct and a unit
    wrapping below its diagonal meets only tiles the units above have left), so each dQ tile's
    adds arrive one a step, in rank order, without waits; at the sequence's ends, where bands
    are clamped, two units can meet on one Q tile and the lower KV tile adds first.
    docs/design.md, `band-shift`. 512 tokens, window:128,128, 128x128 tiles, 4 workers
    (the dQ orders under it: m0 n0 n1, m1 n1 n0 n2, m2 n2 n1 n3, m3 n3 n2):

    band_shift: batch 1, heads 1, seqlen 512, head_dim 64, window:128,128 mask, blocks 128x128; 4 workers
    worker 0 | n0: m0 m1
    worker 1 | n1: m1 m2 m0
    worker 2 | n2: m2 m3 m1
    worker 3 | n3: m3 m2
    """
    return t.num_n


def band_shift_tasks(t: Tiling, u: int) -> int:
    return t.rows(u)


def band_shift_rank(t: Tiling, n: int, m: int, step: int) -> int:
    """The adds into Q tile m that arrive before KV tile n's (at `step`): by (step, KV tile)."""
    lo = t.first_n(m)
    rank = 0
    for k in range(lo, lo + t.count(m)):
        s = band_position(t, k, m)
        rank += s < step or (s == step and k < n)
    return rank


def band_shift_step(t: Tiling, u: int, i: int) -> Step:
    d, first, last = band_diagonal(t, u), t.first_m(u), t.last_m(u)
    head = last - d + 1
    m = d + i if i < head else first + i - head
    return Step(u, m, band_shift_rank(t, u, m, i), i == 0, i + 1 == last - first + 1)


BAND_SHIFT = Policy("band_shift", 8, "window: each KV tile walks its band rotated from its "
                    "diagonal Q tile, adds in a head's arrival order", band_shift_units,
                    band_shift_tasks, band_shift_step, True, band_shift_supports,
                    band_shift_units.__doc__ or "")
OTHERS = ("fa3", "spt", "descending", "spt_listed")
MASKS = ("window:128,0", "window:1024,0", "window:4096,0", "window:1024,1024")


def build(name: str, problem: Problem, workers: int):
    if name == "band_shift":
        reason = band_shift_supports(problem)
        if reason is not None:
            raise ValueError(reason)
        return assemble(BAND_SHIFT, problem, workers)
    return build_schedule(name, problem, workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8k tokens, head_dim 64 only")
    ap.add_argument("--workers", type=int, default=132)
    args = ap.parse_args()
    cost = Cost.masked(1.0, 0.2, 0.05)  # plan's costs, c scaled by the kept part of a tile
    names = (*OTHERS, "band_shift")
    print("makespan (plan's cost c=1 r=0.2 signal_latency=0.05, c masked), "
          f"{args.workers} workers; in brackets the workers used")
    print(f"{'config':<28}" + "".join(f"{n:>16}" for n in names))
    for head_dim in ((64,) if args.quick else (64, 128)):
        tiles, heads = ((128, 128), 32) if head_dim == 64 else ((64, 128), 16)
        for seqlen in ((8192,) if args.quick else (8192, 16384)):
            for mask in MASKS:
                p = Problem(heads_q=heads, seqlen_q=seqlen, head_dim=head_dim, mask=mask,
                            block_m=tiles[0], block_n=tiles[1])
                cells = []
                for name in names:
                    try:
                        s = build(name, p, args.workers)
                    except ValueError:
                        cells.append(f"{'refused':>16}")
                        continue
                    cells.append(f"{simulate(s, cost).makespan:>11.1f} ({s.num_workers:>3})")
                print(f"{f'd{head_dim} {seqlen // 1024}k {mask}':<28}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
