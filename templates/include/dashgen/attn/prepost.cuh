// dashgen/attn/prepost.cuh: the small kernels around the backward. Preprocess: D = rowsum(dO * O)
// in fp32, a zeroed dQ accumulator and a zeroed workspace (counters, GQA dK/dV sums). Convert: an fp32 accumulator back to the 16-bit layout of
// the inputs (dQ always, dK/dV under GQA).
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/swizzle.cuh"

namespace dashgen {

// One warp per row of one head: blockIdx = (row block, head, batch), 4 warps, 4 rows each.
template <class T, int kHeadDim>
struct AttnPreprocess {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 16;

  __device__ static void run(const PrepParams& p) {
    // The workspace, grid-stride over all blocks: it has no row structure.
    const i64 blocks = static_cast<i64>(gridDim.x) * gridDim.y * gridDim.z;
    const i64 block = (static_cast<i64>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    for (i64 i = block * kThreads + threadIdx.x; i < p.zero_vec4s; i += blocks * kThreads) {
      p.zero[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    const T* o = static_cast<const T*>(p.o);
    const T* dout = static_cast<const T*>(p.dout);
    for (int r = warp; r < kRowsPerBlock; r += kThreads / 32) {
      const int row = blockIdx.x * kRowsPerBlock + r;
      if (row >= p.padded_rows) break;
      float* acc_row = p.dq_accum + ((static_cast<i64>(b) * p.heads + h) * p.padded_rows + row) * kHeadDim;
      if (p.zero_dq) {
        for (int c = lane; c < kHeadDim; c += 32) acc_row[c] = 0.f;
      }
      if (row >= p.seqlen) continue;
      const i64 base = (static_cast<i64>(b) * p.seqlen + row) * p.row_stride + static_cast<i64>(h) * kHeadDim;
      float sum = 0.f;
      for (int c = lane; c < kHeadDim; c += 32) {
        sum += Element<T>::to_float(o[base + c]) * Element<T>::to_float(dout[base + c]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) p.dpsum[(static_cast<i64>(b) * p.heads + h) * p.seqlen + row] = sum;
    }
  }
};

template <class T, int kHeadDim>
struct AttnConvert {
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = 16;

  __device__ static void run(const ConvertParams& p) {
    const int h = blockIdx.y, b = blockIdx.z;
    T* dst = static_cast<T*>(p.dst);
    constexpr int kPairs = kHeadDim / 2;
    for (int i = threadIdx.x; i < kRowsPerBlock * kPairs; i += kThreads) {
      const int row = blockIdx.x * kRowsPerBlock + i / kPairs, c = (i % kPairs) * 2;
      if (row >= p.seqlen) continue;
      const int sc = p.swizzled ? accum_col(row, c) : c;
      const float* src = p.src + ((static_cast<i64>(b) * p.heads + h) * p.padded_rows + row) * kHeadDim + sc;
      const i64 tiles = p.counters ? p.padded_rows / p.block_m : 0;
      const bool empty = p.counters && p.counters[(static_cast<i64>(b) * p.heads + h) * tiles + row / p.block_m] == 0u;
      *reinterpret_cast<u32*>(dst + (static_cast<i64>(b) * p.seqlen + row) * p.row_stride +
                              static_cast<i64>(h) * kHeadDim + c) =
          empty ? Element<T>::pack(0.f, 0.f) : Element<T>::pack(src[0], src[1]);
    }
  }
};

}  // namespace dashgen
