// dashgen/attn/fragments.cuh: mma.sync operand fragments gathered from shared-memory tiles seen
// through strides, so one helper serves a matrix and its transpose (P and P^T, K and K^T).
#pragma once
#include "dashgen/attn/element.cuh"

namespace dashgen {

// Element (r, c) of a shared-memory matrix lives at p[r * rs + c * cs].
template <class T>
struct SmemView {
  const T* p;
  int rs;
  int cs;
  __device__ __forceinline__ u32 pair(int r, int c, int dr, int dc) const {
    return static_cast<u32>(Element<T>::bits(p[r * rs + c * cs])) |
           (static_cast<u32>(Element<T>::bits(p[(r + dr) * rs + (c + dc) * cs])) << 16);
  }
};

// A fragment of rows r0..r0+15, k k0..k0+15 of A (M x K).
template <class T>
__device__ __forceinline__ void load_a(u32 (&a)[4], const SmemView<T>& A, int r0, int k0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  a[0] = A.pair(r0 + g, k0 + 2 * t, 0, 1);
  a[1] = A.pair(r0 + g + 8, k0 + 2 * t, 0, 1);
  a[2] = A.pair(r0 + g, k0 + 2 * t + 8, 0, 1);
  a[3] = A.pair(r0 + g + 8, k0 + 2 * t + 8, 0, 1);
}

// B fragment of k k0..k0+15, columns c0..c0+7 of B (K x N).
template <class T>
__device__ __forceinline__ void load_b(u32 (&b)[2], const SmemView<T>& B, int k0, int c0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  b[0] = B.pair(k0 + 2 * t, c0 + g, 1, 0);
  b[1] = B.pair(k0 + 2 * t + 8, c0 + g, 1, 0);
}

// acc[j] (+)= A[r0..r0+15, :] * B[:, 8j..8j+7] for j < kN / 8: one warp, one 16-row strip.
template <class T, int kN, int kK>
__device__ __forceinline__ void warp_strip_mma(float (&acc)[kN / 8][4], const SmemView<T>& A,
                                               const SmemView<T>& B, int r0, int lane) {
#pragma unroll 1
  for (int k0 = 0; k0 < kK; k0 += 16) {
    u32 a[4];
    load_a(a, A, r0, k0, lane);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      u32 b[2];
      load_b(b, B, k0, 8 * j, lane);
      Element<T>::mma(acc[j], a, b);
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
