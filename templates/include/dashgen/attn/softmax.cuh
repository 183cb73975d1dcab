// dashgen/attn/softmax.cuh: the online-softmax step both forward kernels share. A thread holds
// two rows (accumulator rows g and g + 8 of its warp), each spread over the 4 lanes of a quad.
#pragma once
#include "dashgen/attn/element.cuh"

namespace dashgen {

// Folds this tile's row maxima (scores already in log2 units) into the running max and sum;
// returns through `correction` the factor that rescales what was accumulated before.
__device__ __forceinline__ void online_softmax_rescale(float (&tile_max)[2], float (&row_max)[2],
                                                       float (&row_sum)[2],
                                                       float (&correction)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 1));
    tile_max[half] = fmaxf(tile_max[half], __shfl_xor_sync(0xffffffffu, tile_max[half], 2));
    const float new_max = fmaxf(row_max[half], tile_max[half]);
    // A row with no key seen yet keeps max -inf; subtract 0 instead so exp2 gives 0, not NaN.
    const float base = new_max == -DASHGEN_INF ? 0.f : new_max;
    correction[half] = exp2f(row_max[half] - base);
    row_max[half] = new_max;
    row_sum[half] *= correction[half];
  }
}

// The value the scores of a row are measured from once its max is known.
__device__ __forceinline__ float softmax_base(float row_max) {
  return row_max == -DASHGEN_INF ? 0.f : row_max;
}

}  // namespace dashgen
