// dashgen/attn/fwd_epilogue.cuh: the forward's epilogue, at the end of each query tile in both
// MMA warpgroups (AttnFwdSm90, K): O of this warpgroup's 64 query rows, normalized by the row
// sums, in the inputs' 16-bit type, and the logsumexp of each row. At head_dim 128 (kStagedO)
// O leaves through the staging tile as whole 128-byte lines (store_o_lse_staged); at 64 and
// past 128 straight from the accumulator, 16 bytes a store (store_o_lse_direct).
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/attn/fragment.cuh"
#include "dashgen/attn/head_dim.cuh"
#include "dashgen/attn/params.cuh"
#include "dashgen/attn/softmax.cuh"
#include "dashgen/ptx/stmatrix.cuh"
#include "dashgen/types.cuh"

namespace dashgen {

template <class K>
struct FwdEpilogue {
  using T = typename K::T;
  // Enumerators, not static constexpr members, for the reason FwdProducer gives.
  enum : int {
    kHeadDimV = K::kHeadDimV,
    kChunks = K::kChunks,
    // O's columns in the tensor (attn/head_dim.cuh): no store from them on.
    kTensorHeadDimV = tensor_head_dim<typename K::Config, K::kHeadDimV>(0),
  };

  // O (normalized by the row sums) and the logsumexp of this thread's two query rows; o_stage:
  // the warpgroup's 64-row staging tile (kStagedO).
  __device__ static void store_o_lse(const FwdParams& p, const float (&o)[kHeadDimV / 2],
                                     const float (&row_max)[2], float (&row_sum)[2], int h,
                                     int b, int row0, char* o_stage, int warp, int lane) {
    if constexpr (K::kStagedO) {
      store_o_lse_staged(p, o, row_max, row_sum, h, b, row0, o_stage, warp, lane);
    } else {
      store_o_lse_direct(p, o, row_max, row_sum, h, b, row0, lane & 3);
    }
  }

  // A row's sum over the quad of threads that hold its columns.
  __device__ static float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
  }

  // What O's row is scaled by: 0 for a row that sees no key (its O is 0).
  __device__ static float inverse(float row_sum) { return row_sum > 0.f ? 1.f / row_sum : 0.f; }

  // The row's logsumexp, in natural-log units of the scaled scores; -inf for a row that sees no
  // key. row_max is in log2 units (the softmax's exp2).
  __device__ static void store_lse(const FwdParams& p, int h, int b, int row, float row_max,
                                   float row_sum) {
    p.lse[(static_cast<i64>(b) * p.heads_q + h) * p.seqlen_q + row] =
        row_sum > 0.f ? (row_max + log2f(row_sum)) / kLog2e : -DASHGEN_INF;
  }

  // O leaves through shared memory (kStagedO). Each warp writes its 16 rows, normalized, with
  // stmatrix into its slice of the warpgroup's staging tile, reads them back as 16-byte row
  // segments and stores whole 128-byte lines, 2 rows a warp instruction, where storing the
  // accumulator as it lies writes one 4-byte word a lane into 8 rows, half of each 32-byte
  // sector. The 16-byte chunks are XOR-swizzled by row, so neither stmatrix's 8 rows nor
  // the read-back's 8 chunks fall into the same banks. Only the warp reads what it wrote, so
  // __syncwarp orders it; the slice is the warp's own from one query tile to the next.
  __device__ static int o_stage_offset(int row, int chunk) {
    return row * kHeadDimV * 2 + (chunk ^ (row % 8)) * 16;
  }

  __device__ static void store_o_lse_staged(const FwdParams& p, const float (&o)[kHeadDimV / 2],
                                            const float (&row_max)[2], float (&row_sum)[2], int h,
                                            int b, int row0, char* o_stage, int warp, int lane) {
    const int t4 = lane & 3;
    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_sum[half] = quad_sum(row_sum[half]);
      const int row = row0 + 8 * half;
      inv[half] = inverse(row_sum[half]);
      if (row < p.seqlen_q && t4 == 0) store_lse(p, h, b, row, row_max[half], row_sum[half]);
    }
    // Lanes 8j..8j+7 address the rows of matrix j: rows 8 (j % 2) + 0..7 of the warp's 16, the
    // chunk c + j / 2; matrix j holds the pairs o[4 (c + j / 2) + 2 (j % 2)], + 1.
    const u32 stage = shared_address(o_stage);
    const int sel = lane / 8, srow = 16 * warp + 8 * (sel % 2) + lane % 8;
    __syncwarp();  // the warp's read-back of its previous query tile is done
#pragma unroll
    for (int c = 0; c < kChunks; c += 2) {
      u32 frag[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = 4 * (c + q / 2) + 2 * (q % 2);
        frag[q] = Element<T>::pack(o[i] * inv[q % 2], o[i + 1] * inv[q % 2]);
      }
      stmatrix_x4(stage + o_stage_offset(srow, c + sel / 2), frag);
    }
    __syncwarp();
    T* out = static_cast<T*>(p.o) +
             (static_cast<i64>(b) * p.seqlen_q * p.heads_q + h) * kTensorHeadDimV;
    const int first_row = row0 - lane / 4;  // the query row of the warp's first
#pragma unroll
    for (int it = 0; it < 16 * kChunks / 32; ++it) {
      const int r = (32 * it + lane) / kChunks, chunk = (32 * it + lane) % kChunks;
      const uint4 v =
          *reinterpret_cast<const uint4*>(o_stage + o_stage_offset(16 * warp + r, chunk));
      if (first_row + r < p.seqlen_q &&
          (kTensorHeadDimV == kHeadDimV || 8 * chunk < kTensorHeadDimV)) {
        *reinterpret_cast<uint4*>(out + static_cast<i64>(first_row + r) * p.o_row_stride +
                                  8 * chunk) = v;
      }
    }
  }

  // store_o_lse at head_dim 64 and past 128: O from the accumulator, 16 bytes a store
  // (quad_transpose). The loop is the backward's store_rows with its own scaling and row test,
  // written out: one shared helper made ptxas schedule the kernels differently from the ones
  // measured.
  __device__ static void store_o_lse_direct(const FwdParams& p, const float (&o)[kHeadDimV / 2],
                                            const float (&row_max)[2], float (&row_sum)[2], int h,
                                            int b, int row0, int t4) {
    T* out = static_cast<T*>(p.o) +
             (static_cast<i64>(b) * p.seqlen_q * p.heads_q + h) * kTensorHeadDimV;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      row_sum[half] = quad_sum(row_sum[half]);
      const int row = row0 + 8 * half;
      const float inv = inverse(row_sum[half]);
#pragma unroll
      for (int j0 = 0; j0 < kHeadDimV / 8; j0 += 4) {
        // Fragment elements 4j + 2 * half and + 1: columns 8j + 2 * t4 and + 1 of `row`.
        u32 w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = 4 * (j0 + k) + 2 * half;
          w[k] = Element<T>::pack(o[i] * inv, o[i + 1] * inv);
        }
        quad_transpose(w, t4);
        if (row < p.seqlen_q && (kTensorHeadDimV == kHeadDimV || 8 * (j0 + t4) < kTensorHeadDimV)) {
          *reinterpret_cast<uint4*>(out + static_cast<i64>(row) * p.o_row_stride +
                                    8 * (j0 + t4)) = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      if (row < p.seqlen_q) {
        if (t4 == 0) store_lse(p, h, b, row, row_max[half], row_sum[half]);
      }
    }
  }
};

}  // namespace dashgen
