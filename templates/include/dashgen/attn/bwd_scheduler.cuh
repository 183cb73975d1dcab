// dashgen/attn/bwd_scheduler.cuh: the backward's schedule, one lane of the producer warpgroup
// (AttnBwdSm90, K) and what the other roles ask of it. The lane walks this worker's share of
// the schedule (Cfg::Walk: a named policy's integer formulas over the launch's or the pack's
// shape, or a schedule file's table) and leaves each task in a ring of kRing slots; the
// producer and the dQ writer take every task from there (take_task), so one lane holds the
// walk's state, inside the producer warpgroup's 24 registers. Also here: where a task's query
// tile sits among the dQ counters, sums and statistics (q_tile), and the dQ ranks' turn: the
// wait bounded by the watchdog (wait_rank, report_stall) and the signal to the next rank
// (signal_rank). K supplies the kernel's constants, its ring and its barriers.
#pragma once
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/counter.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/sched/walk.cuh"

namespace dashgen {

// A if kFirst, else B (std::conditional, which NVRTC's headers may lack).
template <bool kFirst, class A, class B>
struct Either {
  using type = A;
};
template <class A, class B>
struct Either<false, A, B> {
  using type = B;
};

template <class K>
struct BwdScheduler {
  using Task = sched::Task;
  using Bars = typename K::Bars;
  static constexpr int kRing = K::kRing, kOffRing = K::kOffRing;

  // The launch's shape as a named policy's walk reads it: from the parameter block and the
  // grid, where it is needed (sched::UnitWalk).
  struct LaunchShape {
    const BwdParams& p;
    // Each read is opaque (a volatile move the compiler cannot hoist), so the walk's loop keeps
    // no shape value in a register across steps: the scheduler lane has 24.
    __device__ __forceinline__ static int fresh(int value) {
      int out;
      asm volatile("mov.b32 %0, %1;" : "=r"(out) : "r"(value));
      return out;
    }
    __device__ __forceinline__ int batch() const { return fresh(p.batch); }
    __device__ __forceinline__ int heads_q() const { return fresh(p.heads_q); }
    // Query heads per KV head: 1 unless GQA (a constant there, so no division per task).
    __device__ __forceinline__ int group() const {
      return K::kGqa ? fresh(p.heads_q) / fresh(p.heads_kv) : 1;
    }
    __device__ __forceinline__ int seqlen_q() const { return fresh(p.seqlen_q); }
    __device__ __forceinline__ int seqlen_k() const { return fresh(p.seqlen_k); }
    __device__ __forceinline__ int workers() const { return fresh(static_cast<int>(gridDim.x)); }
    // A sliding window's bounds (sched::WindowTiling reads them; no other tiling does).
    __device__ __forceinline__ int window_left() const { return fresh(p.window_left); }
    __device__ __forceinline__ int window_right() const { return fresh(p.window_right); }
  };
  // A pack's shape (sched::PackWalk): per-sequence lengths from cu_seqlens, the deal's orders
  // from the plan.
  struct PackShape : LaunchShape {
    __device__ explicit PackShape(const BwdParams& params) : LaunchShape{params} {}
    __device__ __forceinline__ int seqlen_q(int b) const {
      return this->p.cu_seqlens_q[b + 1] - this->p.cu_seqlens_q[b];
    }
    __device__ __forceinline__ int seqlen_k(int b) const {
      return this->p.cu_seqlens_k[b + 1] - this->p.cu_seqlens_k[b];
    }
    __device__ __forceinline__ int dealt() const { return this->p.pack_plan[0]; }
    __device__ __forceinline__ int units_dealt() const { return this->p.pack_plan[1]; }
    __device__ __forceinline__ int order(int k) const {
      return this->p.pack_plan[kPlanHeader + k];
    }
    __device__ __forceinline__ int unit_seq(int k) const {
      return this->p.pack_plan[kPlanHeader + this->p.batch + k];
    }
    __device__ __forceinline__ int unit_index(int k) const {
      return this->p.pack_plan[kPlanHeader + this->p.batch + this->p.max_units + k];
    }
  };
  using Shape = typename Either<K::kVarlen, PackShape, LaunchShape>::type;
  using Walk = typename K::Config::template Walk<typename K::Tiling, Shape>;

  // This worker's walk: the scheduler lane walks it, and thread 0 counts its tasks (every role
  // runs that many) before the roles start. `shape` outlives the walk.
  __device__ static Walk make_walk(const BwdParams& p, const Shape& shape) {
    if constexpr (K::kTable) {
      return Walk(p.tasks, p.worker_offsets, blockIdx.x);
    } else if constexpr (K::Config::kListed) {
      return Walk(shape, p.unit_deal, blockIdx.x);
    } else {
      return Walk(shape, blockIdx.x);
    }
  }

  // The lane: each task in ring slot i % kRing for the producer and the writer, which only read
  // it, once both have read the slot's previous task.
  __device__ static void run(const BwdParams& p, char* smem, Bars* bars, int count) {
    const Shape shape{p};
    Walk walk = make_walk(p, shape);
    Task* ring = reinterpret_cast<Task*>(smem + kOffRing);
#pragma unroll 1
    for (int i = 0; i < count; ++i) {
      const int k = i % kRing;
      if (i >= kRing) mbarrier_wait_parity(&bars->ring_empty[k], ((i / kRing) - 1) & 1);
      ring[k] = walk.next();
      mbarrier_arrive(&bars->ring_full[k]);  // release: the slot's stores before the arrive
    }
  }

  // Task i from the ring (the caller arrives on ring_empty once it has read it).
  __device__ static __forceinline__ Task take_task(const char* smem, Bars* bars, int i) {
    mbarrier_wait_parity(&bars->ring_full[i % kRing], (i / kRing) & 1);
    // Plain loads, so a reader keeps only the fields it uses; the arrive (a memory clobber)
    // keeps them before the slot is released.
    const Task t = reinterpret_cast<const Task*>(smem + kOffRing)[i % kRing];
    mbarrier_arrive(&bars->ring_empty[i % kRing]);
    return t;
  }

  // The task's query tile among the dQ counters, sums and statistics: per (batch, head)
  // num_m_blocks (a pack: the sequence's block, PackedRows).
  __device__ static __forceinline__ int q_tile(const BwdParams& p, const Task& t) {
    if constexpr (K::kVarlen) {
      const PackedRows r(p.cu_seqlens_q, t.b, K::kBlockM);
      return p.heads_q * r.tile0 + t.h * r.tiles(K::kBlockM) + t.m;
    }
    return (t.b * p.heads_q + t.h) * p.num_m_blocks + t.m;
  }

  // The rank waits' roles in the watchdog's record (params.cuh, kStallWords): its rows are per
  // worker and role, role 2 the GQA dK/dV add's, which waits unbounded
  // (BwdEpilogue::add_dkv_in_rank_order) and reports nothing.
  enum StallRole : u32 { kStallDq = 1, kStallConvert = 3 };

  // Wait until the counter reaches `rank`, for at most p.watchdog_ms, else report_stall.
  __device__ static __forceinline__ void wait_rank(const BwdParams& p, StallRole role,
                                                   const u32* counters, const u32* counter,
                                                   u32 rank) {
    if (!wait_counter_equals_for(counter, rank, p.watchdog_ms * 1000000u)) {
      report_stall(p, role, counters, counter, rank);
    }
  }

  // The other side of wait_rank: a dQ tile's counter moves on once this rank's add (an
  // async-proxy bulk add) is visible to the next rank's writer and to the fused converter:
  // async-proxy then gpu-scope fence. Returns the count it replaced.
  __device__ static __forceinline__ u32 signal_rank(u32* counter) {
    fence_proxy_async_global();
    __threadfence();
    return atomic_fetch_add_relaxed_gpu(counter, 1u);
  }

  // A rank wait that did not end within p.watchdog_ms: the schedule is not live. Record what
  // waited for what (host memory Python reads: dashgen.runtime.watchdog) and abort the launch,
  // so no gradient of a broken order is ever returned. The tile is the counter's index in its
  // counter array ((batch * heads + head) * tiles + tile), which the host decodes.
  __device__ static void report_stall(const BwdParams& p, StallRole role, const u32* counters,
                                      const u32* counter, u32 rank) {
    if (p.stall != nullptr) {
      // The row's offset formed here: left to ptxas, the row's address was computed at the
      // kernel's start and held in two of the writer lane's registers throughout, and the
      // pointer loaded for word 0 below spilled (16 bytes, with two dS tiles at head_dim 64).
      u32 at = (blockIdx.x * 4 + role) * kStallWords;
      asm volatile("" : "+r"(at));
      volatile u32* row = p.stall + at;
      row[1] = K::Config::kScheduleId; row[2] = role;
      row[3] = static_cast<u32>(counter - counters);
      row[4] = rank; row[5] = ld_acquire_gpu(counter); row[6] = blockIdx.x;
      __threadfence_system();
      row[0] = kStallMagic;
      *static_cast<volatile u32*>(p.stall) = kStallMagic;  // row 0 (no role): "some row is"
      __threadfence_system();
    }
    __trap();
  }
};

}  // namespace dashgen
