// dashgen/ptx/wgmma.cuh: warpgroup MMA (sm_90a), both operands in shared memory (SS) or A in
// registers (RS). All 128 threads of a warpgroup (4 consecutive warps starting at a multiple of
// 4) execute each call. Operand tiles use the K-major (or, with a transpose flag, MN-major; see
// below) 128-byte-swizzle layout that TMA writes with CU_TENSOR_MAP_SWIZZLE_128B: rows of 64
// bf16 (128 B), 8-row atoms of 1024 B, the 16-byte chunk index within a row XORed with
// (row % 8); each tile starts 1024-byte aligned.
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


// ---- MN-major operands (transpose flag 1) --------------------------------------------------
// An MN-major 128B-swizzled bf16 operand (B as K x N with N contiguous, or A as M x K with M
// contiguous) is stored as column blocks of 64 MN elements: each block holds all K rows, one
// 128-byte swizzled row per k (16-byte chunk index XOR (k % 8)), 8 k-rows per 1024-byte atom;
// block j+1 follows block j. This is what TMA writes for a [K, 64] box with SWIZZLE_128B.
// CUTLASS canonical form (in 16-byte units, T = 8 bf16):
//   Swizzle<3,4,3> o ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))
// i.e. LBO = bytes between 64-wide MN blocks, SBO = bytes between 8-row k groups.

// Bytes per k16 step of a dense MN-major 128B-swizzled tile: 16 k-rows of 128 bytes.
constexpr u32 kSw128MnMajorKStepBytes = 16 * 128;

// Raw 128B-swizzle descriptor with explicit leading / stride byte offsets (multiples of 16).
// For probing conventions; kernels use wgmma_desc_k_major_sw128 / wgmma_desc_mn_major_sw128.
__device__ __forceinline__ u64 wgmma_desc_sw128(const void* smem_tile, u32 lbo_bytes,
                                                u32 sbo_bytes) {
  const u32 address = shared_address(smem_tile);
  u64 desc = 0;
  desc |= static_cast<u64>((address & 0x3FFFF) >> 4);
  desc |= static_cast<u64>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<u64>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= static_cast<u64>(WgmmaSwizzle::k128B) << 62;
  return desc;
}

// Descriptor of a dense MN-major, 128B-swizzled bf16 operand starting at `smem_tile` (1024-byte
// aligned), whose 64-wide MN blocks are `mn_block_bytes` apart (K * 128 when dense). Use with
// transpose flag 1; step k16 with wgmma_desc_advance(desc, k * kSw128MnMajorKStepBytes).
// LBO = mn_block_bytes, SBO = 1024 (one 8-row atom): verified on the H200 (scripts/gpu_probes.py
// wgmma_ss_n64_tb / _n128_tb / _n64_ta / _n128_tatb / _rs_n64_tb / _rs_n128_tb, K = 64) for B
// (SS and RS; N = 128 exercises LBO = 8192) and for A (M = 64 is one block, so only SBO is read);
// the swapped (LBO = 1024, SBO = 8192) fails. With one 64-wide MN block the LBO is not read.
__device__ __forceinline__ u64 wgmma_desc_mn_major_sw128(const void* smem_tile,
                                                         u32 mn_block_bytes) {
  return wgmma_desc_sw128(smem_tile, mn_block_bytes, kSw128AtomBytes);
}

// ---- SS form, N = 32 / 64 / 128, with transpose flags ---------------------------------------
// D(64xN, fp32) = A(64x16) * B(16xN) + (accumulate ? D : 0), both bf16 operands in shared memory.
// kTransA / kTransB = 0: the operand is K-major (wgmma_desc_k_major_sw128, k16 step +32 bytes);
// 1: MN-major (wgmma_desc_mn_major_sw128, k16 step +kSw128MnMajorKStepBytes). N = 32 is too
// narrow for an MN-major 128B-swizzled B (64-element blocks): use kTransB = 0 there.
// Accumulator layout as for wgmma_m64n64k16_f32_bf16_ss, with i < N / 2:
//   row = 16 * w + l / 4 + 8 * ((i / 2) % 2),  col = 8 * (i / 4) + 2 * (l % 4) + (i % 2).

template <u32 kTransA = 0, u32 kTransB = 0>
__device__ __forceinline__ void wgmma_m64n32k16_f32_bf16_ss(float (&d)[16], u64 desc_a,
                                                            u64 desc_b, bool accumulate) {
  static_assert(kTransA <= 1 && kTransB <= 1, "transpose flags are 0 (K-major) or 1 (MN-major)");
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %18, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15 },"
      " %16, %17, p, 1, 1, %19, %20;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)), "n"(kTransA), "n"(kTransB));
}

template <u32 kTransA = 0, u32 kTransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_f32_bf16_ss_trans(float (&d)[32], u64 desc_a,
                                                                  u64 desc_b, bool accumulate) {
  static_assert(kTransA <= 1 && kTransB <= 1, "transpose flags are 0 (K-major) or 1 (MN-major)");
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %34, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23,"
      " %24, %25, %26, %27, %28, %29, %30, %31 },"
      " %32, %33, p, 1, 1, %35, %36;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)), "n"(kTransA), "n"(kTransB));
}

template <u32 kTransA = 0, u32 kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_f32_bf16_ss(float (&d)[64], u64 desc_a,
                                                             u64 desc_b, bool accumulate) {
  static_assert(kTransA <= 1 && kTransB <= 1, "transpose flags are 0 (K-major) or 1 (MN-major)");
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %66, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23,"
      " %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39,"
      " %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55,"
      " %56, %57, %58, %59, %60, %61, %62, %63 },"
      " %64, %65, p, 1, 1, %67, %68;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)), "n"(kTransA), "n"(kTransB));
}

// ---- RS form: A from registers ------------------------------------------------------------
// D(64xN, fp32) = A(64x16, bf16 registers) * B(16xN, bf16 smem) + (accumulate ? D : 0).
// A fragment of warp w (rows 16w..16w+15), lane l, g = l / 4, t = l % 4 (mma.sync m16n8k16 A
// layout; the lower k in the low 16 bits of each register):
//   a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..2t+1), a[2] = A(g, 2t+8..2t+9), a[3] = A(g+8, 2t+8..).
// An fp32 accumulator C of a previous wgmma (same warpgroup) becomes the A operand of k-step kk
// (columns 16kk..16kk+15 of C) as
//   a[0] = bf16x2(c[8kk+0], c[8kk+1]), a[1] = bf16x2(c[8kk+2], c[8kk+3]),
//   a[2] = bf16x2(c[8kk+4], c[8kk+5]), a[3] = bf16x2(c[8kk+6], c[8kk+7]).
// Call wgmma_fence() after writing `a` and before the wgmma. kTransB as for the SS form.

template <u32 kTransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_f32_bf16_rs(float (&d)[32], const u32 (&a)[4],
                                                            u64 desc_b, bool accumulate) {
  static_assert(kTransB <= 1, "the transpose flag is 0 (K-major) or 1 (MN-major)");
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %37, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23,"
      " %24, %25, %26, %27, %28, %29, %30, %31 },"
      " { %32, %33, %34, %35 }, %36, p, 1, 1, %38;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
        "r"(static_cast<u32>(accumulate)), "n"(kTransB));
}

template <u32 kTransB = 0>
__device__ __forceinline__ void wgmma_m64n128k16_f32_bf16_rs(float (&d)[64], const u32 (&a)[4],
                                                             u64 desc_b, bool accumulate) {
  static_assert(kTransB <= 1, "the transpose flag is 0 (K-major) or 1 (MN-major)");
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "setp.ne.b32 p, %69, 0;\n\t"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7,"
      " %8, %9, %10, %11, %12, %13, %14, %15,"
      " %16, %17, %18, %19, %20, %21, %22, %23,"
      " %24, %25, %26, %27, %28, %29, %30, %31,"
      " %32, %33, %34, %35, %36, %37, %38, %39,"
      " %40, %41, %42, %43, %44, %45, %46, %47,"
      " %48, %49, %50, %51, %52, %53, %54, %55,"
      " %56, %57, %58, %59, %60, %61, %62, %63 },"
      " { %64, %65, %66, %67 }, %68, p, 1, 1, %70;\n\t"
      "}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]),
        "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]),
        "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),
        "r"(static_cast<u32>(accumulate)), "n"(kTransB));
}

}  // namespace dashgen
