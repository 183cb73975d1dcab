// dashgen/ptx/ldmatrix.cuh: four 8x8 16-bit matrices from shared memory into the mma.sync
// fragment layout in one instruction. Lanes 8i..8i+7 give the row addresses of matrix i (16-byte
// aligned); lane l receives in r[i] the pair (row l/4, cols 2(l%4), 2(l%4)+1) of matrix i, or
// with .trans the pair (rows 2(l%4), 2(l%4)+1, col l/4): the transpose, for operands stored with
// the other dimension contiguous.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3 }, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem_row)) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3 }, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem_row)) : "memory");
}

}  // namespace dashgen
