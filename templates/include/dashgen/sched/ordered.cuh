// dashgen/sched/ordered.cuh: the launch-ordered schedules (fa3, spt, descending): one unit per
// KV tile, and a Q tile's adds in the order its KV tiles launch, so no unit waits for a later
// one and every worker count is live. Their Python reading: dashgen/schedule/builders.
#ifndef DASHGEN_SCHED_ORDERED_CUH
#define DASHGEN_SCHED_ORDERED_CUH
#include "dashgen/sched/tiling.cuh"

namespace dashgen {
namespace sched {

// fa3: KV tiles ascending, each visiting its Q tiles ascending; adds in ascending KV order.
// (Ranks count from the Q tile's first KV tile: 0 but under a sliding window, WindowTiling.)
template <class Tl>
struct Fa3 : RunsIndependently {
  static constexpr int kId = 1;
  DASHGEN_HD static int units(const Tl& t) { return t.num_n(); }
  DASHGEN_HD static int unit_tasks(const Tl& t, int u) { return t.rows(u); }
  DASHGEN_HD static Step step(const Tl& t, int u, int i) {
    const int m = t.first_m(u) + i;
    return Step{u, m, u - t.first_n(m), i == 0, i + 1 == t.rows(u)};
  }
};

// spt: KV tiles last first (causal: the fewest tasks first), Q tiles ascending; the highest
// KV tile adds first.
template <class Tl>
struct Spt : RunsIndependently {
  static constexpr int kId = 2;
  DASHGEN_HD static int units(const Tl& t) { return t.num_n(); }
  DASHGEN_HD static int unit_tasks(const Tl& t, int u) { return t.rows(t.num_n() - 1 - u); }
  DASHGEN_HD static Step step(const Tl& t, int u, int i) {
    const int n = t.num_n() - 1 - u, m = t.first_m(n) + i;
    return Step{n, m, t.first_n(m) + t.count(m) - 1 - n, i == 0, i + 1 == t.rows(n)};
  }
};

// descending: fa3 with each KV tile visiting its Q tiles last to first.
template <class Tl>
struct Descending : RunsIndependently {
  static constexpr int kId = 3;
  DASHGEN_HD static int units(const Tl& t) { return t.num_n(); }
  DASHGEN_HD static int unit_tasks(const Tl& t, int u) { return t.rows(u); }
  DASHGEN_HD static Step step(const Tl& t, int u, int i) {
    const int m = t.last_m(u) - i;
    return Step{u, m, u - t.first_n(m), i == 0, i + 1 == t.rows(u)};
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_ORDERED_CUH
