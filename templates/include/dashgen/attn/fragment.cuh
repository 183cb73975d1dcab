// dashgen/attn/fragment.cuh: a wgmma accumulator's rows on their way to global memory. In the
// accumulator fragment the four lanes of a quad share a row, and lane t4 holds columns 8j + 2*t4
// and 8j + 2*t4 + 1 of each 8-column group j: stored as they lie, a row leaves in 4-byte pieces,
// eight rows a warp instruction, and the store unit, not the warps, sets the pace.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// Four 16-bit pairs of a quad's row transposed among its lanes: on entry lane t4 holds w[k] =
// columns 8k + 2*t4 .. +1 of four consecutive 8-column groups; on return it holds w[m] = lane
// m's w[t4], which are columns 8*t4 + 2m .. +1: group t4 whole, one 16-byte store. Two
// butterfly steps (lanes 2 apart, then 1), two shuffles each. Every lane of the warp calls it.
__device__ __forceinline__ void quad_transpose(u32 (&w)[4], int t4) {
  const bool upper = t4 & 2;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const u32 got = __shfl_xor_sync(0xffffffffu, upper ? w[k] : w[2 + k], 2);
    if (upper) w[k] = got; else w[2 + k] = got;
  }
  const bool odd = t4 & 1;
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    const u32 got = __shfl_xor_sync(0xffffffffu, odd ? w[k] : w[k + 1], 1);
    if (odd) w[k] = got; else w[k + 1] = got;
  }
}

}  // namespace dashgen
