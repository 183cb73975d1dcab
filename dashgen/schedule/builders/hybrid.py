"""hybrid: a pack's schedule by each sequence's size: the DASH shift order (shift under a full
mask, symmetric_shift under a causal one) where the sequence's KV tiles are few enough for its
units to run at once, else the launch-ordered one (fa3, descending), which is live on any
worker count."""
from __future__ import annotations

from ..problem import Problem
from .base import Step, Tiling
from .descending import descending_step, descending_tasks, descending_units
from .fa3 import fa3_step, fa3_tasks, fa3_units
from .shift import shift_step, shift_tasks, shift_units
from .symmetric_shift import symmetric_shift_step, symmetric_shift_tasks, symmetric_shift_units

# The most KV tiles of a sequence that runs its shift order under hybrid (a fixed schedule
# parameter, so the bits never follow the GPU): 64, i.e. 8,192 keys in 128-key tiles under
# either mask, which is 64 units under a full mask (shift) and 32 under a causal one
# (symmetric_shift pairs its tiles). docs/design.md `pack-auto`: a bound of 64 units under a
# causal mask lost up to 14% on a pack with a 9k document, and 32 under a full one ran a 4k
# document 5-9% behind shift. The kernel's Hybrid (templates/include/dashgen/sched/hybrid.cuh)
# takes the same number.
HYBRID_MAX_TILES = 64

_TOGETHER = {"full": (shift_units, shift_tasks, shift_step),
             "causal": (symmetric_shift_units, symmetric_shift_tasks, symmetric_shift_step)}
_ORDERED = {"full": (fa3_units, fa3_tasks, fa3_step),
            "causal": (descending_units, descending_tasks, descending_step)}


def hybrid_supports(problem: Problem) -> str | None:
    if problem.mask.kind not in _TOGETHER:
        return (f"hybrid serves full and causal masks, this problem has a {problem.mask} mask "
                f"(use fa3, spt or descending)")
    return None


def hybrid_need(max_tiles: int, causal: bool) -> int:
    """The most units a sequence runs at once under hybrid with that bound: the fewest workers
    on which every pack is live."""
    return -(-max_tiles // 2) if causal else max_tiles


class HybridOrder:
    """The hybrid policy's formulas with `max_tiles` as its parameter: hybrid itself takes
    HYBRID_MAX_TILES; tests take small values, so that small packs mix both orders."""

    def __init__(self, max_tiles: int = HYBRID_MAX_TILES):
        self.max_tiles = max_tiles

    def together(self, t: Tiling) -> bool:
        """Whether this sequence runs the shift order (its units at once). Under a mask hybrid
        does not serve (hybrid_supports refuses it) there is none: False, so that questions
        asked before the refusal (min_workers) have an answer."""
        return t.kind in _TOGETHER and t.num_n <= self.max_tiles

    def _family(self, t: Tiling):
        return _TOGETHER[t.kind] if self.together(t) else _ORDERED.get(t.kind, _ORDERED["full"])

    def units(self, t: Tiling) -> int:
        """Each sequence by its size: shift (full mask) or symmetric_shift (causal) where it
        has at most HYBRID_MAX_TILES KV tiles, else fa3 (full) or descending (causal). The
        ranks are those of the order the sequence takes, so they follow its tiles alone; the
        fewest live workers are the largest shift-order sequence's units (at most 64 under a
        full mask, 32 under a causal one).

        >>> from dashgen.cli import main
        >>> main(["show", "--schedule", "hybrid", "--seqlen", "512", "--hdim", "64", "--workers", "4"])
        hybrid: batch 1, heads 1, seqlen 512, head_dim 64, full mask, blocks 128x128; 4 workers
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
        return self._family(t)[0](t)

    def unit_tasks(self, t: Tiling, u: int) -> int:
        return self._family(t)[1](t, u)

    def step(self, t: Tiling, u: int, i: int) -> Step:
        return self._family(t)[2](t, u, i)
