// dashgen/attn/bwd_epilogue_swapped.cuh: the dK/dV epilogue of the swapped mainloop
// (attn/bwd_mainloop_swapped.cuh), at each KV segment's end in both MMA warpgroups. Its
// accumulators are dK^T and dV^T: per 64-column block j of the head_dim an m64n32 fragment whose
// rows are head_dim columns and whose columns are this warpgroup's 32 keys, so the two values a
// thread holds side by side are adjacent keys, not adjacent columns. Lanes g and g ^ 1 (4 lanes
// apart) hold the neighbouring columns of the same keys: one shuffle each gives a lane two
// adjacent columns of one key, stored 4 bytes at a time (store_dkv) or added as a two-float
// reduction under GQA in dkv_rank order (add_dkv_in_rank_order, as BwdEpilogue's).
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/counter.cuh"

namespace dashgen {

template <class K>
struct BwdMainloopSwapped;  // attn/bwd_mainloop_swapped.cuh: the ownership read below

template <class K>
struct BwdEpilogueSwapped {
  using T = typename K::T;
  using Task = sched::Task;
  using MmaThread = typename K::MmaThread;
  static constexpr int kHeadDim = K::kHeadDim, kBlockN = K::kBlockN;
  static constexpr int kColBlocks = K::kColBlocks, kKeys = kBlockN / 2;
  // The mainloop's ownership (BwdMainloopSwapped): kOwnBlocks blocks over kDkvN keys each.
  using Mainloop = BwdMainloopSwapped<K>;
  static constexpr bool kSplit = Mainloop::kSplit;
  static constexpr int kOwnBlocks = Mainloop::kOwnBlocks, kAcc = Mainloop::kDkvAcc;
  // dV's columns and blocks: V's width (128 under 192, MLA; no GQA there: AttnBwdSm90).
  enum : int { kHeadDimV = K::kHeadDimV, kOwnBlocksV = Mainloop::kOwnBlocksV };
  static constexpr bool kVarlen = K::kVarlen, kDeterministic = K::kDeterministic;

  // Element e of block j's fragment goes to (key, column) = (keys0 + 8 (e / 4) + 2 t4 + e % 2,
  // 64 j + 16 warp + g + 8 ((e / 2) % 2)). The pair exchange: an even-g lane keeps key e (even e)
  // and takes its neighbour's column + 1 of it; an odd-g lane keeps key e + 1 and takes its
  // neighbour's column - 1. Calls f(key_in_warpgroup, column, value_lo, value_hi) per pair.
  template <int kBlocks, class F>
  __device__ static __forceinline__ void pairs(const float (&acc)[kBlocks][kAcc],
                                               const MmaThread& me, F&& f) {
    const bool odd = me.g & 1;
#pragma unroll
    for (int jj = 0; jj < kBlocks; ++jj) {
      const int j = kSplit ? kBlocks * me.wg + jj : jj;  // the head_dim block
#pragma unroll
      for (int e = 0; e < kAcc; e += 2) {
        // Even lanes send key e + 1, odd lanes key e: what the neighbour keeps.
        const float mine = odd ? acc[jj][e + 1] : acc[jj][e];
        const float send = odd ? acc[jj][e] : acc[jj][e + 1];
        const float got = __shfl_xor_sync(0xffffffffu, send, 4);
        const int key = 8 * (e / 4) + 2 * me.t4 + (odd ? 1 : 0);
        const int col = 64 * j + 16 * me.warp + (me.g & ~1) + 8 * ((e / 2) % 2);
        f(key, col, odd ? got : mine, odd ? mine : got);
      }
    }
  }

  __device__ static __forceinline__ void store_dkv(const BwdParams& p, const Task& t,
                                                   const float (&dkt)[kOwnBlocks][kAcc],
                                                   const float (&dvt)[kOwnBlocksV][kAcc],
                                                   int group, const MmaThread& me) {
    const int hk = t.h / group;
    i64 row0 = static_cast<i64>(t.b) * p.seqlen_k;
    int seqlen_k = p.seqlen_k;
    if constexpr (kVarlen) {
      row0 = p.cu_seqlens_k[t.b];  // a pack's rows: the sequence's from its first
      seqlen_k = p.cu_seqlens_k[t.b + 1] - p.cu_seqlens_k[t.b];
    }
    T* dk_out = static_cast<T*>(p.dk) + (row0 * p.heads_kv + hk) * kHeadDim;
    T* dv_out = static_cast<T*>(p.dv) + (row0 * p.heads_kv + hk) * kHeadDimV;
    const int keys0 = t.n * kBlockN + (kSplit ? 0 : kKeys * me.wg);
    const i64 stride = p.k_row_stride;
    // dv is allocated contiguous (the runtime's): its rows are heads_kv V widths apart.
    const i64 v_stride =
        kHeadDimV == kHeadDim ? stride : static_cast<i64>(p.heads_kv) * kHeadDimV;
    pairs(dkt, me, [&](int key, int col, float lo, float hi) {
      if (keys0 + key < seqlen_k) {
        *reinterpret_cast<u32*>(dk_out + (keys0 + key) * stride + col) = Element<T>::pack(lo, hi);
      }
    });
    pairs(dvt, me, [&](int key, int col, float lo, float hi) {
      if (keys0 + key < seqlen_k) {
        *reinterpret_cast<u32*>(dv_out + (keys0 + key) * v_stride + col) = Element<T>::pack(lo, hi);
      }
    });
  }

  // Under GQA: the KV head's fp32 tile (rows of kHeadDim, row-major, as the convert kernel reads
  // it), this segment's turn taken and passed as in BwdEpilogue::add_dkv_in_rank_order.
  __device__ static void add_dkv_in_rank_order(const BwdParams& p, const Task& t,
                                               const float (&dkt)[kOwnBlocks][kAcc],
                                               const float (&dvt)[kOwnBlocksV][kAcc],
                                               const MmaThread& me) {
    const int hk = t.h / (p.heads_q / p.heads_kv);
    u32* counter = p.dkv_counters + (t.b * p.heads_kv + hk) * p.num_n_blocks + t.n;
    i64 tile = (static_cast<i64>(t.b * p.heads_kv + hk) * p.num_n_blocks + t.n) * kBlockN;
    if constexpr (kVarlen) {
      const PackedRows r(p.cu_seqlens_k, t.b, kBlockN);
      const int kv_tile = p.heads_kv * r.tile0 + hk * r.tiles(kBlockN) + t.n;
      counter = p.dkv_counters + kv_tile;
      tile = static_cast<i64>(kv_tile) * kBlockN;
    }
    if (kDeterministic && me.tid == 0) wait_counter_equals(counter, static_cast<u32>(t.dkv_rank));
    K::sync_mma_warpgroups();
    // One base address a lane and each add at a constant offset from it (the pair's key and
    // column less the lane's own, see pairs): with an address of its own for every add ptxas
    // held them all across the adds and spilled (NVRTC 13, 192 GQA: 236-240 bytes).
    const int lane_key = 2 * me.t4 + (me.g & 1), lane_col = 16 * me.warp + (me.g & ~1);
    const int lane_at = lane_key * kHeadDim + lane_col;
    float* dk_acc = p.dk_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim + lane_at;
    float* dv_acc = p.dv_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim + lane_at;
    pairs(dkt, me, [&](int key, int col, float lo, float hi) {
      red_add_v2_f32(dk_acc + ((key - lane_key) * kHeadDim + (col - lane_col)), lo, hi);
    });
    pairs(dvt, me, [&](int key, int col, float lo, float hi) {
      red_add_v2_f32(dv_acc + ((key - lane_key) * kHeadDim + (col - lane_col)), lo, hi);
    });
    __threadfence();
    K::sync_mma_warpgroups();
    if (kDeterministic && me.tid == 0) atomic_fetch_add_relaxed_gpu(counter, 1u);
  }
};

}  // namespace dashgen
