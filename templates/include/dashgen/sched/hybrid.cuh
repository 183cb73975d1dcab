// dashgen/sched/hybrid.cuh: hybrid, a pack's schedule by each sequence's size. A sequence of at
// most kMaxTiles KV tiles runs its mask's shift order (shift under a full mask, symmetric_shift
// under a causal one), its units at once; a longer one runs the launch-ordered one (fa3,
// descending), live on any worker count. Ranks are the chosen order's, over the sequence's own
// tiles. Its Python reading: dashgen/schedule/builders/hybrid.py (HYBRID_MAX_TILES is
// kHybridMaxTiles).
#ifndef DASHGEN_SCHED_HYBRID_CUH
#define DASHGEN_SCHED_HYBRID_CUH
#include "dashgen/sched/ordered.cuh"
#include "dashgen/sched/shift.cuh"

namespace dashgen {
namespace sched {

constexpr int kHybridMaxTiles = 64;

// The two orders hybrid chooses between, per mask.
template <class Tl>
struct HybridOrders;
template <int kBlockM, int kBlockN>
struct HybridOrders<Tiling<kBlockM, kBlockN, false>> {
  using Together = Shift<Tiling<kBlockM, kBlockN, false>>;
  using Ordered = Fa3<Tiling<kBlockM, kBlockN, false>>;
};
template <int kBlockM, int kBlockN>
struct HybridOrders<Tiling<kBlockM, kBlockN, true>> {
  using Together = SymmetricShift<Tiling<kBlockM, kBlockN, true>>;
  using Ordered = Descending<Tiling<kBlockM, kBlockN, true>>;
};

template <class Tl, int kMaxTiles = kHybridMaxTiles>
struct Hybrid {
  using Together = typename HybridOrders<Tl>::Together;
  using Ordered = typename HybridOrders<Tl>::Ordered;
  static constexpr int kId = 6;
  static constexpr bool kHeadsTogether = false, kMayRunTogether = true;
  DASHGEN_HD static bool together(const Tl& t) { return t.num_n() <= kMaxTiles; }
  DASHGEN_HD static int units(const Tl& t) {
    return together(t) ? Together::units(t) : Ordered::units(t);
  }
  DASHGEN_HD static int unit_tasks(const Tl& t, int u) {
    return together(t) ? Together::unit_tasks(t, u) : Ordered::unit_tasks(t, u);
  }
  DASHGEN_HD static Step step(const Tl& t, int u, int i) {
    return together(t) ? Together::step(t, u, i) : Ordered::step(t, u, i);
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_HYBRID_CUH
