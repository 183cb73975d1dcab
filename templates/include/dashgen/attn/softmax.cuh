// dashgen/attn/softmax.cuh: the online-softmax step both forward kernels share. A thread holds
// two rows (accumulator rows g and g + 8 of its warp), each spread over the 4 lanes of a quad.
#pragma once
#include "dashgen/attn/element.cuh"

namespace dashgen {

// A row keeps the max its exponents are taken from until a tile's max passes it by more than
// this (log2 units). Until then every exp2(score - max) stays below 2^kRescaleSlack, in fp32 and
// as a 16-bit P, and the correction is exactly 1: the sums and O need no rescale. The
// logsumexp adds the same max back, so it is the same function; only the rounding moves.
constexpr float kRescaleSlack = 8.f;

// Folds this tile's row maxima (scores already in log2 units) into the running max and sum;
// returns through `correction` the factor that rescales what was accumulated before (1 where
// the max stays, kRescaleSlack).
__device__ __forceinline__ void online_softmax_rescale(float (&tile_max)[2], float (&row_max)[2],
                                                       float (&row_sum)[2],
                                                       float (&correction)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 1));
    tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 2));
    // A row with no key seen yet has max -inf, and -inf + slack is -inf: its first finite max
    // always moves it (correction exp2(-inf) = 0 of sums that are 0). A row that still sees
    // no key keeps -inf and a correction of 1.
    if (tile_max[half] > row_max[half] + kRescaleSlack) {
      correction[half] = exp2f(row_max[half] - tile_max[half]);
      row_max[half] = tile_max[half];
      row_sum[half] *= correction[half];
    } else {
      correction[half] = 1.f;
    }
  }
}

// The value the scores of a row are measured from once its max is known.
__device__ __forceinline__ float softmax_base(float row_max) {
  return row_max == -DASHGEN_INF ? 0.f : row_max;
}

}  // namespace dashgen
