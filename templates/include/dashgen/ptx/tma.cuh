// dashgen/ptx/tma.cuh: TMA (cp.async.bulk.tensor) tile loads global -> shared, completing on an
// mbarrier. Coordinates are in elements, innermost (contiguous) dimension first, as in the
// tensor map. The destination must be 128-byte aligned (1024-byte for the 128B swizzle).
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

__device__ __forceinline__ u64 tensor_map_address(const TensorMap* map) {
  return reinterpret_cast<u64>(map);
}

// Pulls the descriptor into the cache ahead of the first copy that uses it.
__device__ __forceinline__ void tma_prefetch_descriptor(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(tensor_map_address(map)) : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* smem_dst, const TensorMap* map, u64* bar,
                                            i32 c0, i32 c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, { %3, %4 }], [%2];"
      :: "r"(shared_address(smem_dst)), "l"(tensor_map_address(map)), "r"(shared_address(bar)),
         "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* smem_dst, const TensorMap* map, u64* bar,
                                            i32 c0, i32 c1, i32 c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, { %3, %4, %5 }], [%2];"
      :: "r"(shared_address(smem_dst)), "l"(tensor_map_address(map)), "r"(shared_address(bar)),
         "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(void* smem_dst, const TensorMap* map, u64* bar,
                                            i32 c0, i32 c1, i32 c2, i32 c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, { %3, %4, %5, %6 }], [%2];"
      :: "r"(shared_address(smem_dst)), "l"(tensor_map_address(map)), "r"(shared_address(bar)),
         "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

}  // namespace dashgen
