// dashgen/attn/bwd_producer.cuh: the backward's producer, one lane of the producer warpgroup
// (AttnBwdSm90, K): each segment's K/V tiles once, each task's Q, dO and softmax statistics
// into the stage the MMA warpgroups freed, all by TMA / bulk copies completing on mbarriers.
// Tensor-map coordinates run innermost first over (batch, seqlen, heads, head_dim) tensors:
// (column, head, row, batch).
#pragma once
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/tma.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

template <class K>
struct BwdProducer {
  using Task = sched::Task;
  using Bars = typename K::Bars;
  using Scheduler = typename K::Scheduler;
  static constexpr bool kVarlen = K::kVarlen, kEarlyKv = K::kEarlyKv;
  static constexpr int kBlockM = K::kBlockM, kBlockN = K::kBlockN, kStages = K::kStages;
  static constexpr int kColBlocks = K::kColBlocks, kQBytes = K::kQBytes, kKBytes = K::kKBytes;
  static constexpr int kStatsBytes = K::kStatsBytes, kOffTask = K::kOffTask;
  static constexpr int kOffQ = K::kOffQ, kOffDo = K::kOffDo, kOffK = K::kOffK, kOffV = K::kOffV;
  static constexpr int kOffStats = K::kOffStats;
  // V's and dO's column blocks and tiles (narrower than K's and Q's under MLA's 192/128).
  enum : int { kColBlocksV = K::kColBlocksV, kVBytes = K::kVBytes, kDoBytes = K::kDoBytes };
  enum : int { kOwnDo = K::kOwnDo };  // dO on a stage of its own (AttnBwdSm90::kDoStages)

  __device__ static void run(const TensorMap* tm_q, const TensorMap* tm_k,
                             const TensorMap* tm_v, const TensorMap* tm_do,
                             const BwdParams& p, char* smem, Bars* bars, int count) {
    const int group = p.heads_q / p.heads_kv;
    int segment = 0;
    for (int i = 0; i < count; ++i) {
      const Task t = Scheduler::take_task(smem, bars, i);
      // A segment's K/V go before its first task's Q/dO, or with kEarlyKv after them: then
      // those Q/dO load while the previous segment's last task still runs, and the K/V as soon
      // as its dQ MMA has freed them (not after its dK/dV stores).
      if (!kEarlyKv && t.seg_start) {
        load_kv(tm_k, tm_v, bars, smem, segment++, t.h / group, kv_row(p, t), kv_batch(t));
      }
      const int s = i % kStages, use = i / kStages;
      if constexpr (kOwnDo != 0) {
        load_task_own_do(tm_q, tm_do, p, t, bars, smem, s, use, i);
      } else {
        load_task(tm_q, tm_do, p, t, bars, smem, s, use);
      }
      if (kEarlyKv && t.seg_start) {
        load_kv(tm_k, tm_v, bars, smem, segment++, t.h / group, kv_row(p, t), kv_batch(t));
      }
    }
  }

  // The task's K/V tile in the K/V tensor maps: row and batch (a pack's rows are the sequence's
  // from its first, in a batch of one).
  __device__ static __forceinline__ int kv_row(const BwdParams& p, const Task& t) {
    if constexpr (kVarlen) return p.cu_seqlens_k[t.b] + t.n * kBlockN;
    return t.n * kBlockN;
  }
  __device__ static __forceinline__ int kv_batch(const Task& t) { return kVarlen ? 0 : t.b; }

  // A task into stage s, once the MMA warpgroups have freed it: its decoded entry into the
  // stage's slot, its Q and dO tiles and its softmax statistics.
  __device__ static __forceinline__ void load_task(const TensorMap* tm_q, const TensorMap* tm_do,
                                                   const BwdParams& p, const Task& t, Bars* bars,
                                                   char* smem, int s, int use) {
    mbarrier_wait_parity(&bars->q_empty[s], (use & 1) ^ 1);
    // Published by the arrive below (release), read after the consumers' wait (acquire).
    reinterpret_cast<Task*>(smem + kOffTask)[s] = t;
    mbarrier_arrive_expect_tx(&bars->q_full[s], kQBytes + kDoBytes + kStatsBytes);
    load_stats(p, t, bars, smem, s);
    if constexpr (kColBlocksV != kColBlocks) {
      // V narrower than K (MLA): Q's blocks, then dO's; a pack's rows are the sequence's, in
      // a batch of one.
      const int row = (kVarlen ? p.cu_seqlens_q[t.b] : 0) + t.m * kBlockM;
      const int batch = kVarlen ? 0 : t.b;
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffQ + s * kQBytes + cb * kBlockM * 128, tm_q, &bars->q_full[s],
                    cb * 64, t.h, row, batch);
      }
      for (int cb = 0; cb < kColBlocksV; ++cb) {
        tma_load_4d(smem + kOffDo + s * kDoBytes + cb * kBlockM * 128, tm_do, &bars->q_full[s],
                    cb * 64, t.h, row, batch);
      }
    } else if constexpr (kVarlen) {
      const int row = p.cu_seqlens_q[t.b] + t.m * kBlockM;  // the sequence's rows, batch 0
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffQ + s * kQBytes + cb * kBlockM * 128, tm_q, &bars->q_full[s],
                    cb * 64, t.h, row, 0);
        tma_load_4d(smem + kOffDo + s * kQBytes + cb * kBlockM * 128, tm_do, &bars->q_full[s],
                    cb * 64, t.h, row, 0);
      }
    } else {
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffQ + s * kQBytes + cb * kBlockM * 128, tm_q, &bars->q_full[s],
                    cb * 64, t.h, t.m * kBlockM, t.b);
        tma_load_4d(smem + kOffDo + s * kQBytes + cb * kBlockM * 128, tm_do, &bars->q_full[s],
                    cb * 64, t.h, t.m * kBlockM, t.b);
      }
    }
  }

  // The task's softmax statistics into stage s, with its Q: the preprocess kernel laid them
  // out per query tile (BwdParams::stats).
  __device__ static __forceinline__ void load_stats(const BwdParams& p, const Task& t,
                                                    Bars* bars, char* smem, int s) {
    if constexpr (kVarlen) {
      bulk_load(smem + kOffStats + s * kStatsBytes,
                p.stats + static_cast<i64>(Scheduler::q_tile(p, t)) * (2 * kBlockM),
                kStatsBytes, &bars->q_full[s]);
    } else {
      bulk_load(smem + kOffStats + s * kStatsBytes,
                p.stats + ((static_cast<i64>(t.b) * p.heads_q + t.h) * p.num_m_blocks + t.m) *
                              (2 * kBlockM),
                kStatsBytes, &bars->q_full[s]);
    }
  }

  // The same with dO on its own stage: Q and the statistics into stage s, then dO (the task
  // number `i`'s) once the previous task's dV^T has freed it.
  __device__ static __forceinline__ void load_task_own_do(const TensorMap* tm_q,
                                                          const TensorMap* tm_do,
                                                          const BwdParams& p, const Task& t,
                                                          Bars* bars, char* smem, int s, int use,
                                                          int i) {
    mbarrier_wait_parity(&bars->q_empty[s], (use & 1) ^ 1);
    reinterpret_cast<Task*>(smem + kOffTask)[s] = t;  // published as in load_task
    mbarrier_arrive_expect_tx(&bars->q_full[s], kQBytes + kStatsBytes);
    load_stats(p, t, bars, smem, s);
    const int row = (kVarlen ? p.cu_seqlens_q[t.b] : 0) + t.m * kBlockM;
    const int batch = kVarlen ? 0 : t.b;
    for (int cb = 0; cb < kColBlocks; ++cb) {
      tma_load_4d(smem + kOffQ + s * kQBytes + cb * kBlockM * 128, tm_q, &bars->q_full[s],
                  cb * 64, t.h, row, batch);
    }
    mbarrier_wait_parity(&bars->do_empty, (i & 1) ^ 1);
    mbarrier_arrive_expect_tx(&bars->do_full, kDoBytes);
    for (int cb = 0; cb < kColBlocksV; ++cb) {
      tma_load_4d(smem + kOffDo + cb * kBlockM * 128, tm_do, &bars->do_full, cb * 64, t.h, row,
                  batch);
    }
  }

  // A segment's K and V, once the MMA warpgroups have freed them (the first wait passes at once).
  __device__ static __forceinline__ void load_kv(const TensorMap* tm_k, const TensorMap* tm_v,
                                                 Bars* bars, char* smem, int segment, int head,
                                                 int row, int batch) {
    mbarrier_wait_parity(&bars->kv_empty, (segment & 1) ^ 1);
    mbarrier_arrive_expect_tx(&bars->kv_full, kKBytes + kVBytes);
    if constexpr (kColBlocksV != kColBlocks) {
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffK + cb * kBlockN * 128, tm_k, &bars->kv_full, cb * 64, head, row,
                    batch);
      }
      for (int cb = 0; cb < kColBlocksV; ++cb) {
        tma_load_4d(smem + kOffV + cb * kBlockN * 128, tm_v, &bars->kv_full, cb * 64, head, row,
                    batch);
      }
    } else {
      for (int cb = 0; cb < kColBlocks; ++cb) {
        tma_load_4d(smem + kOffK + cb * kBlockN * 128, tm_k, &bars->kv_full, cb * 64, head, row,
                    batch);
        tma_load_4d(smem + kOffV + cb * kBlockN * 128, tm_v, &bars->kv_full, cb * 64, head, row,
                    batch);
      }
    }
  }
};

}  // namespace dashgen
