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

// A 128B-swizzle descriptor (K-major or MN-major: both have the high word
// wgmma_desc_sw128_high()) kept as its low word, broadcast from lane 0 so that the compiler
// knows every lane of the warp holds it: it stays in a uniform register, and each k16 step is
// one uniform add rather than a vector computation moved into uniform registers before every
// wgmma.
__device__ __forceinline__ u32 uniform_desc_lo(u64 desc) {
  return __shfl_sync(0xffffffffu, static_cast<u32>(desc), 0);
}
// The descriptor `bytes` (a multiple of 16) past the one whose low word is `lo`. The add stays
// inside the 14-bit start-address field: every operand lies in the block's shared memory
// (under 256 KB, kSm90MaxSmemBytes).
__device__ __forceinline__ u64 desc_from_lo(u32 lo, u32 bytes) {
  return (wgmma_desc_sw128_high() << 32) | (lo + (bytes >> 4));
}
// Step k16 `k` of a K-major tile of kRows rows (tile_desc_k_major's offsets).
template <int kRows>
__device__ __forceinline__ u64 k_major_step(u32 lo, int k) {
  return desc_from_lo(lo, (k / 4) * kRows * 128 + (k % 4) * 32);
}

}  // namespace dashgen
