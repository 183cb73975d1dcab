// dashgen/attn/prepost.cuh: the small kernels around the backward. Preprocess: D = rowsum(dO * O)
// (stored times the softmax scale, PrepParams::d_scale)
// in fp32, a zeroed workspace (counters, GQA dK/dV sums) and, where every dQ writer adds, a
// zeroed dQ accumulator. Convert: an fp32 accumulator back to the 16-bit layout of the inputs
// (dQ always, dK/dV under GQA).
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

// Both kernels move 16 bytes per thread and access (kLanes threads per row, 8 elements each):
// with 2- and 4-byte accesses they reached 2.3-3.3 TB/s on the H200, and around a short
// backward they are a fifth of its time. blockIdx = (block of kRowsPerBlock rows, head, batch);
// for a pack, (block of kRowsPerBlock rows of the pack's tiles, head, 0): PackedTile.
template <int kHeadDim>
struct RowLanes {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 16;
  // Threads per row: a power of two, so that a row's lanes sit inside one warp. At 192 (24
  // lanes of 8 columns) a row takes a whole warp and its last 8 lanes idle (kIdleLanes).
  static constexpr int kLanes = kHeadDim / 8 <= 16 ? kHeadDim / 8 : 32;
  static constexpr int kRowsPerPass = kThreads / kLanes;  // rows the block covers at once
  enum : int { kIdleLanes = kLanes * 8 != kHeadDim };     // an enumerator: no module global
  static_assert(kHeadDim % 64 == 0 && kLanes * 8 >= kHeadDim && 32 % kLanes == 0 &&
                    kRowsPerBlock % kRowsPerPass == 0,
                "head_dim 64, 128, 192 or 256: a row's lanes sit inside one warp");
};

// Cfg: the backward's configuration (AttnBwdSm90). It also lays lse (as log2) and D out per
// query tile of kStatsBlockM rows for the backward's producer (BwdParams::stats).
template <class Cfg>
struct AttnPreprocess : RowLanes<Cfg::kHeadDim> {
  using L = RowLanes<Cfg::kHeadDim>;
  using T = typename Cfg::Element;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  // O's and dO's columns (attn/head_dim.cuh: the tensors' width, or V's, 128 under MLA's 192):
  // lanes past them add nothing to D.
  enum : int { kTensorHeadDim = tensor_head_dim<Cfg, head_dim_v<Cfg>(0)>(0) };
  static constexpr int kStatsBlockM = Cfg::kBlockM;
  static constexpr int kBlockM = Cfg::kBlockM;  // the backward's query tiles

  __device__ static void run(const PrepParams& p) {
    // The workspace, grid-stride over all blocks: it has no row structure.
    const i64 blocks = static_cast<i64>(gridDim.x) * gridDim.y * gridDim.z;
    const i64 block = (static_cast<i64>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    for (i64 i = block * L::kThreads + threadIdx.x; i < p.zero_vec4s; i += blocks * L::kThreads) {
      p.zero[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    if constexpr (Cfg::kVarlen) {
      // A pack: the CTA's sequence as a batch of one (PackedRows).
      const PackedTile at(p.tile_seq, p.cu_seqlens, kBlockM, L::kRowsPerBlock, blockIdx.x);
      if (at.b < 0) return;
      const PackedRows r(p.cu_seqlens, at.b, kBlockM);
      PrepParams seq = p;
      seq.seqlen = r.seqlen;
      seq.padded_rows = r.tiles(kBlockM) * kBlockM;
      seq.o = static_cast<const T*>(p.o) + static_cast<i64>(r.row0) * p.row_stride;
      seq.dout = static_cast<const T*>(p.dout) + static_cast<i64>(r.row0) * p.row_stride;
      seq.dpsum = p.dpsum + static_cast<i64>(p.heads) * r.row0;
      seq.lse = p.lse + static_cast<i64>(p.heads) * r.row0;
      seq.dq_accum = p.dq_accum + static_cast<i64>(p.heads) * r.tile0 * kBlockM * kHeadDim;
      if (p.stats != nullptr) seq.stats = p.stats + static_cast<i64>(p.heads) * r.tile0 * 2 * kBlockM;
      rows(seq, 0, at.row_block);
    } else {
      rows(p, blockIdx.z, blockIdx.x);
    }
  }

  // D (and the statistics, the zeroed dQ rows) of head blockIdx.y of sequence b, its rows from
  // row_block * kRowsPerBlock.
  __device__ static __forceinline__ void rows(const PrepParams& p, int b, int row_block) {
    const int lane = threadIdx.x % L::kLanes, sub = threadIdx.x / L::kLanes;
    const int h = blockIdx.y;
    const T* o = static_cast<const T*>(p.o);
    const T* dout = static_cast<const T*>(p.dout);
#pragma unroll
    for (int pass = 0; pass < L::kRowsPerBlock / L::kRowsPerPass; ++pass) {
      const int row = row_block * L::kRowsPerBlock + pass * L::kRowsPerPass + sub;
      if (p.zero_dq && row < p.padded_rows && (!L::kIdleLanes || lane * 8 < kHeadDim)) {
        float4* acc = reinterpret_cast<float4*>(
            p.dq_accum + ((static_cast<i64>(b) * p.heads + h) * p.padded_rows + row) * kHeadDim) + lane * 2;
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float sum = 0.f;
      if (row < p.seqlen &&
          ((kTensorHeadDim == kHeadDim && !L::kIdleLanes) || lane * 8 < kTensorHeadDim)) {
        const i64 base = (static_cast<i64>(b) * p.seqlen + row) * p.row_stride + static_cast<i64>(h) * kTensorHeadDim + lane * 8;
        const uint4 ov = *reinterpret_cast<const uint4*>(o + base);
        const uint4 dv = *reinterpret_cast<const uint4*>(dout + base);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += Element<T>::to_float(oe[e]) * Element<T>::to_float(de[e]);
      }
      // Every thread of the warp takes part in the row sums, past-the-end rows with zeros.
#pragma unroll
      for (int offset = L::kLanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      sum *= p.d_scale;  // D * softmax_scale: what the backward's dS subtracts
      if (lane == 0 && row < p.seqlen) p.dpsum[(static_cast<i64>(b) * p.heads + h) * p.seqlen + row] = sum;
      if (lane == 0 && row < p.padded_rows) {
        float* chunk = p.stats + ((static_cast<i64>(b) * p.heads + h) * (p.padded_rows / kStatsBlockM) +
                                  row / kStatsBlockM) * (2 * kStatsBlockM);
        chunk[row % kStatsBlockM] = lse_log2(
            row < p.seqlen ? p.lse[(static_cast<i64>(b) * p.heads + h) * p.seqlen + row] : -DASHGEN_INF);
        chunk[kStatsBlockM + row % kStatsBlockM] = row < p.seqlen ? sum : 0.f;
      }
    }
  }
};

template <class Cfg>
struct AttnConvert : RowLanes<Cfg::kHeadDim> {
  using L = RowLanes<Cfg::kHeadDim>;
  using T = typename Cfg::Element;
  static constexpr int kHeadDim = Cfg::kHeadDim;
  // The 16-bit tensors' columns (attn/head_dim.cuh); the fp32 sums keep kHeadDim.
  enum : int { kTensorHeadDim = tensor_head_dim<Cfg, Cfg::kHeadDim>(0) };

  __device__ static void run(const ConvertParams& p) {
    if constexpr (Cfg::kVarlen) {
      // A pack: the CTA's sequence as a batch of one (PackedRows).
      const PackedTile at(p.tile_seq, p.cu_seqlens, p.block_m, L::kRowsPerBlock, blockIdx.x);
      if (at.b < 0) return;
      const PackedRows r(p.cu_seqlens, at.b, p.block_m);
      ConvertParams seq = p;
      seq.seqlen = r.seqlen;
      seq.padded_rows = r.tiles(p.block_m) * p.block_m;
      seq.src = p.src + static_cast<i64>(p.heads) * r.tile0 * p.block_m * kHeadDim;
      seq.dst = static_cast<T*>(p.dst) + static_cast<i64>(r.row0) * p.row_stride;
      if (p.counters != nullptr) seq.counters = p.counters + static_cast<i64>(p.heads) * r.tile0;
      rows(seq, 0, at.row_block);
    } else {
      rows(p, blockIdx.z, blockIdx.x);
    }
  }

  // Head blockIdx.y of sequence b, its rows from row_block * kRowsPerBlock.
  __device__ static __forceinline__ void rows(const ConvertParams& p, int b, int row_block) {
    const int lane = threadIdx.x % L::kLanes, sub = threadIdx.x / L::kLanes;
    const int h = blockIdx.y;
    T* dst = static_cast<T*>(p.dst);
    const i64 tiles = p.counters ? p.padded_rows / p.block_m : 0;
#pragma unroll
    for (int pass = 0; pass < L::kRowsPerBlock / L::kRowsPerPass; ++pass) {
      const int row = row_block * L::kRowsPerBlock + pass * L::kRowsPerPass + sub;
      if (row >= p.seqlen) continue;
      const int c = lane * 8;
      if ((kTensorHeadDim != kHeadDim || L::kIdleLanes) && c >= kTensorHeadDim) continue;
      // accum_col moves whole 8-float chunks, so the thread's 8 columns stay adjacent.
      const int sc = p.swizzled ? accum_col(row, c) : c;
      const bool empty = p.counters && p.counters[(static_cast<i64>(b) * p.heads + h) * tiles + row / p.block_m] == 0u;
      uint4 out = make_uint4(0u, 0u, 0u, 0u);
      if (!empty) {
        i64 at = ((static_cast<i64>(b) * p.heads + h) * p.padded_rows + row) * kHeadDim + sc;
        if constexpr (dkv_swapped<Cfg>(0) != 0) {
          if (p.swizzled) {
            // The swapped backward's dQ sum: column-block-major per tile ([tile][c / 64][row in
            // tile][64], accum_col within the block's 64-float rows).
            const int r = row % p.block_m;
            at = ((static_cast<i64>(b) * p.heads + h) * p.padded_rows + row - r) * kHeadDim +
                 (c / 64) * p.block_m * 64 + r * 64 + accum_col(r, c % 64);
          }
        }
        const float4* src = reinterpret_cast<const float4*>(p.src + at);
        const float4 lo = src[0], hi = src[1];
        out = make_uint4(Element<T>::pack(lo.x, lo.y), Element<T>::pack(lo.z, lo.w),
                         Element<T>::pack(hi.x, hi.y), Element<T>::pack(hi.z, hi.w));
      }
      *reinterpret_cast<uint4*>(dst + (static_cast<i64>(b) * p.seqlen + row) * p.row_stride +
                                static_cast<i64>(h) * kTensorHeadDim + c) = out;
    }
  }
};

}  // namespace dashgen
