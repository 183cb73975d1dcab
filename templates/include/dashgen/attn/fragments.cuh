// dashgen/attn/fragments.cuh: mma.sync operand fragments loaded from shared-memory tiles with
// ldmatrix. A tile is row- or column-major, so one helper serves a matrix and its transpose
// (P and P^T, K and K^T): a column-major operand is loaded with ldmatrix.trans.
#pragma once
#include "dashgen/attn/element.cuh"
#include "dashgen/ptx/ldmatrix.cuh"

namespace dashgen {

// Element (r, c) lives at p[r * ld + c] (kRowMajor) or p[c * ld + r]. ld * 2 bytes must be a
// multiple of 16 (ldmatrix row addresses); padding ld by 8 elements keeps the 8 rows of one
// 8x8 matrix on distinct bank groups.
template <class T, bool kRowMajor>
struct SmemTile {
  const T* p;
  int ld;
  // Address of stored row `row`, column `col` of the underlying storage.
  __device__ __forceinline__ const T* at(int row, int col) const { return p + row * ld + col; }
};

template <class T>
__device__ __forceinline__ SmemTile<T, true> row_major(const T* p, int ld) { return {p, ld}; }
template <class T>
__device__ __forceinline__ SmemTile<T, false> col_major(const T* p, int ld) { return {p, ld}; }

// A fragment (mma.m16n8k16 layout) of rows r0..r0+15, k k0..k0+15 of A (M x K).
template <class T, bool kRowMajor>
__device__ __forceinline__ void load_a(u32 (&a)[4], const SmemTile<T, kRowMajor>& A, int r0,
                                       int k0, int lane) {
  // Matrix i: rows r0 + 8 (i & 1), k k0 + 8 (i >> 1), i.e. a0..a3 in order.
  const int i = lane >> 3, j = lane & 7;
  if constexpr (kRowMajor) {
    ldmatrix_x4(a, A.at(r0 + 8 * (i & 1) + j, k0 + 8 * (i >> 1)));
  } else {
    ldmatrix_x4_trans(a, A.at(k0 + 8 * (i >> 1) + j, r0 + 8 * (i & 1)));
  }
}

// B fragments (k k0..k0+15) of the two n8 tiles at columns c0 and c0 + 8 of B (K x N):
// b[0], b[1] for tile c0 and b[2], b[3] for tile c0 + 8.
template <class T, bool kRowMajor>
__device__ __forceinline__ void load_b2(u32 (&b)[4], const SmemTile<T, kRowMajor>& B, int k0,
                                        int c0, int lane) {
  // Matrix i: k k0 + 8 (i & 1), columns c0 + 8 (i >> 1).
  const int i = lane >> 3, j = lane & 7;
  if constexpr (kRowMajor) {
    ldmatrix_x4_trans(b, B.at(k0 + 8 * (i & 1) + j, c0 + 8 * (i >> 1)));
  } else {
    ldmatrix_x4(b, B.at(c0 + 8 * (i >> 1) + j, k0 + 8 * (i & 1)));
  }
}

template <class T>
__device__ __forceinline__ void mma_pair(float (&acc0)[4], float (&acc1)[4], const u32 (&a)[4],
                                         const u32 (&b)[4]) {
  const u32 b0[2] = {b[0], b[1]};
  const u32 b1[2] = {b[2], b[3]};
  Element<T>::mma(acc0, a, b0);
  Element<T>::mma(acc1, a, b1);
}

// acc[j] (+)= A[r0..r0+15, :] * B[:, 8j..8j+7] for j < kN / 8: one warp, one 16-row strip.
template <class T, int kN, int kK, bool kARow, bool kBRow>
__device__ __forceinline__ void warp_strip_mma(float (&acc)[kN / 8][4],
                                               const SmemTile<T, kARow>& A,
                                               const SmemTile<T, kBRow>& B, int r0, int lane) {
  static_assert(kN % 16 == 0 && kK % 16 == 0, "whole 16x16 steps");
  // Not unrolled: unrolling keeps several k steps of fragments live and spills at head_dim 128.
#pragma unroll 1
  for (int k0 = 0; k0 < kK; k0 += 16) {
    u32 a[4];
    load_a(a, A, r0, k0, lane);
#pragma unroll
    for (int j = 0; j < kN / 8; j += 2) {
      u32 b[4];
      load_b2(b, B, k0, 8 * j, lane);
      mma_pair<T>(acc[j], acc[j + 1], a, b);
    }
  }
}

template <int kTiles>
__device__ __forceinline__ void zero_acc(float (&acc)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
}

// Calls f(row, col, value) for the accumulator elements of this lane (row within the strip).
template <int kTiles, class F>
__device__ __forceinline__ void for_each_acc(float (&acc)[kTiles][4], int lane, F f) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    f(g, 8 * j + 2 * t, acc[j][0]);
    f(g, 8 * j + 2 * t + 1, acc[j][1]);
    f(g + 8, 8 * j + 2 * t, acc[j][2]);
    f(g + 8, 8 * j + 2 * t + 1, acc[j][3]);
  }
}

}  // namespace dashgen
