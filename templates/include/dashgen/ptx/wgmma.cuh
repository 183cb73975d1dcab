// dashgen/ptx/wgmma.cuh: warpgroup MMA (sm_90a), both operands in shared memory (SS) or A in
// registers (RS). All 128 threads of a warpgroup (4 consecutive warps starting at a multiple of
// 4) execute each call. Operand tiles use the K-major (or, with a transpose flag, MN-major; see
// below) 128-byte-swizzle layout that TMA writes with CU_TENSOR_MAP_SWIZZLE_128B: rows of 64
// 16-bit elements (128 B), 8-row atoms of 1024 B, the 16-byte chunk index within a row XORed with
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

// The high word of every K-major and MN-major 128B-swizzle descriptor below (stride one 8-row
// atom, 128B swizzle).
__device__ __forceinline__ constexpr u64 wgmma_desc_sw128_high() {
  return static_cast<u64>(kSw128AtomBytes >> 4) | static_cast<u64>(WgmmaSwizzle::k128B) << 30;
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
// LBO = mn_block_bytes, SBO = 1024 (one 8-row atom): verified on the H200
// (tests/gpu/test_probes_gpu.py: wgmma_ss_n64_tb / _n128_tb / _n64_ta / _n128_tatb /
// _rs_n64_tb / _rs_n128_tb, K = 64) for B (SS and RS; N = 128 exercises LBO = 8192) and for A (M = 64 is one block, so only SBO is read);
// the swapped (LBO = 1024, SBO = 8192) fails. With one 64-wide MN block the LBO is not read.
__device__ __forceinline__ u64 wgmma_desc_mn_major_sw128(const void* smem_tile,
                                                         u32 mn_block_bytes) {
  return wgmma_desc_sw128(smem_tile, mn_block_bytes, kSw128AtomBytes);
}

// ---- the MMAs: SS (both operands in shared memory) and RS (A from registers) -----------------
// Inputs are bf16 or fp16 (WgmmaInput), accumulators fp32. D(64xN) = A(64x16) * B(16xN)
// + (accumulate ? D : 0). kTransA / kTransB = 0: the operand is K-major
// (wgmma_desc_k_major_sw128, k16 step +32 bytes); 1: MN-major (wgmma_desc_mn_major_sw128, k16
// step +kSw128MnMajorKStepBytes). N = 32 is too narrow for an MN-major 128B-swizzled B
// (64-element blocks): use kTransB = 0 there.
// Accumulator layout, thread t of the warpgroup (warp w = t / 32, lane l = t % 32), register
// i < N / 2:
//   row = 16 * w + l / 4 + 8 * ((i / 2) % 2),  col = 8 * (i / 4) + 2 * (l % 4) + (i % 2).
// RS: the A fragment of warp w (rows 16w..16w+15), lane l, g = l / 4, t = l % 4 (mma.sync
// m16n8k16 A layout; the lower k in the low 16 bits of each register):
//   a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..2t+1), a[2] = A(g, 2t+8..2t+9), a[3] = A(g+8, 2t+8..).
// An fp32 accumulator C of a previous wgmma (same warpgroup) becomes the A operand of k-step kk
// (columns 16kk..16kk+15 of C) as
//   a[0] = pack(c[8kk+0], c[8kk+1]), a[1] = pack(c[8kk+2], c[8kk+3]),
//   a[2] = pack(c[8kk+4], c[8kk+5]), a[3] = pack(c[8kk+6], c[8kk+7]).
// Call wgmma_fence() after writing `a` and before the wgmma.

enum class WgmmaInput : u32 { kBf16, kF16 };

// The asm operand lists: N / 2 fp32 accumulators (read and written), then the inputs.
// DASHGEN_REGS<R>: the operand numbers of R accumulators ("%0, ..., %<R-1>"); DASHGEN_F32X<R>(d):
// their operands, d[0..R-1]. The inputs' operand numbers follow, from %<R>.
#define DASHGEN_REGS8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define DASHGEN_REGS16 DASHGEN_REGS8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define DASHGEN_REGS20 DASHGEN_REGS16 ", %16, %17, %18, %19"
#define DASHGEN_REGS24 DASHGEN_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define DASHGEN_REGS32 DASHGEN_REGS24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define DASHGEN_REGS40 DASHGEN_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define DASHGEN_REGS48 DASHGEN_REGS40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define DASHGEN_REGS56 DASHGEN_REGS48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define DASHGEN_REGS64 DASHGEN_REGS56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define DASHGEN_REGS72 DASHGEN_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define DASHGEN_REGS80 DASHGEN_REGS72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define DASHGEN_REGS88 DASHGEN_REGS80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define DASHGEN_REGS96 DASHGEN_REGS88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define DASHGEN_REGS104 DASHGEN_REGS96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define DASHGEN_REGS112 DASHGEN_REGS104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define DASHGEN_REGS120 DASHGEN_REGS112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define DASHGEN_REGS128 DASHGEN_REGS120 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define DASHGEN_F32X8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
  "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define DASHGEN_F32X16(d) DASHGEN_F32X8(d, 0), DASHGEN_F32X8(d, 8)
#define DASHGEN_F32X20(d) \
  DASHGEN_F32X16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#define DASHGEN_F32X24(d) DASHGEN_F32X16(d), DASHGEN_F32X8(d, 16)
#define DASHGEN_F32X32(d) DASHGEN_F32X24(d), DASHGEN_F32X8(d, 24)
#define DASHGEN_F32X40(d) DASHGEN_F32X32(d), DASHGEN_F32X8(d, 32)
#define DASHGEN_F32X48(d) DASHGEN_F32X40(d), DASHGEN_F32X8(d, 40)
#define DASHGEN_F32X56(d) DASHGEN_F32X48(d), DASHGEN_F32X8(d, 48)
#define DASHGEN_F32X64(d) DASHGEN_F32X56(d), DASHGEN_F32X8(d, 56)
#define DASHGEN_F32X72(d) DASHGEN_F32X64(d), DASHGEN_F32X8(d, 64)
#define DASHGEN_F32X80(d) DASHGEN_F32X72(d), DASHGEN_F32X8(d, 72)
#define DASHGEN_F32X88(d) DASHGEN_F32X80(d), DASHGEN_F32X8(d, 80)
#define DASHGEN_F32X96(d) DASHGEN_F32X88(d), DASHGEN_F32X8(d, 88)
#define DASHGEN_F32X104(d) DASHGEN_F32X96(d), DASHGEN_F32X8(d, 96)
#define DASHGEN_F32X112(d) DASHGEN_F32X104(d), DASHGEN_F32X8(d, 104)
#define DASHGEN_F32X120(d) DASHGEN_F32X112(d), DASHGEN_F32X8(d, 112)
#define DASHGEN_F32X128(d) DASHGEN_F32X120(d), DASHGEN_F32X8(d, 120)

// N: the shape's N (a literal); AB: "bf16" or "f16"; R: its accumulator count, N / 2 (a
// literal); A, B, P, TA, TB: the operand numbers of desc_a, desc_b, accumulate, kTransA, kTransB.
#define DASHGEN_WGMMA_SS(N, AB, R, A, B, P, TA, TB) \
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " P ", 0;\n\t" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." AB "." AB " { " \
               DASHGEN_REGS##R " }, " A ", " B ", p, 1, 1, " TA ", " TB ";\n\t}" \
               : DASHGEN_F32X##R(d) \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<u32>(accumulate)), "n"(kTransA), \
                 "n"(kTransB))

// RS: A4 is the register list of a[0..3]; B, P, TB as above.
#define DASHGEN_WGMMA_RS(N, AB, R, A4, B, P, TB) \
  asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, " P ", 0;\n\t" \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." AB "." AB " { " \
               DASHGEN_REGS##R " }, " A4 ", " B ", p, 1, 1, " TB ";\n\t}" \
               : DASHGEN_F32X##R(d) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), \
                 "r"(static_cast<u32>(accumulate)), "n"(kTransB))

// One shape for either input type (kF16 in the calling function).
#define DASHGEN_WGMMA_SS_16BIT(N, R, A, B, P, TA, TB) \
  if constexpr (kF16) {                                \
    DASHGEN_WGMMA_SS(N, "f16", R, A, B, P, TA, TB);    \
  } else {                                             \
    DASHGEN_WGMMA_SS(N, "bf16", R, A, B, P, TA, TB);   \
  }
#define DASHGEN_WGMMA_RS_16BIT(N, R, A4, B, P, TB) \
  if constexpr (kF16) {                            \
    DASHGEN_WGMMA_RS(N, "f16", R, A4, B, P, TB);   \
  } else {                                         \
    DASHGEN_WGMMA_RS(N, "bf16", R, A4, B, P, TB);  \
  }

// The shapes the kernels use: SS N 32, 64 and 128, 48 and 40 (the swapped backward's keys a
// warpgroup at 64x96 and 64x80 tasks), and 80 and 112 (the forward's S = Q K^T over its key
// tiles at head_dim 256 and 192); 32, 40, 48, 80 and 112 read B K-major: they are no whole
// number of MN-major 64-element blocks. RS N 64, 128, 192 and 256 (the forward's P V at each head_dim,
// B MN-major).
template <WgmmaInput kIn, int N, u32 kTransA = 0, u32 kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], u64 desc_a, u64 desc_b,
                                         bool accumulate) {
  static_assert(N == 32 || N == 40 || N == 48 || N == 64 || N == 80 || N == 112 || N == 128,
                "N is 32, 40, 48, 64, 80, 112 or 128");
  static_assert(kTransA <= 1 && kTransB <= 1, "transpose flags are 0 (K-major) or 1 (MN-major)");
  constexpr bool kF16 = kIn == WgmmaInput::kF16;
  if constexpr (N == 32) {
    DASHGEN_WGMMA_SS_16BIT(32, 16, "%16", "%17", "%18", "%19", "%20")
  } else if constexpr (N == 40) {
    DASHGEN_WGMMA_SS_16BIT(40, 20, "%20", "%21", "%22", "%23", "%24")
  } else if constexpr (N == 48) {
    DASHGEN_WGMMA_SS_16BIT(48, 24, "%24", "%25", "%26", "%27", "%28")
  } else if constexpr (N == 64) {
    DASHGEN_WGMMA_SS_16BIT(64, 32, "%32", "%33", "%34", "%35", "%36")
  } else if constexpr (N == 80) {
    DASHGEN_WGMMA_SS_16BIT(80, 40, "%40", "%41", "%42", "%43", "%44")
  } else if constexpr (N == 112) {
    DASHGEN_WGMMA_SS_16BIT(112, 56, "%56", "%57", "%58", "%59", "%60")
  } else {
    DASHGEN_WGMMA_SS_16BIT(128, 64, "%64", "%65", "%66", "%67", "%68")
  }
}

template <WgmmaInput kIn, int N, u32 kTransB = 0>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const u32 (&a)[4], u64 desc_b,
                                         bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "N is 64, 128, 192 or 256");
  static_assert(kTransB <= 1, "the transpose flag is 0 (K-major) or 1 (MN-major)");
  constexpr bool kF16 = kIn == WgmmaInput::kF16;
  if constexpr (N == 64) {
    DASHGEN_WGMMA_RS_16BIT(64, 32, "{ %32, %33, %34, %35 }", "%36", "%37", "%38")
  } else if constexpr (N == 128) {
    DASHGEN_WGMMA_RS_16BIT(128, 64, "{ %64, %65, %66, %67 }", "%68", "%69", "%70")
  } else if constexpr (N == 192) {
    DASHGEN_WGMMA_RS_16BIT(192, 96, "{ %96, %97, %98, %99 }", "%100", "%101", "%102")
  } else {
    DASHGEN_WGMMA_RS_16BIT(256, 128, "{ %128, %129, %130, %131 }", "%132", "%133", "%134")
  }
}

#undef DASHGEN_WGMMA_RS_16BIT
#undef DASHGEN_WGMMA_SS_16BIT
#undef DASHGEN_WGMMA_RS
#undef DASHGEN_WGMMA_SS
#undef DASHGEN_F32X128
#undef DASHGEN_F32X120
#undef DASHGEN_F32X112
#undef DASHGEN_F32X104
#undef DASHGEN_F32X96
#undef DASHGEN_F32X88
#undef DASHGEN_F32X80
#undef DASHGEN_F32X72
#undef DASHGEN_F32X64
#undef DASHGEN_F32X56
#undef DASHGEN_F32X48
#undef DASHGEN_F32X40
#undef DASHGEN_F32X32
#undef DASHGEN_F32X24
#undef DASHGEN_F32X16
#undef DASHGEN_F32X8
#undef DASHGEN_REGS128
#undef DASHGEN_REGS120
#undef DASHGEN_REGS112
#undef DASHGEN_REGS104
#undef DASHGEN_REGS96
#undef DASHGEN_REGS88
#undef DASHGEN_REGS80
#undef DASHGEN_REGS72
#undef DASHGEN_REGS64
#undef DASHGEN_REGS56
#undef DASHGEN_REGS48
#undef DASHGEN_REGS40
#undef DASHGEN_REGS32
#undef DASHGEN_REGS24
#undef DASHGEN_REGS16
#undef DASHGEN_REGS8

}  // namespace dashgen
