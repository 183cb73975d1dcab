// dashgen/attn/bwd_mainloop_swapped.cuh: the backward's MMA mainloop where a warpgroup cannot
// hold dK and dV of 64 KV rows over the whole head_dim (at 256 the two accumulators alone would
// take 256 registers a thread). The operands are swapped: a task is 64 query rows against
// kBlockN KV rows (96 at 192, 64 at 256), each MMA warpgroup owns half of them and accumulates
// dV^T = dO^T P and dK^T = Q^T dS (M = 64 head_dim columns a wgmma, N = its kKeys keys) over
// every 64-column block of the head_dim (at 256 instead half the blocks over all the keys:
// kSplit). Per task:
//   1 S = Q K^T and dP = dO V^T over this warpgroup's keys (SS, N = kKeys, K-major);
//   2 P and dS recomputed per query row (its lse and D from the stage's statistics);
//   3 P^T into shared memory ([key][query], transposing stmatrix), then dV^T (A = dO MN-major,
//     B = P^T K-major), read by this warpgroup alone;
//   4 dS^T likewise, behind both warpgroups' barriers: dQ reads every key's dS;
//   5 dK^T (A = Q), then dQ = dS K over this warpgroup's half of the columns (A = dS^T, B = K,
//     both MN-major), the stage and (kEarlyKv) K/V released once they retire;
//   6 dQ to the dQ writer one 64-column piece at a time, through a buffer a piece, a buffer a
//     warpgroup (K::kDqPerWg) or buffers both take in turns (K::kDqBuffers;
//     attn/bwd_dq_writer.cuh adds the pieces of a task under one dq_rank turn). The fp32 dQ
//     sum is column-block-major per tile ([tile][column block][row][64]) so that each piece
//     is one contiguous bulk add (AttnConvert reads it so).
// At a segment's end BwdEpilogueSwapped stores (or under GQA adds) the transposed dK/dV.
#pragma once
#include "dashgen/attn/bwd_epilogue_swapped.cuh"
#include "dashgen/attn/bwd_mainloop.cuh"
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/mask.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softcap.cuh"
#include "dashgen/attn/tiles_sm90.cuh"
#include "dashgen/ptx/barrier.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/stmatrix.cuh"
#include "dashgen/ptx/wgmma.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

// The kernel's mainloop: the swapped one or the rows one (BwdMainloop).
template <bool kSwapped, class Swapped, class Rows>
struct MainloopOf {
  using type = Rows;
};
template <class Swapped, class Rows>
struct MainloopOf<true, Swapped, Rows> {
  using type = Swapped;
};

template <class K>
struct BwdMainloopSwapped {
  using T = typename K::T;
  using Task = sched::Task;
  using Bars = typename K::Bars;
  using MmaThread = typename K::MmaThread;
  using Epilogue = BwdEpilogueSwapped<K>;
  static constexpr WgmmaInput kIn = K::kIn;
  static constexpr int kHeadDim = K::kHeadDim, kBlockM = K::kBlockM, kBlockN = K::kBlockN;
  static constexpr int kColBlocks = K::kColBlocks;
  enum : int { kHeadDimV = K::kHeadDimV, kColBlocksV = K::kColBlocksV, kDoBytes = K::kDoBytes };
  static constexpr int kKeys = kBlockN / 2;        // a warpgroup's KV rows
  static constexpr int kAcc = kKeys / 2;           // registers of one m64n32 accumulator
  // dQ's 64-column pieces (column blocks): warpgroup 0 computes the first kPieces0, warpgroup 1
  // the other kPieces1 (at 192 two and one: 96 columns would start an MN-major B operand in the
  // middle of a swizzle block).
  static constexpr int kPieces0 = (kColBlocks + 1) / 2, kPieces1 = kColBlocks - kPieces0;
  // Fewer dQ buffers than pieces, taken in turns (192/192: two), one a warpgroup (256), or one
  // a piece (192/128): K::kDqBuffers.
  // A buffer of each warpgroup's own (K::kDqPerWg) is shared by no other: no turns.
  static constexpr bool kSharedBuffer = K::kDqBuffers < K::kDqPieces && !K::kDqPerWg;
  static constexpr bool kCausal = K::kCausal, kGqa = K::kGqa, kVarlen = K::kVarlen;
  static constexpr bool kEarlyKv = K::kEarlyKv;
  enum : int { kSoftcap = has_softcap<typename K::Config>(0) };
  enum : int { kWindow = K::kWindow };
  static constexpr int kStages = K::kStages;
  static constexpr int kQBytes = K::kQBytes;
  static constexpr int kOffK = K::kOffK, kOffV = K::kOffV, kOffQ = K::kOffQ, kOffDo = K::kOffDo;
  static constexpr int kOffPt = K::kOffDs, kOffDst = K::kOffDs + K::kDsBytes;
  static constexpr int kOffDq = K::kOffDq, kOffStats = K::kOffStats;
  static_assert(kBlockM == 64 && (kBlockN == 64 || kBlockN == 80 || kBlockN == 96),
                "64 query rows against 64, 80 or 96 KV rows a task");
  enum : int { kOwnDo = K::kOwnDo };  // dO on a stage of its own (AttnBwdSm90::kDoStages)
  static_assert(kHeadDim == 192 || kHeadDim == 256, "head_dim 192 or 256");
  // Who owns what of dK^T/dV^T (K::kSplitHeadDim): kOwnBlocks column blocks each, N = kDkvN
  // keys a wgmma (all the task's keys when split, the warpgroup's own otherwise).
  static constexpr bool kSplit = K::kSplitHeadDim != 0;
  static constexpr int kOwnBlocks = kSplit ? kColBlocks / 2 : kColBlocks;
  enum : int { kOwnBlocksV = kSplit ? kColBlocksV / 2 : kColBlocksV };  // dV^T's (V's columns)
  static constexpr int kDkvN = kSplit ? kBlockN : kKeys, kDkvAcc = kDkvN / 2;

  __device__ static void consume(const BwdParams& p, char* smem, Bars* bars, int begin, int end,
                                 int wg, int tid) {
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const MmaThread me{wg, tid, warp, lane, lane >> 2, lane & 3};
    const int group = p.heads_q / p.heads_kv;
    int seq_k = p.seqlen_k, seq_offset = p.seqlen_k - p.seqlen_q;
    float dkt[kOwnBlocks][kDkvAcc], dvt[kOwnBlocksV][kDkvAcc];  // this warpgroup's dK^T, dV^T
    int segment = 0;

    // i < end, the count read again at each task's end (task_count).
    for (int i = begin; i < begin + task_count(smem); ++i) {
      const int s = (i - begin) % kStages, use = (i - begin) / kStages;
      mbarrier_wait_parity(&bars->q_full[s], use & 1);
      const Task t =
          BwdMainloop<K>::load_task_slot(reinterpret_cast<const Task*>(smem + K::kOffTask) + s);
      if constexpr (kVarlen) {
        seq_k = p.cu_seqlens_k[t.b + 1] - p.cu_seqlens_k[t.b];
        seq_offset = seq_k - (p.cu_seqlens_q[t.b + 1] - p.cu_seqlens_q[t.b]);
      }
      if (t.seg_start) {
        mbarrier_wait_parity(&bars->kv_full, segment & 1);
#pragma unroll
        for (int j = 0; j < kOwnBlocks; ++j) {
#pragma unroll
          for (int e = 0; e < kDkvAcc; ++e) dkt[j][e] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < kOwnBlocksV; ++j) {
#pragma unroll
          for (int e = 0; e < kDkvAcc; ++e) dvt[j][e] = 0.f;
        }
      }
      const char* q_tile = smem + kOffQ + s * kQBytes;
      const char* do_tile = smem + kOffDo + (kOwnDo != 0 ? 0 : s * kDoBytes);
      if constexpr (kOwnDo != 0) mbarrier_wait_parity(&bars->do_full, (i - begin) & 1);

      // 1. S and dP of this warpgroup's keys.
      float sc[kAcc], dp[kAcc];
      wgmma_fence();
      {
        // Each operand's descriptor as a uniform low word (attn/tiles_sm90.cuh).
        const char* own_keys = smem + kKeys * wg * 128;
        const u32 q_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(q_tile));
        const u32 k_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(own_keys + kOffK));
#pragma unroll
        for (int k = 0; k < kHeadDim / 16; ++k) {
          wgmma_ss<kIn, kKeys>(sc, k_major_step<kBlockM>(q_lo, k), k_major_step<kBlockN>(k_lo, k),
                               k > 0);
        }
        const u32 do_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(do_tile));
        const u32 v_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(own_keys + kOffV));
#pragma unroll
        for (int k = 0; k < kHeadDimV / 16; ++k) {
          wgmma_ss<kIn, kKeys>(dp, k_major_step<kBlockM>(do_lo, k), k_major_step<kBlockN>(v_lo, k),
                               k > 0);
        }
      }
      wgmma_commit_group();

      // 2. P and dS, packed in pairs of adjacent keys.
      u32 pk[kAcc / 2], dsk[kAcc / 2];
      const float* stats = reinterpret_cast<const float*>(smem + kOffStats) + s * 2 * kBlockM;
      wgmma_wait_group<0>();
      recompute(sc, dp, stats, pk, dsk, p, t, seq_k, seq_offset, me);

      // 3. P^T for dV^T: its own rows of the tile behind its own barrier, or (kSplit: dV^T reads
      // every key's) behind both warpgroups'.
      store_transposed(smem + kOffPt, pk, me);
      fence_proxy_async_shared();
      if constexpr (kSplit) {
        K::sync_mma_warpgroups();
      } else {
        named_barrier_sync(static_cast<u32>(K::Barrier::kWarpgroup0) + wg, 128);
      }
      wgmma_fence();
      transposed_gemm(dvt, do_tile, smem + kOffPt, wg);

      // 4. dS^T: the previous task's dQ reads of the tile are done once both warpgroups pass.
      // kSplit: dV^T retired first, so past this barrier no warpgroup reads P^T, which the next
      // task rewrites.
      if constexpr (kSplit) wgmma_wait_group<0>();
      if constexpr (kOwnDo != 0) mbarrier_arrive(&bars->do_empty);  // dV^T read it last
      K::sync_mma_warpgroups();
      store_transposed(smem + kOffDst, dsk, me);
      fence_proxy_async_shared();
      K::sync_mma_warpgroups();

      // 5 and 6.
      float dq[32];
      dk_and_dq(dkt, dq, smem, q_tile, bars, i - begin, s, t.seg_end, me);
      if (t.seg_end) {
        if constexpr (kGqa) {
          Epilogue::add_dkv_in_rank_order(p, t, dkt, dvt, me);
        } else {
          Epilogue::store_dkv(p, t, dkt, dvt, group, me);
        }
        if (!kEarlyKv && me.tid % 128 == 0) mbarrier_arrive(&bars->kv_empty);
        ++segment;
      }
    }
  }

  // The walk's task count, read from its shared-memory slot at each task's end: held in a
  // register across the task, ptxas spilled it at 192 (NVRTC 13: 32 bytes a 192/192 kernel).
  __device__ static __forceinline__ int task_count(const char* smem) {
    int count;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(count)
                 : "r"(shared_address(smem + K::kOffCount)));
    return count;
  }

  // Stages 5 and 6: dQ's first piece, dK^T under its hand-off, then the other pieces, each
  // computed (N = 64) and handed to the writer in turn: one piece's 32 registers live, not 64.
  // Both warpgroups run kPieces0 rounds of waits; where warpgroup 1 has fewer pieces (192) it
  // skips the last round's wgmma (NVRTC 13's ptxas compiles that branch without serializing the
  // wgmmas, C7511) and keeps its wait and release. Q/dO stage s (and K/V at a segment's end)
  // are released with the last wgmmas that read them.
  __device__ static __forceinline__ void dk_and_dq(float (&dkt)[kOwnBlocks][kDkvAcc],
                                                   float (&dq)[32], char* smem,
                                                   const char* q_tile, Bars* bars, int task,
                                                   int s, bool seg_end, const MmaThread& me) {
    const int wg = me.wg;
    const int first = wg == 0 ? 0 : kPieces0, pieces = wg == 0 ? kPieces0 : kPieces1;
    dq_mma(dq, smem, first);
    transposed_gemm(dkt, q_tile, smem + kOffDst, wg);
    wgmma_wait_group<1>();  // the first piece retired
    if (kSharedBuffer && wg == 1) {
      named_barrier_sync(static_cast<u32>(K::Barrier::kHandOff), 256);
    }
    hand_off_piece(dq, smem, bars, task, first, me);
#pragma unroll
    for (int b = 1; b < kPieces0; ++b) {
      if (b < pieces) dq_mma(dq, smem, first + b);
      wgmma_wait_group<0>();
      if (b == kPieces0 - 1) release_stage(bars, s, seg_end, me);
      if (b < pieces) hand_off_piece(dq, smem, bars, task, first + b, me);
    }
    if (kSharedBuffer && wg == 0) {
      named_barrier_arrive(static_cast<u32>(K::Barrier::kHandOff), 256);
    }
  }

  // Accumulator element e of an m64n32 tile: query row 16 warp + g + 8 ((e / 2) % 2) of the
  // task (the row of element e of any m64nN tile), key 8 (e / 4) + 2 t4 + e % 2 of this
  // warpgroup's keys.
  __device__ static __forceinline__ int row_of(int e, const MmaThread& me) {
    return 16 * me.warp + me.g + 8 * ((e / 2) % 2);
  }
  __device__ static __forceinline__ int key_of(int e, const MmaThread& me) {
    return 8 * (e / 4) + 2 * me.t4 + e % 2;
  }

  // P = exp2(S scale - lse) and dS = P (dP softmax_scale - D), D scaled by the preprocess; the
  // mask per element only on a task whose keys (this warpgroup's) it reaches. A masked pair
  // gets P = 0 and so dS = 0 (soft-capped too: t is finite).
  __device__ static __forceinline__ void recompute(
      const float (&sc)[kAcc], const float (&dp)[kAcc], const float* stats, u32 (&pk)[kAcc / 2],
      u32 (&dsk)[kAcc / 2], const BwdParams& p, const Task& t, int seq_k, int seq_offset,
      const MmaThread& me) {
    // Formed per task from the parameters: held through the loop it cost a register.
    const float scale_log2 = (kSoftcap != 0 ? p.softcap : p.softmax_scale) * kLog2e;
    const int first_key = t.n * kBlockN + kKeys * me.wg, first_row = t.m * kBlockM;
    const bool edge =
        kWindow != 0
            ? window_reaches(first_key, first_key + kKeys - 1, first_row,
                             first_row + kBlockM - 1, seq_k, seq_offset, p.window_left,
                             p.window_right)
            : mask_reaches<kCausal>(first_key + kKeys - 1, first_row, seq_k, seq_offset);
#pragma unroll
    for (int e2 = 0; e2 < kAcc; e2 += 2) {
      float pv[2], ds[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = e2 + h;
        const int row = row_of(e, me), key = first_key + key_of(e, me);
        bool masked = false;
        if (edge) {
          masked = kWindow != 0 ? window_masked(key, first_row + row, seq_k, seq_offset,
                                                p.window_left, p.window_right)
                                : masked_pair(key, first_row + row, seq_k, seq_offset);
        }
        const float score = kSoftcap != 0 ? tanh_approx(sc[e] * p.tanh_scale) : sc[e];
        pv[h] = masked ? 0.f : exp2f(score * scale_log2 - stats[row]);
        ds[h] = pv[h] * fmaf(dp[e], p.softmax_scale, -stats[kBlockM + row]);
        if constexpr (kSoftcap != 0) ds[h] *= fmaf(-score, score, 1.f);  // d softcap t / d score
      }
      pk[e2 / 2] = Element<T>::pack(pv[0], pv[1]);
      dsk[e2 / 2] = Element<T>::pack(ds[0], ds[1]);
    }
  }

  __device__ static __forceinline__ bool masked_pair(int key, int qrow, int seq_k, int diagonal) {
    return kCausal ? masked<true>(key, qrow, seq_k, diagonal)
                   : masked<false>(key, qrow, seq_k, diagonal);
  }

  // A packed m64nK tile (K = kKeys: pairs of adjacent keys of one query row) stored transposed
  // into this warpgroup's K rows of a [kBlockN keys][64 queries] tile (128-byte rows,
  // swizzled): stmatrix h takes pk[4h..4h+3], its matrices (query half m % 2, key block
  // 2h + m / 2); lane l addresses key row 8 (2h + (l / 8) / 2) + l % 8 at query
  // 16 warp + 8 ((l / 8) % 2). Where K is an odd number of 8-key blocks (40), the last block's
  // two matrices (pk[4h], pk[4h + 1]) go by one x2 store (lanes 0-15 address them).
  __device__ static __forceinline__ void store_transposed(char* tile, const u32 (&pk)[kAcc / 2],
                                                          const MmaThread& me) {
    const int m = me.lane / 8;
#pragma unroll
    for (int h = 0; h < kAcc / 8; ++h) {
      const u32 key_row = kKeys * me.wg + 8 * (2 * h + m / 2) + me.lane % 8;
      const u32 dst = shared_address(tile) +
                      sw128_byte_offset(key_row, (16 * me.warp + 8 * (m % 2)) * 2);
      const u32 r[4] = {pk[4 * h], pk[4 * h + 1], pk[4 * h + 2], pk[4 * h + 3]};
      stmatrix_x4_trans(dst, r);
    }
    if constexpr (kAcc % 8 != 0) {
      static_assert(kAcc % 8 == 4, "whole 8-key blocks");
      constexpr int h = kAcc / 8;
      const u32 key_row = kKeys * me.wg + 8 * (2 * h) + me.lane % 8;
      const u32 dst = shared_address(tile) +
                      sw128_byte_offset(key_row, (16 * me.warp + 8 * (m % 2)) * 2);
      const u32 r[2] = {pk[4 * h], pk[4 * h + 1]};
      stmatrix_x2_trans(dst, r);
    }
  }

  // acc^T += A^T B over the task's query rows, one commit group: dV^T += dO^T P (a_tile = dO,
  // b_tile = P^T) or dK^T += Q^T dS (Q, dS^T). Per owned 64-column block of the head_dim: A is
  // the block of the Q/dO tile read MN-major (M = 64 columns, one swizzle block), B the
  // transposed tile's rows of the keys owned (all 64 when kSplit, else this warpgroup's 32),
  // K-major.
  template <int kBlocks>
  __device__ static __forceinline__ void transposed_gemm(float (&acc)[kBlocks][kDkvAcc],
                                                         const char* a_tile, const char* b_tile,
                                                         int wg) {
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      const int block = kSplit ? kBlocks * wg + j : j;
      const u32 a_lo = uniform_desc_lo(
          wgmma_desc_mn_major_sw128(a_tile + block * kBlockM * 128, kBlockM * 128));
      const u32 b_lo = uniform_desc_lo(
          wgmma_desc_k_major_sw128(b_tile + (kSplit ? 0 : kKeys * wg) * 128));
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        wgmma_ss<kIn, kDkvN, 1, 0>(acc[j], desc_from_lo(a_lo, kk * kSw128MnMajorKStepBytes),
                                   k_major_step<kBlockN>(b_lo, kk), true);
      }
    }
    wgmma_commit_group();
  }

  // Column block cb of dQ = dS K: A = dS^T (keys x queries, MN-major: M = 64 queries, one
  // swizzle block), B = K's column block cb (MN-major, N = 64).
  __device__ static __forceinline__ void dq_mma(float (&dq)[32], const char* smem, int cb) {
    const u32 a_lo = uniform_desc_lo(wgmma_desc_mn_major_sw128(smem + kOffDst, kBlockN * 128));
    const u32 b_lo = uniform_desc_lo(
        wgmma_desc_mn_major_sw128(smem + kOffK + cb * kBlockN * 128, kBlockN * 128));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wgmma_ss<kIn, 64, 1, 1>(dq, desc_from_lo(a_lo, kk * kSw128MnMajorKStepBytes),
                              desc_from_lo(b_lo, kk * kSw128MnMajorKStepBytes), kk > 0);
    }
    wgmma_commit_group();
  }

  // Q/dO stage s free once dK^T's and the last dQ piece's wgmmas retired, and (kEarlyKv) at a
  // segment's end K/V.
  __device__ static __forceinline__ void release_stage(Bars* bars, int s, bool seg_end,
                                                       const MmaThread& me) {
    if (kEarlyKv && me.tid % 128 == 0 && seg_end) mbarrier_arrive(&bars->kv_empty);
    mbarrier_arrive(&bars->q_empty[s]);
  }

  // dQ's piece of column block cb of this walk's task number `task` to the writer. Through
  // shared buffers the pieces go in the writer's order, column block by column block:
  // warpgroup 0's, then warpgroup 1's; the piece that is use n of its buffer (K::dq_use) waits
  // for n reads of it. The parity of one barrier tells only consecutive phases apart, so the
  // warpgroups take turns: warpgroup 1 starts after warpgroup 0's last store (kHandOff, in
  // consume); warpgroup 0's next task starts after both passed that task's stage-4 barrier,
  // which warpgroup 1 reaches only after its stores. With a buffer a piece, each is filled once
  // a task; with a buffer a warpgroup (K::kDqPerWg), each takes its own warpgroup's pieces in
  // order and no turns are needed.
  __device__ static __forceinline__ void hand_off_piece(const float (&dq)[32], char* smem,
                                                        Bars* bars, int task, int cb,
                                                        const MmaThread& me) {
    const int buffer = K::dq_buffer(cb);
    const int n = K::dq_use(task, cb);
    float* buf = reinterpret_cast<float*>(smem + kOffDq + buffer * K::kDqBytes);
    mbarrier_wait_parity(&bars->dq_empty[buffer], (n & 1) ^ 1);
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
      const int col = accum_col(me.g, 8 * (e / 4) + 2 * me.t4);  // an m64n64 fragment's row
      *reinterpret_cast<float2*>(buf + row_of(e, me) * 64 + col) = make_float2(dq[e], dq[e + 1]);
    }
    fence_proxy_async_shared();
    mbarrier_arrive(&bars->dq_full[buffer]);
  }
};

}  // namespace dashgen
