// dashgen/sched/shift.cuh: the DASH cyclic-shift schedules (shift, symmetric_shift). A
// sequence's units all run at once (a wave holds whole sequences: the host rounds the worker
// count down to a multiple of units()), and a Q tile's adds are ranked in the order they
// arrive in that one sequence, so no two workers want one dQ tile at one step (DASH Lemma 1)
// and the ranks are functions of the tiles alone. The fewest live workers: units().
// Their Python reading: dashgen/schedule/builders/shift.py and symmetric_shift.py.
#ifndef DASHGEN_SCHED_SHIFT_CUH
#define DASHGEN_SCHED_SHIFT_CUH
#include "dashgen/sched/tiling.cuh"

namespace dashgen {
namespace sched {

// shift (full mask): KV tile n starts on Q tile n mod M and walks the Q tiles cyclically.
template <class Tl>
struct Shift : RunsTogether {
  static constexpr int kId = 4;
  DASHGEN_HD static int units(const Tl& t) { return t.num_n(); }
  DASHGEN_HD static int unit_tasks(const Tl& t, int) { return t.num_m(); }
  DASHGEN_HD static Step step(const Tl& t, int u, int i) {
    return Step{u, (u + i) % t.num_m(), shift_rank(t.num_n(), t.num_m(), u, i), i == 0,
                i + 1 == t.num_m()};
  }
};

// symmetric_shift (causal): unit p runs KV tile p (the big side) then N-1-p (the small side).
// Phase 1: the big side walks the rectangle r0 .. M-1 of Q tiles every big side has (r0 the
// first Q tile of the last big side), rotated by p, then its own extra Q tiles below r0
// ascending. Phase 2: the small side, its Q tiles descending. Ranks: in the rectangle the
// cyclic shift of the P units over its R rows; below it, ahead of p, the units whose extras
// start later (they reach the tile sooner) and equal starts below p; a small side after all P
// big sides, behind the small sides with a later first Q tile and equal ones below p.
template <class Tl>
struct SymmetricShift : RunsTogether {
  static constexpr int kId = 5;
  DASHGEN_HD static int units(const Tl& t) { return (t.num_n() + 1) / 2; }
  DASHGEN_HD static bool has_small(const Tl& t, int p) { return t.num_n() - 1 - p != p; }
  DASHGEN_HD static int unit_tasks(const Tl& t, int p) {
    return t.rows(p) + (has_small(t, p) ? t.rows(t.num_n() - 1 - p) : 0);
  }
  DASHGEN_HD static int max_of(int a, int b) { return a > b ? a : b; }
  DASHGEN_HD static int clamp_low(int a) { return a > 0 ? a : 0; }
  // Big sides (units) whose first Q tile is at most x.
  DASHGEN_HD static int below(const Tl& t, int x) {
    if (x < 0) return 0;
    const int c = t.count(x), units_ = units(t);
    return c < units_ ? c : units_;
  }
  DASHGEN_HD static Step step(const Tl& t, int p, int i) {
    const int units_ = units(t);
    const int r0 = t.first_m(units_ - 1), rect = t.num_m() - r0;
    const int f = t.first_m(p), big = t.num_m() - f;
    if (i < rect) {
      return Step{p, r0 + (p + i) % rect, shift_rank(units_, rect, p, i), i == 0, i + 1 == big};
    }
    if (i < big) {
      const int m = f + i - rect;
      return Step{p, m, below(t, m) - below(t, f) + p - below(t, f - 1), false, i + 1 == big};
    }
    // Small sides at m are units q >= lo (q < N / 2); ahead of p: from below(f) on (a later
    // first Q tile), and from below(f - 1) up to p (the same one). Summed one term at a time.
    const int m = t.num_m() - 1 - (i - big);
    const int lo = clamp_low(t.num_n() - t.count(m));
    int rank = units_ + clamp_low(t.num_n() / 2 - max_of(lo, below(t, f)));
    rank += clamp_low(p - max_of(lo, below(t, f - 1)));
    return Step{t.num_n() - 1 - p, m, rank, i == big, m == t.first_m(t.num_n() - 1 - p)};
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_SHIFT_CUH
