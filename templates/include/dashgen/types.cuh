// dashgen/types.cuh: fixed-width integers and the tensor-map parameter type.
// Own typedefs instead of <cstdint> / <cuda/std/cstdint>: each standard header costs ~1.5 s of
// NVRTC time per kernel, and these are all the kernels need.
#pragma once

namespace dashgen {

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

static_assert(sizeof(i8) == 1 && sizeof(u8) == 1, "8-bit types");
static_assert(sizeof(i16) == 2 && sizeof(u16) == 2, "16-bit types");
static_assert(sizeof(i32) == 4 && sizeof(u32) == 4, "32-bit types");
static_assert(sizeof(i64) == 8 && sizeof(u64) == 8, "64-bit types");
static_assert(sizeof(void*) == 8, "64-bit device pointers");

// Same size and alignment as cuda.h's CUtensorMap (16 x u64, 64-byte aligned; TMA needs the map
// 64-byte aligned). cuda.h does not compile under NVRTC, so kernels take this type by value as
// `const __grid_constant__ TensorMap` and the host passes the driver's CUtensorMap bytes.
struct alignas(64) TensorMap {
  u64 opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

// Shared-memory window address (32 bits) of a generic pointer into shared memory.
__device__ __forceinline__ u32 shared_address(const void* ptr) {
  return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

}  // namespace dashgen
