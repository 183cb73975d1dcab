// dashgen/attn/bwd_dq_writer.cuh: the backward's dQ writer, one lane of the producer warpgroup
// (AttnBwdSm90, K). For each of its worker's tasks, in the walk's order: wait until the MMA
// warpgroups have handed the task's fp32 dQ partial over (dq_full), wait until the tile's
// counter equals the task's dq_rank (the deterministic order; bounded by the watchdog), add the
// partial onto the tile in global memory and wait until it has landed, pass the turn, free the
// buffer (dq_empty). K supplies the kernel's constants, its task ring and its shared layout.
#pragma once
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/counter.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/timer.cuh"

namespace dashgen {

template <class K>
struct BwdDqWriter {
  using Task = sched::Task;
  using Scheduler = typename K::Scheduler;

  // Writer kLane of K::kDqWriters takes tasks kLane, kLane + kDqWriters, ... (one writer: all).
  template <int kLane>
  __device__ static void run(const BwdParams& p, char* smem, typename K::Bars* bars, int count) {
    // Tracing: this worker's rows start at its offset in the IR's order (p.worker_offsets).
    const int first_row = K::kTrace ? p.worker_offsets[blockIdx.x] : 0;
    for (int i = kLane; i < count; i += K::kDqWriters) {
      const Task t = Scheduler::take_task(smem, bars, i);
      const int s = i % K::kStages, use = i / K::kStages;
      if constexpr (K::kDqPieces > 1) {
        mbarrier_wait_parity(&bars->dq_full[0], piece_parity(i, 0));  // the first piece
      } else {
        mbarrier_wait_parity(&bars->dq_full[s], use & 1);
      }
      i32* row = K::kTrace ? p.trace + static_cast<i64>(first_row + i) * kTraceColumns : nullptr;
      if (K::kTrace) trace_stamp(row, kTraceReady);
      u32* counter = p.dq_counters + (t.b * p.heads_q + t.h) * p.num_m_blocks + t.m;
      if constexpr (K::kVarlen) counter = p.dq_counters + Scheduler::q_tile(p, t);
      if (K::kDeterministic) wait_turn(p, t, counter);
      if (K::kTrace) trace_stamp(row, kTraceAcquired);
      if constexpr (K::kDqPieces > 1) {
        land_pieces(p, t, smem, bars, i);
      } else {
        land_partial(p, t, smem, s);
      }
      if (K::kTrace) trace_stamp(row, kTraceLanded);
      if (K::kDeterministic || K::kTrace) pass_turn(t, counter, row);
      if constexpr (K::kDqPieces == 1) mbarrier_arrive(&bars->dq_empty[s]);
    }
  }

  // Until the tile's counter reaches the task's dq_rank.
  __device__ static __forceinline__ void wait_turn(const BwdParams& p, const Task& t,
                                                   u32* counter) {
    if constexpr (K::kTrace) {
      // Traced builds (the tests' trace = IR check) wait unbounded: their trace row holds
      // the registers the watchdog would take.
      wait_counter_equals(counter, static_cast<u32>(t.dq_rank));
    } else {
      Scheduler::wait_rank(p, Scheduler::kStallDq, p.dq_counters, counter,
                           static_cast<u32>(t.dq_rank));
    }
    fence_proxy_async_global();  // the acquired counter orders our async-proxy add after theirs
  }

  // Stage s's dQ partial onto the task's fp32 tile in global memory, returning once it has
  // landed there (not when shared memory was read): only then may the next rank's add start.
  __device__ static __forceinline__ void land_partial(const BwdParams& p, const Task& t,
                                                      const char* smem, int s) {
    float* dst = dq_tile(p, t);
    const float* src = reinterpret_cast<const float*>(smem + K::kOffDq + s * K::kDqBytes);
    if (K::kDeterministic && t.dq_rank == 0) {
      // The first contribution in dq_rank order: the tile holds nothing yet (the preprocess
      // kernel does not zero it: 134 MB less HBM traffic at 16384 tokens x hidden 2048), so
      // the partial is stored, not added.
      bulk_store_f32(dst, src, K::kDqBytes);
    } else {
      bulk_reduce_add_f32(dst, src, K::kDqBytes);
    }
    bulk_commit_group();
    bulk_wait_group<0>();
  }

  // The task's fp32 dQ tile in global memory.
  __device__ static __forceinline__ float* dq_tile(const BwdParams& p, const Task& t) {
    constexpr int kBlockM = K::kBlockM, kHeadDim = K::kHeadDim;
    float* dst = p.dq_accum + (static_cast<i64>(t.b * p.heads_q + t.h) * p.num_m_blocks * kBlockM +
                               static_cast<i64>(t.m) * kBlockM) * kHeadDim;
    if constexpr (K::kVarlen) {
      dst = p.dq_accum + static_cast<i64>(Scheduler::q_tile(p, t)) * kBlockM * kHeadDim;
    }
    return dst;
  }

  // The swapped mainloop's partial, kDqPieces 64-column pieces through one buffer (the tile is
  // column-block-major, so piece b is the tile's b-th contiguous block): each added as it
  // arrives under the one turn this task holds, the buffer freed once the add has read it, and
  // landed, all of them, before the turn passes. Every element still gets its adds in dq_rank
  // order.
  __device__ static __forceinline__ void land_pieces(const BwdParams& p, const Task& t,
                                                     const char* smem, typename K::Bars* bars,
                                                     int i) {
    constexpr bool kShared = K::kDqBuffers < K::kDqPieces;  // buffers the pieces take in turns
    float* dst = dq_tile(p, t);
    for (int j = 0; j < K::kDqPieces; ++j) {
      const int b = K::dq_landing(j);  // the pieces' order (a buffer a warpgroup: interleaved)
      const int buffer = K::dq_buffer(b);
      if (b > 0) mbarrier_wait_parity(&bars->dq_full[buffer], piece_parity(i, b));
      const float* src = reinterpret_cast<const float*>(smem + K::kOffDq + buffer * K::kDqBytes);
      float* piece = dst + b * K::kBlockM * 64;
      if (K::kDeterministic && t.dq_rank == 0) {
        bulk_store_f32(piece, src, K::kDqBytes);  // the first contribution (see land_partial)
      } else {
        bulk_reduce_add_f32(piece, src, K::kDqBytes);
      }
      bulk_commit_group();
      if (kShared) {
        bulk_wait_group_read<0>();
        mbarrier_arrive(&bars->dq_empty[buffer]);
      }
    }
    if (!kShared) {
      bulk_wait_group_read<0>();
      for (int b = 0; b < K::kDqPieces; ++b) mbarrier_arrive(&bars->dq_empty[b]);
    }
    bulk_wait_group<0>();
  }

  // The phase of piece b of this worker's task i on its buffer's full barrier (K::dq_use).
  __device__ static __forceinline__ u32 piece_parity(int i, int b) {
    return K::dq_use(i, b) & 1;
  }

  // The tile's counter moves on to the next rank (Scheduler::signal_rank). Tracing records the
  // task and the count it saw.
  __device__ static __forceinline__ void pass_turn(const Task& t, u32* counter, i32* row) {
    const u32 seen = Scheduler::signal_rank(counter);
    if (K::kTrace) {
      row[0] = t.b; row[1] = t.h; row[2] = t.n; row[3] = t.m; row[4] = t.dq_rank;
      row[5] = static_cast<i32>(seen);
    }
  }
};

}  // namespace dashgen
