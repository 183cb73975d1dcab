// dashgen/attn/bwd_dq_converter.cuh: the fused dQ converter of the deterministic backward
// (kConvertDq), two warps of the producer warpgroup (AttnBwdSm90, K).
// The convert kernel's per-row work (AttnConvert) for this worker's share of the tiles: fp32
// sums in the accum_col layout -> 16-bit dQ rows, the same conversion, so the same bits. The
// dQ tiles that receive any contribution are dealt round-robin to the workers in
// (batch, head, m_block) order, the order their heads launch in (sched::ConvertDeal); not to
// the worker that adds last: a schedule may give one worker the last add of every tile.
// Chunk j of the worker's share (tile j / kConvChunks) goes through buffer j % 2. Warp 3's
// lane 0 issues each copy once the tile's sum is final and warp 2 has emptied the buffer, and
// leaves where the chunk's rows go in the buffer's ConvSlot; warp 2 converts. Two roles in
// two warps keep each within the producer warpgroup's 24 registers, and the converting warp
// decodes nothing (a tile's batch, head and m_block take two integer divisions): its few
// instructions per byte take few issue slots from its sub-partition's MMA warps.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/ptx/bulk.cuh"
#include "dashgen/ptx/counter.cuh"
#include "dashgen/ptx/mbarrier.cuh"
#include "dashgen/ptx/timer.cuh"
#include "dashgen/sched/tiling.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

template <class K>
struct BwdDqConverter {
  using T = typename K::T;
  using Tiling = typename K::Tiling;
  using Scheduler = typename K::Scheduler;
  using Deal = sched::ConvertDeal<Tiling>;
  static constexpr int kBlockM = K::kBlockM;
  static constexpr int kHeadDim = K::kHeadDim;
  // dQ's columns in the tensor (attn/head_dim.cuh); the fp32 sums keep kHeadDim.
  enum : int { kTensorHeadDim = tensor_head_dim<typename K::Config, K::kHeadDim>(0) };
  static constexpr int kOffConv = K::kOffConv;
  static constexpr int kConvChunks = K::kConvChunks;
  static constexpr int kConvChunkBytes = K::kConvChunkBytes;
  static constexpr int kConvChunkRows = K::kConvChunkRows;
  static constexpr u32 kConvPollNs = K::kConvPollNs;
  static constexpr int kChunkFloats = kConvChunkBytes / 4;

  struct ConvSlot {
    i64 out;   // dQ element offset of the chunk's first row
    int rows;  // rows from it inside seqlen_q (past them: padding)
  };

  // The converter's shared memory (at kOffConv): its full[2] and empty[2] barriers, the two
  // ConvSlots, then the two chunk buffers.
  struct ConvBuffers {
    u64* full;
    u64* empty;
    ConvSlot* slots;
    float* buf;
  };
  // The kernel's tiling: a sliding window's reads its bounds (its receiving Q tiles are still
  // a run, first_receiving() .. num_m - 1, and count(m) its KV tiles).
  __device__ static __forceinline__ Tiling tiling(const BwdParams& p) {
    if constexpr (K::kWindow != 0) {
      return Tiling(p.seqlen_q, p.seqlen_k, p.window_left, p.window_right);
    } else {
      return Tiling(p.seqlen_q, p.seqlen_k);
    }
  }

  __device__ static void run(const BwdParams& p, char* smem, int tid) {
    u64* full = reinterpret_cast<u64*>(smem + kOffConv);
    const ConvBuffers c{full, full + 2, reinterpret_cast<ConvSlot*>(smem + kOffConv + 32),
                        reinterpret_cast<float*>(smem + kOffConv + 128)};
    const int chunks = Deal::share(tiling(p), p.batch * p.heads_q, blockIdx.x, gridDim.x) *
                       kConvChunks;
    if (tid == 32) issue_conv_copies(p, c, chunks);
    if (tid >= 32) return;
    convert_chunks(p, c, chunks, tid);
  }

  // Warp 3's lane 0: each chunk of the worker's share into buffer j % 2, once its tile's sum is
  // final and the buffer is empty.
  __device__ static __forceinline__ void issue_conv_copies(const BwdParams& p, const ConvBuffers& c,
                                                           int chunks) {
    const Tiling t = tiling(p);
#pragma unroll 1
    for (int j = 0; j < chunks; ++j) {
      if (j >= 2) mbarrier_wait_parity(&c.empty[j % 2], (j / 2 - 1) & 1);
      const int k = j / kConvChunks;  // the worker's k-th tile (sched::ConvertDeal)
      const int m = Deal::m_of(t, blockIdx.x, gridDim.x, k);
      const int bh = Deal::seq_of(t, blockIdx.x, gridDim.x, k);
      const int tile = bh * p.num_m_blocks + m;
      const int row0 = m * kBlockM + (j % kConvChunks) * kConvChunkRows;
      if (j % kConvChunks == 0) {
        // Final once every contribution has landed: the writers release the counter after
        // their add is visible (fence.proxy.async, then a gpu-scope fence). Asleep between
        // polls: a polling warp would take issue slots from its sub-partition's MMA warps.
        const u32 total = t.count(m);
        u32 since = global_ns();
        while (ld_acquire_gpu(p.dq_counters + tile) != total) {
          if (global_ns() - since > p.watchdog_ms * 1000000u) {
            Scheduler::report_stall(p, Scheduler::kStallConvert, p.dq_counters,
                                    p.dq_counters + tile, total);
          }
          __nanosleep(kConvPollNs);
        }
        fence_proxy_async_global();  // the copy below reads through the async proxy
      }
      // Published by the arrive below (release), read after the wait on it (acquire).
      c.slots[j % 2].out = (static_cast<i64>(bh / p.heads_q) * p.seqlen_q + row0) *
                           p.q_row_stride + static_cast<i64>(bh % p.heads_q) * kTensorHeadDim;
      c.slots[j % 2].rows = p.seqlen_q - row0;
      mbarrier_arrive_expect_tx(&c.full[j % 2], kConvChunkBytes);
      bulk_load(c.buf + (j % 2) * kChunkFloats,
                p.dq_accum + static_cast<i64>(tile) * kBlockM * kHeadDim +
                    (j % kConvChunks) * kChunkFloats,
                kConvChunkBytes, &c.full[j % 2]);
    }
  }

  // Warp 2: lane `tid` converts column quad tid % kQuads of every kPassRows-th row from
  // tid / kQuads of each chunk, then frees its buffer. Chunks start at multiples of 8 rows, so a
  // chunk row's swizzle (accum_col) is its tile row's.
  __device__ static __forceinline__ void convert_chunks(const BwdParams& p, const ConvBuffers& c,
                                                        int chunks, int tid) {
    static_assert(kConvChunkRows % 8 == 0, "a chunk row keeps its tile row's swizzle");
    constexpr int kQuads = kHeadDim / 4;  // 4 columns per 8-byte store
    constexpr int kPassRows = 32 / kQuads;
#pragma unroll 1
    for (int j = 0; j < chunks; ++j) {
      mbarrier_wait_parity(&c.full[j % 2], (j / 2) & 1);
      const int rows = c.slots[j % 2].rows;
      T* out = static_cast<T*>(p.dq) + c.slots[j % 2].out + (tid % kQuads) * 4;
      const float* src = c.buf + (j % 2) * kChunkFloats;
      // (Two bounds, not their min: ptxas then spills at head_dim 64, causal.)
#pragma unroll 1
      for (int r = tid / kQuads; r < kConvChunkRows && r < rows; r += kPassRows) {
        if (kTensorHeadDim != kHeadDim && (tid % kQuads) * 4 >= kTensorHeadDim) break;
        const float4 v = *reinterpret_cast<const float4*>(
            src + r * kHeadDim + accum_col(r, (tid % kQuads) * 4));  // a quad stays whole
        *reinterpret_cast<uint2*>(out + static_cast<i64>(r) * p.q_row_stride) =
            make_uint2(Element<T>::pack(v.x, v.y), Element<T>::pack(v.z, v.w));
      }
      mbarrier_arrive(&c.empty[j % 2]);  // this lane has read buffer j % 2 and its slot
    }
  }
};

}  // namespace dashgen
