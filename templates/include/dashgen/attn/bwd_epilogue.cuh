// dashgen/attn/bwd_epilogue.cuh: the backward's dK/dV epilogue, at the end of each KV segment
// in both MMA warpgroups (AttnBwdSm90, K): the segment's fp32 dK/dV accumulators (this
// warpgroup's 64 KV rows) leave for global memory, converted to the inputs' 16-bit type and
// stored (store_dkv), or under GQA added in fp32 into the KV head's tile in dkv_rank order
// (add_dkv_in_rank_order), which the convert kernel turns into 16-bit dK/dV. K supplies the
// kernel's constants and the MMA warpgroups' barrier.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/counter.cuh"

namespace dashgen {

template <class K>
struct BwdEpilogue {
  using T = typename K::T;
  using Task = sched::Task;
  using MmaThread = typename K::MmaThread;
  static constexpr int kHeadDim = K::kHeadDim, kBlockN = K::kBlockN;
  static constexpr bool kVarlen = K::kVarlen, kDeterministic = K::kDeterministic;
  // dK's and dV's columns in the tensors (attn/head_dim.cuh); the GQA sums keep kHeadDim.
  enum : int { kTensorHeadDim = tensor_head_dim<typename K::Config, K::kHeadDim>(0) };

  // Segment end. dK (scaled through dS) and dV of this warpgroup's 64 KV rows, straight to
  // global memory in the inputs' 16-bit type, 16 bytes a store (quad_transpose): stored as they
  // lie, 4 bytes at a time, they took ~5 us a segment at head_dim 128 (ncu, docs/design.md
  // `dkv-16-byte-stores`).
  __device__ static __forceinline__ void store_dkv(const BwdParams& p, const Task& t,
                                                   const float (&dk)[kHeadDim / 2],
                                                   const float (&dv)[kHeadDim / 2], int group,
                                                   const MmaThread& me) {
    const int hk = t.h / group;
    T* dk_out = static_cast<T*>(p.dk) +
                (static_cast<i64>(t.b) * p.seqlen_k * p.heads_kv + hk) * kTensorHeadDim;
    T* dv_out = static_cast<T*>(p.dv) +
                (static_cast<i64>(t.b) * p.seqlen_k * p.heads_kv + hk) * kTensorHeadDim;
    int seqlen_k = p.seqlen_k;
    if constexpr (kVarlen) {
      // A pack's rows: the sequence's from its first.
      const int k0 = p.cu_seqlens_k[t.b];
      seqlen_k = p.cu_seqlens_k[t.b + 1] - k0;
      dk_out = static_cast<T*>(p.dk) + (static_cast<i64>(k0) * p.heads_kv + hk) * kTensorHeadDim;
      dv_out = static_cast<T*>(p.dv) + (static_cast<i64>(k0) * p.heads_kv + hk) * kTensorHeadDim;
    }
    store_rows(dk_out, dk, t, seqlen_k, p.k_row_stride, me);
    store_rows(dv_out, dv, t, seqlen_k, p.k_row_stride, me);
  }

  // One of store_dkv's tiles: this warpgroup's 64 rows of `acc`, 16 bytes a store.
  __device__ static __forceinline__ void store_rows(T* out, const float (&acc)[kHeadDim / 2],
                                                    const Task& t, int seqlen_k, int row_stride,
                                                    const MmaThread& me) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * me.warp + me.g + 8 * half;
      const int key = t.n * kBlockN + 64 * me.wg + row;
#pragma unroll
      for (int j0 = 0; j0 < kHeadDim / 8; j0 += 4) {
        // Fragment elements 4j + 2 * half and + 1: row `row`, columns 8j + 2 * t4 and + 1.
        u32 w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int ii = 4 * (j0 + k) + 2 * half;
          w[k] = Element<T>::pack(acc[ii], acc[ii + 1]);
        }
        quad_transpose(w, me.t4);
        if (key < seqlen_k && (kTensorHeadDim == kHeadDim || 8 * (j0 + me.t4) < kTensorHeadDim)) {
          *reinterpret_cast<uint4*>(out + static_cast<i64>(key) * row_stride + 8 * (j0 + me.t4)) =
              make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }

  // Segment end under GQA: the query heads of a group add their dK/dV into one fp32 tile, in
  // dkv_rank order. One thread waits for this segment's turn; both MMA warpgroups add their 64
  // rows with two-float reductions (exclusive while the turn is ours, so the order of the sum is
  // the rank order; fire-and-forget, where returning atomics waited on each reply: 1.115x the
  // grouped-query backward, docs/design.md `gqa-red-v2`); after a fence the same thread passes
  // the turn on.
  __device__ static void add_dkv_in_rank_order(const BwdParams& p, const Task& t,
                                               const float (&dk)[kHeadDim / 2],
                                               const float (&dv)[kHeadDim / 2],
                                               const MmaThread& me) {
    const int hk = t.h / (p.heads_q / p.heads_kv);
    u32* counter = p.dkv_counters + (t.b * p.heads_kv + hk) * p.num_n_blocks + t.n;
    // A pack: the sequence's block of KV tiles (PackedRows).
    int kv_tile = 0;
    if constexpr (kVarlen) {
      const PackedRows r(p.cu_seqlens_k, t.b, kBlockN);
      kv_tile = p.heads_kv * r.tile0 + hk * r.tiles(kBlockN) + t.n;
      counter = p.dkv_counters + kv_tile;
    }
    if (kDeterministic && me.tid == 0) {
      // Unbounded: in every named schedule the heads of a group add in head order, which no
      // later launch precedes, and a schedule file's dK/dV order passed the verifier; a
      // watchdog here would cost the MMA warpgroups registers.
      wait_counter_equals(counter, static_cast<u32>(t.dkv_rank));
    }
    K::sync_mma_warpgroups();
    // Padded rows (keys past seqlen_k) carry zeros into the padded accumulator rows.
    i64 tile = (static_cast<i64>(t.b * p.heads_kv + hk) * p.num_n_blocks + t.n) * kBlockN;
    if constexpr (kVarlen) tile = static_cast<i64>(kv_tile) * kBlockN;
    float* dk_acc = p.dk_accum + (tile + 64 * me.wg) * kHeadDim;
    float* dv_acc = p.dv_accum + (tile + 64 * me.wg) * kHeadDim;
#pragma unroll
    for (int ii = 0; ii < kHeadDim / 2; ii += 2) {
      const int row = 16 * me.warp + me.g + 8 * ((ii / 2) % 2);
      const int col = 8 * (ii / 4) + 2 * me.t4;  // row-major: swizzled addresses spill
      red_add_v2_f32(dk_acc + row * kHeadDim + col, dk[ii], dk[ii + 1]);
      red_add_v2_f32(dv_acc + row * kHeadDim + col, dv[ii], dv[ii + 1]);
    }
    __threadfence();
    K::sync_mma_warpgroups();
    if (kDeterministic && me.tid == 0) atomic_fetch_add_relaxed_gpu(counter, 1u);
  }
};

}  // namespace dashgen
