// dashgen/ptx/mma.cuh: warp-level tensor-core MMA (mma.sync m16n8k16, fp32 accumulate).
// Fragment layout, lane l, g = l / 4, t = l % 4 (PTX ISA, "Matrix fragments for mma.m16n8k16"):
//   A (16x16, row):  a0 = A[g][2t..2t+1]  a1 = A[g+8][2t..2t+1]  a2 = A[g][2t+8..]  a3 = A[g+8][2t+8..]
//   B (16x8, col):   b0 = B[2t..2t+1][g]  b1 = B[2t+8..2t+9][g]
//   C/D (16x8, f32): c0,c1 = C[g][2t, 2t+1]   c2,c3 = C[g+8][2t, 2t+1]
// Each 32-bit register holds two 16-bit values, the lower k index in the low half.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const u32 (&a)[4],
                                                  const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
      " { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const u32 (&a)[4],
                                                 const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
      " { %0, %1, %2, %3 }, { %4, %5, %6, %7 }, { %8, %9 }, { %0, %1, %2, %3 };"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace dashgen
