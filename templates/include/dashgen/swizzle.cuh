// dashgen/swizzle.cuh: address arithmetic of the 128-byte swizzle (TMA SWIZZLE_128B, wgmma
// layout type 1), for threads that read or write such tiles with ordinary loads and stores.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

constexpr u32 kSw128RowBytes = 128;

// Byte offset of byte `byte_in_row` (< 128) of row `row` in a 128B-swizzled tile whose start is
// 1024-byte aligned: the 16-byte chunk index (bits 4-6) is XORed with row % 8 (bits 7-9).
__device__ __forceinline__ u32 sw128_byte_offset(u32 row, u32 byte_in_row) {
  return row * kSw128RowBytes + (byte_in_row ^ ((row & 7u) << 4));
}

// Column of float `col` of row `row` in the Hopper backward's fp32 accumulator tiles (dQ, and
// dK/dV under GQA): 8-float chunks XORed with row % 8. A warp's accumulator fragment covers 8
// rows of 8 floats per store; unswizzled, rows a multiple of 128 bytes apart land in the same
// 8 banks (8-way conflicts), swizzled they take the minimum 2 wavefronts. Needs rows of at
// least 64 floats; keeps even-aligned pairs adjacent.
__device__ __forceinline__ int accum_col(int row, int col) { return col ^ ((row & 7) << 3); }

}  // namespace dashgen
