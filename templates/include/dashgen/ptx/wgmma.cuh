// dashgen/ptx/wgmma.cuh: warpgroup MMA (sm_90a) with both operands in shared memory.
// All 128 threads of a warpgroup (4 consecutive warps starting at a multiple of 4) execute each
// call. Operand tiles use the K-major 128-byte-swizzle layout that TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B: rows of 64 bf16 (128 B), 8-row atoms of 1024 B, the 16-byte chunk
// index within a row XORed with (row % 8); each tile starts 1024-byte aligned.
#pragma once
#include "dashgen/types.cuh"

namespace dashgen {

// Layout-type field (bits 62-63) of a wgmma shared-memory matrix descriptor.
enum class WgmmaSwizzle : u32 { kInterleave = 0, k128B = 1, k64B = 2, k32B = 3 };

// Bytes between consecutive 8-row core-matrix groups of a K-major 128B-swizzled tile.
constexpr u32 kSw128AtomBytes = 8 * 128;

// Descriptor of a K-major, 128B-swizzled bf16 tile starting at `smem_tile` (1024-byte aligned).
// Bits 0-13: start address >> 4; bits 16-29: leading byte offset >> 4 (unused for swizzled
// K-major layouts, 1 by convention); bits 32-45: stride byte offset >> 4 (one 8-row atom);
// bits 49-51: base offset (0 for 1024-aligned atoms); bits 62-63: swizzle mode.
__device__ __forceinline__ u64 wgmma_desc_k_major_sw128(const void* smem_tile) {
  const u32 address = shared_address(smem_tile);
  u64 desc = 0;
  desc |= static_cast<u64>((address & 0x3FFFF) >> 4);
  desc |= static_cast<u64>(1) << 16;
  desc |= static_cast<u64>(kSw128AtomBytes >> 4) << 32;
  desc |= static_cast<u64>(WgmmaSwizzle::k128B) << 62;
  return desc;
}

// Moves a descriptor's start address by `bytes` (a multiple of 16) within the swizzle atom:
// step k of a K-major 128B tile is +32 bytes per 16 bf16 of K.
__device__ __forceinline__ u64 wgmma_desc_advance(u64 desc, u32 bytes) {
  return desc + static_cast<u64>(bytes >> 4);
}

// Orders this warpgroup's prior register and shared-memory accesses before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// Closes the wgmma-group of all prior uncommitted wgmma.mma_async of this warpgroup.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most N wgmma-groups are pending; accumulators are valid once their group is done.
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}

// D(64x64, fp32) = A(64x16, bf16, K-major smem) * B(64x16 as N x K, bf16, K-major smem)^T
//                  + (accumulate ? D : 0).
// Accumulator layout, thread t of the warpgroup (warp w = t / 32, lane l = t % 32), register i:
//   row = 16 * w + l / 4 + 8 * ((i / 2) % 2),  col = 8 * (i / 4) + 2 * (l % 4) + (i % 2).
__device__ __forceinline__ void wgmma_m64n64k16_f32_bf16_ss(float (&d)[32], u64 desc_a,
                                                            u64 desc_b, bool accumulate) {
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %34, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23,"
      " %24, %25, %26, %27, %28, %29, %30, %31 },"
      " %32, %33, p, 1, 1, 0, 0;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)));
}

}  // namespace dashgen
