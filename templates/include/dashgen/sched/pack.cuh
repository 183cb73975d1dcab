// dashgen/sched/pack.cuh: a worker's walk through a packed batch (sequences of their own
// lengths, as cu_seqlens give them): the deal of dashgen.schedule.builders.base.pack_deal.
// A policy whose units run independently deals its units sorted by cost (unit_dealt_before),
// heads innermost, in a snake over the workers; one whose units wait on each other
// (together) puts each (sequence, head)'s units on consecutive workers of one wave, next
// fit, sequences most tasks first (dealt_before); a policy with both kinds (Hybrid) deals the
// independent units first, then the waves. Each unit's steps and ranks are the policy's formulas over its
// own sequence's tiles, so a sequence's bits never depend on the others. Host-compilable like
// tiling.cuh (tests/test_pack_header.py checks it against the Python IR).
#ifndef DASHGEN_SCHED_PACK_CUH
#define DASHGEN_SCHED_PACK_CUH
#include "dashgen/sched/ordered.cuh"
#include "dashgen/sched/tiling.cuh"

namespace dashgen {
namespace sched {

// Whether sequence a (tasks_a tasks) is dealt before sequence b: more tasks first, then the
// lower index. The launch computes the order once from this rule (Pack::order).
DASHGEN_HD bool dealt_before(int tasks_a, int a, int tasks_b, int b) {
  return tasks_a != tasks_b ? tasks_a > tasks_b : a < b;
}

// One (batch, head) sequence's tasks under Policy; 0 without queries or keys (the Tiling's
// closed forms assume both).
template <class Policy, class Tl>
DASHGEN_HD int sequence_tasks(const Tl& t) {
  if (t.seqlen_q == 0 || t.seqlen_k == 0) return 0;
  int n = 0;
  for (int u = 0; u < Policy::units(t); ++u) n += Policy::unit_tasks(t, u);
  return n;
}

// Whether a pack deals Policy's independent units cheapest first (base.py, _deals_rising):
// where their costs rise along the unit order, spt's under a causal mask.
template <class Policy, class Tl>
struct DealsRising {
  static constexpr bool value = false;
};
template <int kBlockM, int kBlockN>
struct DealsRising<Spt<Tiling<kBlockM, kBlockN, true>>, Tiling<kBlockM, kBlockN, true>> {
  static constexpr bool value = true;
};
template <int kBlockM, int kBlockN>
struct DealsRising<Spt<WindowTiling<kBlockM, kBlockN>>, WindowTiling<kBlockM, kBlockN>> {
  static constexpr bool value = true;
};

// Whether a tiling's units already cost monotonically along every policy's unit order: under
// the full and causal masks they do (fa3 and descending: non-increasing, spt: non-decreasing,
// full: equal); under a window not (KV tiles without rows among them). Functions, not static
// members: NVRTC emits those as globals of the module.
template <int kBlockM, int kBlockN, bool kCausal>
DASHGEN_HD constexpr bool tasks_monotone(const Tiling<kBlockM, kBlockN, kCausal>*) {
  return true;
}
template <int kBlockM, int kBlockN>
DASHGEN_HD constexpr bool tasks_monotone(const WindowTiling<kBlockM, kBlockN>*) {
  return false;
}

// Unit u's cost as the deal sorts it (base.py, _deal_keys): its tasks made monotone along the
// unit order, the running minimum (maximum when dealing rising) of the units up to it. Where the
// tasks already are monotone (tasks_monotone), that is the unit's tasks.
template <class Policy, class Tl>
DASHGEN_HD int deal_key(const Tl& t, int u) {
  if constexpr (tasks_monotone(static_cast<const Tl*>(nullptr))) {
    return Policy::unit_tasks(t, u);
  } else {
    int best = Policy::unit_tasks(t, 0);
    for (int v = 1; v <= u; ++v) {
      const int cost = Policy::unit_tasks(t, v);
      best = DealsRising<Policy, Tl>::value ? (cost > best ? cost : best)
                                            : (cost < best ? cost : best);
    }
    return best;
  }
}

// Whether unit (key_a, place_a, u_a) is dealt before (key_b, place_b, u_b): by key (falling,
// or rising where DealsRising), then the sequence's place in the order, then the unit.
template <class Policy, class Tl>
DASHGEN_HD bool unit_dealt_before(int key_a, int place_a, int u_a, int key_b, int place_b,
                                  int u_b) {
  if (key_a != key_b) return DealsRising<Policy, Tl>::value ? key_a < key_b : key_a > key_b;
  return place_a != place_b ? place_a < place_b : u_a < u_b;
}

// Pack: heads_q(), group() (query heads per KV head), workers(), seqlen_q(b), seqlen_k(b)
// (and window_left(), window_right() for WindowTiling);
// dealt() and order(k): the sequences with tasks in the order they are dealt (dealt_before);
// for independent units, units_dealt() and unit_seq(k), unit_index(k): the units with tasks
// in the order they are dealt (unit_dealt_before). The launch computes these orders once.
template <class Policy, class Tl, class Pack>
struct PackWalk {
  const Pack& pack;
  int worker;
  // The deal so far. Independent units: the next snake round r. Units that wait on each other:
  // the next (sequence position k, head h) to place and the wave cursor.
  int r, k, h, cursor;
  // The current unit (sequence b, head hu, unit u) and its next step i of tasks.
  int b, hu, u, i, tasks;

  DASHGEN_HD PackWalk(const Pack& pack_, int worker_)
      : pack(pack_), worker(worker_), r(0), k(0), h(0), cursor(0), b(-1), hu(0), u(0), i(0),
        tasks(0) {}

  DASHGEN_HD Tl tiling(int seq) const { return Tl::of(pack, seq); }

  // Moves to this worker's next unit with tasks; false past the last.
  DASHGEN_HD bool advance() {
    const int workers = pack.workers();
    if constexpr (!Policy::kHeadsTogether) {
      // Snake: item j = (unit k, head j % heads) of round j / workers, every second reversed.
      const int heads = pack.heads_q(), total = heads * pack.units_dealt();
      for (;;) {
        const int j = r * workers + ((r & 1) ? workers - 1 - worker : worker);
        ++r;
        if (j >= total) break;
        b = pack.unit_seq(j / heads);
        hu = j % heads;
        u = pack.unit_index(j / heads);
        i = 0;
        tasks = Policy::unit_tasks(tiling(b), u);
        if (tasks > 0) return true;
      }
    }
    if constexpr (Policy::kMayRunTogether) return advance_together(workers);
    return false;
  }

  // advance() for units that wait on each other: each (sequence, head)'s units on consecutive
  // workers of one wave, next fit.
  DASHGEN_HD bool advance_together(int workers) {
    while (k < pack.dealt()) {
      const int seq = pack.order(k), head = h;
      const Tl t = tiling(seq);
      if (!Policy::together(t)) {  // dealt in the snake
        h = 0;
        ++k;
        continue;
      }
      const int units = Policy::units(t);
      if (cursor + units > workers) cursor = 0;  // the next wave
      const int mine = worker - cursor;  // this worker's unit of (seq, head), if in range
      cursor += units;
      if (++h == pack.heads_q()) {
        h = 0;
        ++k;
      }
      if (mine >= 0 && mine < units && Policy::unit_tasks(t, mine) > 0) {
        b = seq; hu = head; u = mine; i = 0; tasks = Policy::unit_tasks(t, mine);
        return true;
      }
    }
    return false;
  }

  // This worker's task count (a fresh walk of the deal).
  DASHGEN_HD int count() const {
    PackWalk walk(pack, worker);
    int n = 0;
    while (walk.advance()) n += walk.tasks;
    return n;
  }

  // The next task; call it count() times.
  DASHGEN_HD Task next() {
    if (i == tasks) advance();
    const Step s = Policy::step(tiling(b), u, i++);
    const int group = pack.group();
    return Task{b, hu, s.n, s.m, s.dq_rank, group > 1 ? hu % group : -1, s.seg_start,
                s.seg_end};
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_PACK_CUH
