// dashgen/ptx/stmatrix.cuh: four (or two) 8x8 16-bit matrices from the mma fragment layout into
// shared memory in one instruction (sm_90). Lane l holds in r[i] the pair (row l/4, cols 2(l%4),
// 2(l%4)+1) of matrix i; lanes 8i..8i+7 give the row addresses of matrix i (16-byte aligned).
// With .trans, the 8 values stored at lane 8i+j's address are column j of matrix i: a fragment
// whose rows are one operand dimension lands with the other dimension contiguous.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// `smem_row`: this lane's row address in the shared window (shared_address). No "memory"
// clobber: with one the attention backward spilled at head_dim 128; callers order the stores
// with the fences and barriers (volatile asm) around them.
__device__ __forceinline__ void stmatrix_x4_trans(u32 smem_row, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], { %1, %2, %3, %4 };"
               :: "r"(smem_row), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]));
}

// Two matrices (lanes 0-15 give the addresses; the others' are ignored).
__device__ __forceinline__ void stmatrix_x2_trans(u32 smem_row, const u32 (&r)[2]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], { %1, %2 };"
               :: "r"(smem_row), "r"(r[0]), "r"(r[1]));
}

// Without .trans: lane 8i+j's address takes row j of matrix i. With the "memory" clobber, so
// plain loads of what it stored stay after it (the forward's O staging reads it back at once).
__device__ __forceinline__ void stmatrix_x4(u32 smem_row, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], { %1, %2, %3, %4 };"
               :: "r"(smem_row), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

}  // namespace dashgen
