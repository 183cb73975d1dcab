// dashgen/sched/walk.cuh: a worker's walk through its tasks, the one interface the backward's
// producer and dQ writer read the schedule through (the MMA warpgroups receive each task from
// the producer). UnitWalk runs a named policy: unit g of the batch * heads_q sequences' units
// (sequence-major) on worker g mod workers, each unit's steps in order; DealtWalk the same
// units dealt by a list; TableWalk reads a verified schedule file's table. Host-compilable like
// tiling.cuh.
#ifndef DASHGEN_SCHED_WALK_CUH
#define DASHGEN_SCHED_WALK_CUH
#include "dashgen/sched/tiling.cuh"

namespace dashgen {
namespace sched {

// Shape: where the walk reads the launch's shape, each time it needs it: batch(), heads_q(),
// group() (query heads per KV head), workers(), seqlen_q(), seqlen_k(). In the kernel these read the parameter block
// and gridDim (no register holds them: the producer warpgroup has 24 a thread); the host test
// passes plain fields.
template <class Policy, class Tl, class Shape>
struct UnitWalk {
  const Shape& shape;
  // The current unit (u of the sequence (b, h)), the next step in it and its steps; advanced
  // by additions only, so the walk holds few registers.
  int u, b, h, i, tasks;

  DASHGEN_HD UnitWalk(const Shape& shape_, int worker)
      : shape(shape_), u(worker - shape_.workers()), b(0), h(0), i(0), tasks(0) {}

  DASHGEN_HD Tl tiling() const { return Tl::of(shape); }

  // This worker's task count (the MMA warpgroups run that many).
  DASHGEN_HD int count() const {
    const Tl t = tiling();
    const int per_seq = Policy::units(t), total = shape.batch() * shape.heads_q() * per_seq;
    int n = 0;
    for (int g = u + shape.workers(); g < total; g += shape.workers()) {
      n += Policy::unit_tasks(t, g % per_seq);
    }
    return n;
  }

  // The next task; call it count() times.
  DASHGEN_HD Task next() {
    const Tl t = tiling();
    while (i == tasks) {
      u += shape.workers();
      for (const int per_seq = Policy::units(t); u >= per_seq; u -= per_seq) {
        if (++h == shape.heads_q()) {
          h = 0;
          ++b;
        }
      }
      i = 0;
      tasks = Policy::unit_tasks(t, u);
    }
    const Step s = Policy::step(t, u, i++);
    const int group = shape.group();
    return Task{b, h, s.n, s.m, s.dq_rank, group > 1 ? h % group : -1, s.seg_start, s.seg_end};
  }
};

// DealtWalk runs a named policy over a listed deal (dashgen.schedule.builders.base.list_deal):
// deal[w] .. deal[w + 1] index worker w's units in `deal` (the workers + 1 offsets come first),
// each a global unit g = sequence * units + unit (sequence = batch * heads_q + head), in rising
// g; each unit's steps in order.
template <class Policy, class Tl, class Shape>
struct DealtWalk {
  const Shape& shape;
  const int* deal;
  // The next entry of this worker's deal and its end; the current unit's sequence (b, h), its
  // index u, the next step in it and its steps.
  int k, end, b, h, u, i, tasks;

  DASHGEN_HD DealtWalk(const Shape& shape_, const int* deal_, int worker)
      : shape(shape_), deal(deal_), k(deal_[worker]), end(deal_[worker + 1]), b(0), h(0), u(0),
        i(0), tasks(0) {}

  DASHGEN_HD Tl tiling() const { return Tl::of(shape); }

  DASHGEN_HD int count() const {
    const Tl t = tiling();
    const int per_seq = Policy::units(t);
    int n = 0;
    for (int j = k; j < end; ++j) n += Policy::unit_tasks(t, deal[j] % per_seq);
    return n;
  }

  DASHGEN_HD Task next() {
    const Tl t = tiling();
    while (i == tasks) {
      const int per_seq = Policy::units(t), g = deal[k++], seq = g / per_seq;
      u = g - seq * per_seq;
      b = seq / shape.heads_q();
      h = seq - b * shape.heads_q();
      i = 0;
      tasks = Policy::unit_tasks(t, u);
    }
    const Step s = Policy::step(t, u, i++);
    const int group = shape.group();
    return Task{b, h, s.n, s.m, s.dq_rank, group > 1 ? h % group : -1, s.seg_start, s.seg_end};
  }
};

// A schedule file's table (dashgen.schedule.lower): four words a task, this worker's at
// [begin, end). Segments are runs of one (batch, head, n_block).
struct TableEntry {
  int batch_head;  // batch << 16 | head (query head)
  int n_m;         // n_block << 16 | m_block
  int dq_rank;
  int dkv_rank;    // -1 without GQA
};

struct TableWalk {
  const TableEntry* tasks;
  int begin, end, i;

  DASHGEN_HD TableWalk(const TableEntry* tasks_, const int* offsets, int worker)
      : tasks(tasks_), begin(offsets[worker]), end(offsets[worker + 1]), i(offsets[worker]) {}

  DASHGEN_HD int count() const { return end - begin; }

  DASHGEN_HD Task next() {
    const TableEntry e = tasks[i];
    Task t{e.batch_head >> 16, e.batch_head & 0xffff, e.n_m >> 16, e.n_m & 0xffff, e.dq_rank,
           e.dkv_rank, false, false};
    t.seg_start = i == begin || tasks[i - 1].batch_head != e.batch_head ||
                  (tasks[i - 1].n_m >> 16) != t.n;
    t.seg_end = i + 1 == end || tasks[i + 1].batch_head != e.batch_head ||
                (tasks[i + 1].n_m >> 16) != t.n;
    ++i;
    return t;
  }
};

}  // namespace sched
}  // namespace dashgen

#endif  // DASHGEN_SCHED_WALK_CUH
