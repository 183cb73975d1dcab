// dashgen/attn/tiles_sm90.cuh: how the Hopper kernels lay a (rows x head_dim) tile out in shared
// memory, as TMA writes it with 64-column boxes and the 128-byte swizzle: column block cb (64
// elements, one 128-byte row each) holds all rows, block cb + 1 follows it.
#pragma once
#include "dashgen/ptx/wgmma.cuh"

namespace dashgen {

// Dynamic shared memory one sm_90 block may opt into (227 KB).
constexpr int kSm90MaxSmemBytes = 232448;

// wgmma descriptor of k16 step `k` of a K-major operand: rows row0.. of a tile of `rows` rows.
__device__ __forceinline__ u64 tile_desc_k_major(const char* tile, int rows, int row0, int k) {
  const char* block = tile + (k / 4) * rows * 128 + row0 * 128;
  return wgmma_desc_advance(wgmma_desc_k_major_sw128(block), (k % 4) * 32);
}

}  // namespace dashgen
