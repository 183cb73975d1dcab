// dashgen/attn/tile_io.cuh: moving (rows x head_dim) tiles between global and shared memory with
// 16-byte accesses; rows past the sequence end read as zeros so padded rows contribute nothing.
#pragma once
#include "dashgen/attn/element.cuh"

namespace dashgen {

template <class T, int kRows, int kCols, int kLd, int kThreads>
__device__ __forceinline__ void load_rows(T* smem, const T* gmem, int row0, int rows_valid,
                                          int row_stride, int tid) {
  constexpr int kChunks = kCols / 8;  // 8 x 16-bit = 16 bytes
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < rows_valid) {
      value = *reinterpret_cast<const uint4*>(gmem + static_cast<i64>(row0 + r) * row_stride + c);
    }
    *reinterpret_cast<uint4*>(smem + r * kLd + c) = value;
  }
}

template <int kCount, int kThreads>
__device__ __forceinline__ void zero_floats(float* smem, int tid) {
  for (int i = tid; i < kCount; i += kThreads) smem[i] = 0.f;
}

// fp32 shared tile (kRows x kCols, dense) -> 16-bit global rows < rows_valid.
template <class T, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void store_rows_from_f32(T* gmem, const float* smem, int row0,
                                                    int rows_valid, int row_stride, int tid) {
  constexpr int kPairs = kCols / 2;
  for (int i = tid; i < kRows * kPairs; i += kThreads) {
    const int r = i / kPairs, c = (i % kPairs) * 2;
    if (row0 + r < rows_valid) {
      const u32 packed = Element<T>::pack(smem[r * kCols + c], smem[r * kCols + c + 1]);
      *reinterpret_cast<u32*>(gmem + static_cast<i64>(row0 + r) * row_stride + c) = packed;
    }
  }
}

}  // namespace dashgen
