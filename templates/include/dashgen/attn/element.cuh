// dashgen/attn/element.cuh: the 16-bit input types (bf16, fp16) behind one interface, so the
// kernels are written once and instantiated per dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "dashgen/types.cuh"
#include "dashgen/ptx/wgmma.cuh"

namespace dashgen {

// INFINITY from math.h is not available under NVRTC without the host headers.
#define DASHGEN_INF __int_as_float(0x7f800000)

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2(e))

// exp2f as --use_fast_math compiles it (ex2.approx.ftz: exp2(-inf) = +0), opaque to the
// compiler, so it cannot turn exp2(masked ? -inf : x) back into masked ? 0 : exp2(x), which it
// predicates element by element, the loads of x's operands included.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A row's logsumexp as the backwards subtract it from log2-unit scores. A row that sees no key
// (lse = -inf; rows past the end are read as that) gets +inf, so its P = exp2(s - inf) = 0.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -DASHGEN_INF ? DASHGEN_INF : lse * kLog2e;
}

template <class T>
struct Element;

template <>
struct Element<__nv_bfloat16> {
  static constexpr WgmmaInput kWgmma = WgmmaInput::kBf16;
  __device__ static __forceinline__ u16 bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
  __device__ static __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  __device__ static __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __forceinline__ u32 pack(float lo, float hi) {
    return static_cast<u32>(bits(from_float(lo))) | (static_cast<u32>(bits(from_float(hi))) << 16);
  }
};

template <>
struct Element<__half> {
  static constexpr WgmmaInput kWgmma = WgmmaInput::kF16;
  __device__ static __forceinline__ u16 bits(__half x) { return __half_as_ushort(x); }
  __device__ static __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  __device__ static __forceinline__ float to_float(__half x) { return __half2float(x); }
  __device__ static __forceinline__ u32 pack(float lo, float hi) {
    return static_cast<u32>(bits(from_float(lo))) | (static_cast<u32>(bits(from_float(hi))) << 16);
  }
};

}  // namespace dashgen
