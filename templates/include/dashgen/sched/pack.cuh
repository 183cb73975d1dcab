// dashgen/sched/pack.cuh: a worker's walk through a packed batch (sequences of their own
// lengths, as cu_seqlens give them): the deal of dashgen.schedule.builders.base.pack_deal.
// Sequences go most tasks first (ties: the lower index), each sequence's heads in order. A
// policy whose units run independently deals unit g of that order to worker g mod W; one whose
// units wait on each other (kHeadsTogether) puts a (sequence, head)'s units on consecutive
// workers of one wave, next fit. Each unit's steps and ranks are the policy's formulas over its
// own sequence's tiles, so a sequence's bits never depend on the others. Host-compilable like
// tiling.cuh (tests/test_pack_header.py checks it against the Python IR).
#ifndef DASHGEN_SCHED_PACK_CUH
#define DASHGEN_SCHED_PACK_CUH
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

// Pack: heads_q(), group() (query heads per KV head), workers(), seqlen_q(b), seqlen_k(b),
// dealt() (the sequences with tasks) and order(k) (the k-th of them dealt).
template <class Policy, class Tl, class Pack>
struct PackWalk {
  const Pack& pack;
  int worker;
  // The deal so far: the next (sequence position k, head h) to place, and the wave cursor
  // (kHeadsTogether) or the units placed before (the others).
  int k, h, placed;
  // The current unit (sequence b, head hu, unit u) and its next step i of tasks.
  int b, hu, u, i, tasks;

  DASHGEN_HD PackWalk(const Pack& pack_, int worker_)
      : pack(pack_), worker(worker_), k(0), h(0), placed(0), b(-1), hu(0), u(0), i(0),
        tasks(0) {}

  DASHGEN_HD Tl tiling(int seq) const { return Tl(pack.seqlen_q(seq), pack.seqlen_k(seq)); }

  // Moves to this worker's next unit with tasks; false past the last.
  DASHGEN_HD bool advance() {
    const int workers = pack.workers();
    if (!Policy::kHeadsTogether && b >= 0) {
      // The same head's next unit on this worker: units stride by the worker count.
      const Tl t = tiling(b);
      for (int next = u + workers; next < Policy::units(t); next += workers) {
        if (Policy::unit_tasks(t, next) > 0) {
          u = next; i = 0; tasks = Policy::unit_tasks(t, next);
          return true;
        }
      }
    }
    while (k < pack.dealt()) {
      const int seq = pack.order(k), head = h;
      const Tl t = tiling(seq);
      const int units = Policy::units(t);
      int mine = -1;  // this worker's first unit of (seq, head), if any
      if (Policy::kHeadsTogether) {
        if (placed + units > workers) placed = 0;  // the next wave
        if (worker >= placed && worker < placed + units) mine = worker - placed;
        placed += units;
      } else {
        const int first = ((worker - placed) % workers + workers) % workers;
        if (first < units) mine = first;
        placed += units;
      }
      if (++h == pack.heads_q()) {
        h = 0;
        ++k;
      }
      for (; mine >= 0 && mine < units; mine += Policy::kHeadsTogether ? units : workers) {
        if (Policy::unit_tasks(t, mine) > 0) {
          b = seq; hu = head; u = mine; i = 0; tasks = Policy::unit_tasks(t, mine);
          return true;
        }
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
